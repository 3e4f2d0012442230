//! Sandbox backends behind one seam, and what the native backend is built from.
//!
//! [`Backend`] (= [`SandboxBackend`] for lifecycles + [`StorageBackend`] for snapshots, volumes,
//! transfer and diff) is the seam between the control plane (or `paddock run`) and an isolation
//! technology. The set of backends is closed and known at compile time ([`AnyBackend`]); each reports
//! its [`Capabilities`], and an operation a backend cannot do returns [`RuntimeError::Unsupported`]:
//! it never silently runs with weaker isolation.
//!
//! The native backend (`native/`) builds a sandbox from Linux namespaces, a root file system assembled
//! from read-only host directories plus a private btrfs subvolume (`native/pool/`), cgroup limits
//! (`native/cgroup/`), seccomp, Landlock and no capabilities. The privileged setup happens in a
//! separate single-threaded process (`native/setup/`), never in the caller. The fake backend
//! (`fake/`, cargo feature `fake`, debug builds only) keeps sandboxes in memory with an agent double,
//! so the control plane can be tested without root.
//!
//! This crate does not parse CLI flags, serve HTTP or store records.

pub mod agent_client;
mod backend;
mod error;
#[cfg(feature = "fake")]
pub mod fake;
pub mod fault;
pub mod native;
mod template;

pub(crate) use backend::AnyHandle;
pub use backend::{
    Adoption, AnyBackend, Backend, Capabilities, PortSocket, SandboxBackend, SandboxHandle, SandboxUsage,
    SnapshotUsage, StorageBackend, VolumeUsage,
};
pub use error::RuntimeError;
pub use native::transfer::{ExportOptions, ImportLimits, TransferSummary};
pub use native::{NativeBackend, NativeConfig, NetworkSubnet};
pub use template::{
    image_chain_keys, BuiltLayer, TemplateBuilt, TemplateLimits, TemplateProgress, TemplateSource,
};

#[cfg(all(feature = "fake", not(debug_assertions)))]
compile_error!("the fake backend is for tests: never build it into a release binary");
