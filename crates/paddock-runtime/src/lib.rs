//! Sandbox backends behind one trait, and what the native backend is built from.
//!
//! [`Backend`] is the seam between the control plane (or `paddock run`) and an isolation technology.
//! The set of backends is closed and known at compile time ([`AnyBackend`]); each reports its
//! [`Capabilities`], and an operation a backend cannot do returns [`RuntimeError::Unsupported`]: it
//! never silently runs with weaker isolation.
//!
//! The native backend (`native/`) builds a sandbox from Linux namespaces, a root file system assembled
//! from read-only host directories plus a private btrfs subvolume (`native/pool.rs`), cgroup limits
//! (`native/cgroup.rs`), seccomp, Landlock and no capabilities. The privileged setup happens in a
//! separate single-threaded process (`native/setup/`), never in the caller.
//!
//! This crate does not parse CLI flags, serve HTTP or store records.

pub mod agent_client;
mod error;
pub mod native;

use std::path::PathBuf;

pub use error::RuntimeError;
pub use native::{NativeBackend, NativeConfig};
use paddock_types::{Limits, SandboxId, SandboxSpec};
use serde::{Deserialize, Serialize};

/// What a backend can do, so callers can refuse early instead of failing late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Per-sandbox disk limits are enforced.
    pub disk_limits: bool,
    /// Copy-on-write snapshots of a sandbox's storage are O(1).
    pub cheap_snapshots: bool,
    /// A sandbox may run a custom root file system directory.
    pub custom_rootfs: bool,
    /// Host directories can be mounted into a sandbox.
    pub host_mounts: bool,
}

/// A live sandbox as a backend hands it out.
#[derive(Debug)]
pub struct SandboxHandle {
    /// The sandbox's id.
    pub id: SandboxId,
    /// Where its agent listens.
    pub agent_socket: PathBuf,
    /// Backend-private state needed to tear it down.
    pub(crate) inner: native::NativeSandbox,
}

impl SandboxHandle {
    /// The sandbox's id.
    pub fn id(&self) -> &SandboxId {
        &self.id
    }

    /// The host pid of the sandbox's init (its agent).
    pub fn init_pid(&self) -> i32 {
        self.inner.init_pid()
    }
}

/// What [`Backend::adopt_sandbox`] found.
#[derive(Debug)]
pub enum Adoption {
    /// The sandbox runs and its agent answered: it is ours now.
    Alive(SandboxHandle),
    /// The sandbox had died (or its agent no longer answered); whatever was left of it was killed and
    /// removed.
    Dead,
    /// Nothing of the sandbox exists.
    Missing,
    /// Another live process owns the sandbox (holds its lock); nothing was touched.
    Busy,
}

/// What a sandbox uses now, from its cgroups and its storage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxUsage {
    /// CPU time of every process the sandbox ever ran, microseconds.
    pub cpu_time_us: u64,
    /// Memory charged now (processes, page cache, tmpfs), bytes.
    pub memory_bytes: u64,
    /// Highest memory charge so far, bytes.
    pub memory_peak_bytes: u64,
    /// Processes and threads alive now.
    pub pids: u64,
    /// Bytes the sandbox wrote to its storage that still exist. Counted by the file system at its
    /// transaction commits, so writes show up within its commit interval (30 s by default).
    pub disk_bytes: u64,
    /// Its disk limit.
    pub disk_limit_bytes: Option<u64>,
}

/// An isolation backend.
///
/// The futures of [`AnyBackend`]'s methods are `Send` (a test says so), so a multi-threaded server
/// can share one `Arc<AnyBackend>`. `create_sandbox`, `destroy_sandbox`, `reclaim_sandbox` and the
/// reclaiming paths of `adopt_sandbox` do blocking work (processes, btrfs ioctls, waiting up to 10 s
/// for killed processes): call them from `spawn_blocking` or `block_in_place` in such a server.
#[expect(
    async_fn_in_trait,
    reason = "backends are used through AnyBackend, whose concrete futures are checked to be Send"
)]
pub trait Backend {
    /// What this backend supports.
    fn capabilities(&self) -> Capabilities;
    /// Creates and starts a sandbox whose agent is ready for connections when this returns.
    async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError>;
    /// Waits until the sandbox's init process exits on its own (it normally never does).
    async fn wait_sandbox(&self, handle: &mut SandboxHandle) -> Result<(), RuntimeError>;
    /// Kills every process of the sandbox and removes everything it created.
    async fn destroy_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError>;
    /// Reclaims what crashed runs left behind; returns the ids reclaimed. Every sandbox whose owner
    /// is gone counts, so a restarted server adopts the sandboxes it wants to keep first.
    async fn collect_garbage(&self) -> Result<Vec<String>, RuntimeError>;
    /// Takes over sandbox `id`, created by an earlier process that is gone (a server restart), if it
    /// still runs; reclaims its remains if it does not.
    async fn adopt_sandbox(&self, id: &SandboxId) -> Result<Adoption, RuntimeError>;
    /// Reads what the sandbox uses now.
    async fn sandbox_usage(&self, handle: &SandboxHandle) -> Result<SandboxUsage, RuntimeError>;
    /// Changes the limits of a running sandbox (memory, pids, cpu, disk); `None` removes a limit.
    async fn update_limits(&self, handle: &SandboxHandle, limits: &Limits) -> Result<(), RuntimeError>;
    /// Kills and removes everything of sandbox `id` unless a live process owns it; true if something
    /// was there to reclaim.
    async fn reclaim_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError>;
}

/// Every backend paddock has, as a closed set.
#[derive(Debug)]
pub enum AnyBackend {
    /// Linux namespaces + btrfs pool + cgroups + seccomp + Landlock.
    Native(NativeBackend),
}

impl Backend for AnyBackend {
    fn capabilities(&self) -> Capabilities {
        match self {
            Self::Native(b) => b.capabilities(),
        }
    }
    async fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        match self {
            Self::Native(b) => b.create_sandbox(spec).await,
        }
    }
    async fn wait_sandbox(&self, handle: &mut SandboxHandle) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.wait_sandbox(handle).await,
        }
    }
    async fn destroy_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.destroy_sandbox(handle).await,
        }
    }
    async fn collect_garbage(&self) -> Result<Vec<String>, RuntimeError> {
        match self {
            Self::Native(b) => b.collect_garbage().await,
        }
    }
    async fn adopt_sandbox(&self, id: &SandboxId) -> Result<Adoption, RuntimeError> {
        match self {
            Self::Native(b) => b.adopt_sandbox(id).await,
        }
    }
    async fn sandbox_usage(&self, handle: &SandboxHandle) -> Result<SandboxUsage, RuntimeError> {
        match self {
            Self::Native(b) => b.sandbox_usage(handle).await,
        }
    }
    async fn update_limits(&self, handle: &SandboxHandle, limits: &Limits) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.update_limits(handle, limits).await,
        }
    }
    async fn reclaim_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        match self {
            Self::Native(b) => b.reclaim_sandbox(id).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shareable<T: Send + Sync>() {}
    fn send<T: Send>(_: &T) {}

    /// Never called: compiles only if every future of `AnyBackend` is `Send`, which a multi-threaded
    /// server needs to `tokio::spawn` them.
    #[expect(dead_code, reason = "a compile-time check")]
    async fn futures_are_send(
        backend: &AnyBackend,
        spec: &SandboxSpec,
        mut handle: SandboxHandle,
        limits: &Limits,
    ) {
        send(&backend.create_sandbox(spec));
        send(&backend.wait_sandbox(&mut handle));
        send(&backend.sandbox_usage(&handle));
        send(&backend.update_limits(&handle, limits));
        send(&backend.adopt_sandbox(&spec.id));
        send(&backend.reclaim_sandbox(&spec.id));
        send(&backend.collect_garbage());
        send(&backend.destroy_sandbox(handle));
    }

    #[test]
    fn backend_and_handles_are_shareable_across_threads() {
        shareable::<AnyBackend>();
        shareable::<NativeBackend>();
        shareable::<SandboxHandle>();
        shareable::<Adoption>();
        shareable::<agent_client::AgentClient>();
    }
}
