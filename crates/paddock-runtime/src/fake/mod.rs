//! The fake backend (cargo feature `fake`, debug builds only): sandboxes kept in memory, each with an
//! agent double speaking the real protocol on a unix socket, so the control plane can be tested
//! without root, cgroups, namespaces or btrfs.
//!
//! [`FakeBackend`] implements both backend traits over in-memory state (`state.rs`): live sandboxes
//! (their file trees, `tree.rs`), stopped sandboxes' kept trees, snapshots (copies of a tree), named
//! volumes (trees with a size limit, mounted by path, `fs.rs`), usage computed from the trees (disk
//! bytes = the bytes of regular files), pause flags, rollbacks (the tree replaced by a copy of the
//! snapshot, a new agent on a new socket, the old agent's connections closed), adoption after a
//! simulated server restart ([`FakeBackend::restart`]), garbage collection, diffs (`diff.rs`) and
//! tar export and import (`transfer.rs`). Tests can make the next call of an operation fail
//! ([`FakeBackend::fail_next`]), make a sandbox's agent die ([`FakeBackend::kill_agent`]) and
//! inspect what exists ([`FakeBackend::stats`]). The agent double is described in `agent/`.
//!
//! What the fake does not do: isolate anything (no namespaces, no seccomp, no Landlock: there is no
//! real process to confine), enforce memory, CPU or pid limits (recorded only; usage reports 0 CPU
//! and memory), give sandboxes a network, run a custom root file system or host mounts (refused as
//! `Unsupported`, see [`Capabilities`]), share storage between a snapshot and its sandbox (every
//! snapshot, fork and rollback is a deep copy, so a snapshot's exclusive bytes are its referenced
//! bytes), check file permissions, or survive its own drop (dropping the last clone of a
//! [`FakeBackend`] stops every agent and removes its socket directory).

mod agent;
mod diff;
mod faults;
mod fs;
mod lifecycle;
mod runtime;
mod state;
mod storage;
#[cfg(test)]
mod tests;
mod transfer;
mod tree;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use paddock_types::SandboxId;

pub use faults::OPERATIONS;
pub use state::FakeStats;

use self::agent::lock;
use self::faults::Faults;
use self::runtime::AgentRuntime;
use self::state::State;
use crate::{Capabilities, RuntimeError};

/// The backend-private part of a fake sandbox's handle.
#[derive(Debug)]
pub struct FakeSandbox {
    /// The sandbox's generation when the handle was made (a rollback makes a new one).
    generation: u64,
}

/// The in-memory backend. Cheap to clone: clones share one state, so a test can hand the same
/// sandboxes to a restarted service (see [`FakeBackend::restart`]).
#[derive(Debug, Clone)]
pub struct FakeBackend {
    shared: Arc<Shared>,
    /// This instance's owner id: what it creates or adopts is owned by it.
    owner: u64,
}

#[derive(Debug)]
struct Shared {
    state: Arc<Mutex<State>>,
    faults: Faults,
    /// Where the agents' sockets are (removed on drop).
    dir: PathBuf,
    next_socket: AtomicU64,
    next_owner: AtomicU64,
    runtime: AgentRuntime,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let agents: Vec<_> = {
            let mut state = lock(&self.state);
            state
                .sandboxes
                .values_mut()
                .filter_map(|live| live.agent.take())
                .collect()
        };
        for agent in agents {
            agent.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl FakeBackend {
    /// A backend with nothing in it; its agents' sockets go in a new private directory under the
    /// system's temporary directory.
    pub fn new() -> Result<Self, RuntimeError> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("paddock-fake-{:016x}", rand::random::<u64>()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|source| RuntimeError::State {
                what: "create",
                path: dir.clone(),
                source,
            })?;
        let runtime = AgentRuntime::start().map_err(|source| RuntimeError::State {
            what: "start the agents' runtime for",
            path: dir.clone(),
            source,
        })?;
        let state = State {
            first_live_owner: 1,
            ..State::default()
        };
        Ok(Self {
            shared: Arc::new(Shared {
                state: Arc::new(Mutex::new(state)),
                faults: Faults::default(),
                dir,
                next_socket: AtomicU64::new(1),
                next_owner: AtomicU64::new(2),
                runtime,
            }),
            owner: 1,
        })
    }

    /// The same sandboxes as a new server process would find them after this one died: still
    /// running, owned by nobody until the returned backend adopts them (what is not adopted is
    /// collected by its garbage collection). This instance must not be used afterwards.
    pub fn restart(&self) -> Self {
        let owner = self.shared.next_owner.fetch_add(1, Ordering::Relaxed);
        lock(&self.shared.state).first_live_owner = owner;
        Self {
            shared: self.shared.clone(),
            owner,
        }
    }

    /// Makes the next call of `operation` (a backend method's name, see [`OPERATIONS`]) fail with
    /// `error`. Several calls queue several failures.
    ///
    /// # Panics
    /// On an operation name that is not in [`OPERATIONS`].
    pub fn fail_next(&self, operation: &str, error: RuntimeError) {
        self.shared.faults.push(operation, error);
    }

    /// What exists now, and how many sandboxes were booted and ended.
    pub fn stats(&self) -> FakeStats {
        lock(&self.shared.state).stats()
    }

    /// The ids of the live sandboxes.
    pub fn sandbox_ids(&self) -> Vec<SandboxId> {
        lock(&self.shared.state).sandboxes.keys().cloned().collect()
    }

    /// Whether live sandbox `id` is paused (`None` if it is not live).
    pub fn is_paused(&self, id: &SandboxId) -> Option<bool> {
        lock(&self.shared.state).sandboxes.get(id).map(|l| l.paused)
    }

    /// The disk limit live sandbox `id` has now (`None` if it is not live).
    pub fn disk_limit(&self, id: &SandboxId) -> Option<Option<u64>> {
        lock(&self.shared.state).sandboxes.get(id).map(|l| l.disk.limit)
    }

    /// The memory limit live sandbox `id` has now (`None` if it is not live).
    pub fn memory_limit(&self, id: &SandboxId) -> Option<Option<u64>> {
        lock(&self.shared.state)
            .sandboxes
            .get(id)
            .map(|l| l.limits.memory.map(u64::from))
    }

    /// A file of live sandbox `id`'s own tree, read directly (not through its agent).
    pub fn read_file(&self, id: &SandboxId, path: &str) -> Option<Vec<u8>> {
        let state = lock(&self.shared.state);
        match &state
            .sandboxes
            .get(id)?
            .disk
            .tree
            .get(&tree::components(path))?
            .kind
        {
            tree::NodeKind::File(data) => Some(data.clone()),
            _ => None,
        }
    }

    /// Kills sandbox `id`'s agent (its connections close, its processes die) without removing the
    /// sandbox, as if its init had died; false if it had no live agent.
    pub fn kill_agent(&self, id: &SandboxId) -> bool {
        let agent = lock(&self.shared.state)
            .sandboxes
            .get_mut(id)
            .and_then(|l| l.agent.take());
        match agent {
            Some(agent) => {
                agent.stop();
                true
            }
            None => false,
        }
    }

    /// Serves sandbox `id`'s port `port` from `addr` (a listener the test made, on the host): what
    /// [`crate::SandboxBackend::open_port`] connects to. A port nobody exposed is refused as
    /// `Unsupported` (the fake has no network namespace to look into).
    pub fn expose_port(&self, id: &SandboxId, port: u16, addr: std::net::SocketAddr) {
        lock(&self.shared.state).ports.insert((id.clone(), port), addr);
    }

    /// Where the agents' sockets are.
    pub fn socket_dir(&self) -> &Path {
        &self.shared.dir
    }

    /// What the fake supports (see the module docs for what it does not enforce).
    pub(crate) fn fake_capabilities() -> Capabilities {
        Capabilities {
            // Enforced on the in-memory trees: a write past the limit fails with EDQUOT.
            disk_limits: true,
            // Every snapshot is a deep copy.
            cheap_snapshots: false,
            custom_rootfs: false,
            host_mounts: false,
            network: false,
            io_weight: None,
        }
    }
}
