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
use paddock_types::{SandboxId, SandboxSpec};

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

/// An isolation backend.
#[expect(
    async_fn_in_trait,
    reason = "backends are used through AnyBackend, never as dyn or across Send bounds"
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
    /// Reclaims what crashed runs left behind; returns the ids reclaimed.
    async fn collect_garbage(&self) -> Result<Vec<String>, RuntimeError>;
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
}
