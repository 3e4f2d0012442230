//! Everything the fake backend holds, behind one lock: live sandboxes (their trees, agents and
//! flags), stopped sandboxes' kept trees, snapshots, named volumes, and counters for tests.
//!
//! One lock for all of it keeps every operation (a snapshot, a rename inside a mounted volume, a
//! rollback) trivially atomic; nothing here waits while holding it.

use std::collections::BTreeMap;

use paddock_types::{Limits, SandboxId, SnapshotId, VolumeId};

use super::agent::AgentHandle;
use super::tree::Node;

/// A tree with its size limit: a sandbox's own storage, a stopped sandbox's kept one, or a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Disk {
    pub(crate) tree: Node,
    /// Most bytes of file data it may hold (writes beyond fail with `EDQUOT`).
    pub(crate) limit: Option<u64>,
}

/// A live sandbox.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) disk: Disk,
    /// Bumped by every rollback: a handle of an earlier generation no longer names this sandbox.
    pub(crate) generation: u64,
    /// The backend instance (see [`super::FakeBackend::restart`]) that owns it.
    pub(crate) owner: u64,
    /// Its agent double; `None` once it died ([`super::FakeBackend::kill_agent`]).
    pub(crate) agent: Option<AgentHandle>,
    pub(crate) paused: bool,
    pub(crate) limits: Limits,
    /// Its named volumes (kept for a rollback's new agent).
    pub(crate) mounts: Vec<super::fs::MountPoint>,
    /// The default user of its processes.
    pub(crate) user: String,
    /// The snapshot a rollback was prepared for.
    pub(crate) prepared: Option<SnapshotId>,
}

impl Live {
    /// A live sandbox on `tree` without an agent (unit tests of the file operations).
    #[cfg(test)]
    pub(crate) fn for_tests(tree: Node) -> Self {
        Self {
            disk: Disk { tree, limit: None },
            generation: 1,
            owner: 0,
            agent: None,
            paused: false,
            limits: Limits::default(),
            mounts: Vec::new(),
            user: "user".into(),
            prepared: None,
        }
    }
}

/// What exists in a fake backend, and how many sandboxes it booted and ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FakeStats {
    /// Sandboxes `create_sandbox` booted (failed and refused creates not counted).
    pub created: u64,
    /// Sandboxes destroyed, stopped, parked or reclaimed (a rollback is not an end).
    pub ended: u64,
    /// Sandboxes live now.
    pub live: usize,
    /// Stopped sandboxes whose trees are kept.
    pub stopped: usize,
    /// Snapshots that exist.
    pub snapshots: usize,
    /// Named volumes that exist.
    pub volumes: usize,
}

/// The backend's state.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) sandboxes: BTreeMap<SandboxId, Live>,
    pub(crate) stopped: BTreeMap<SandboxId, Disk>,
    pub(crate) snapshots: BTreeMap<SnapshotId, Node>,
    pub(crate) volumes: BTreeMap<VolumeId, Disk>,
    pub(crate) created: u64,
    pub(crate) ended: u64,
    /// Backend instances below this one are "gone" (their server process died): what they own
    /// may be adopted or collected.
    pub(crate) first_live_owner: u64,
    /// Where a sandbox's ports are served: loopback listeners tests made and told about
    /// ([`super::FakeBackend::expose_port`]).
    pub(crate) ports: BTreeMap<(SandboxId, u16), std::net::SocketAddr>,
    /// Templates built (from a real image layout, read but not unpacked): sandboxes made from one
    /// start from the fake's usual tree.
    pub(crate) templates: BTreeMap<paddock_types::TemplateId, crate::TemplateBuilt>,
    /// The layer cache: a key's tree is the fake's usual one; what is kept is its build result.
    pub(crate) layer_cache: BTreeMap<String, crate::TemplateBuilt>,
}

impl State {
    pub(crate) fn stats(&self) -> FakeStats {
        FakeStats {
            created: self.created,
            ended: self.ended,
            live: self.sandboxes.len(),
            stopped: self.stopped.len(),
            snapshots: self.snapshots.len(),
            volumes: self.volumes.len(),
        }
    }
}
