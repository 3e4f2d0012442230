//! Sandbox backends behind one trait, and what the native backend is built from.
//!
//! [`Backend`] is the seam between the control plane (or `paddock run`) and an isolation technology.
//! The set of backends is closed and known at compile time ([`AnyBackend`]); each reports its
//! [`Capabilities`], and an operation a backend cannot do returns [`RuntimeError::Unsupported`]: it
//! never silently runs with weaker isolation.
//!
//! The native backend (`native/`) builds a sandbox from Linux namespaces, a root file system assembled
//! from read-only host directories plus a private btrfs subvolume (`native/pool.rs`), cgroup limits
//! (`native/cgroup/`), seccomp, Landlock and no capabilities. The privileged setup happens in a
//! separate single-threaded process (`native/setup/`), never in the caller.
//!
//! This crate does not parse CLI flags, serve HTTP or store records.

pub mod agent_client;
mod error;
pub mod fault;
pub mod native;

use std::path::PathBuf;

pub use error::RuntimeError;
pub use native::transfer::{ExportOptions, ImportLimits, TransferSummary};
pub use native::{NativeBackend, NativeConfig, NetworkSubnet, VolumeUsage};
use paddock_types::{ByteSize, Limits, SandboxId, SandboxSpec, SnapshotId, VolumeId};
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
    /// A sandbox can be given a link to the egress proxy (`SandboxSpec::network`).
    pub network: bool,
    /// The block I/O weight file every sandbox gets in a cgroup of its own (`blkio.bfq.weight`,
    /// `blkio.weight`, `io.bfq.weight` or `io.weight`); `None` when the host's cgroups offer none, and
    /// sandboxes' I/O is then unweighted (nothing is refused for it).
    pub io_weight: Option<&'static str>,
}

/// A live sandbox as a backend hands it out.
#[derive(Debug)]
pub struct SandboxHandle {
    /// The sandbox's id.
    pub id: SandboxId,
    /// Where its agent listens.
    pub agent_socket: PathBuf,
    /// Its link to the egress proxy, when it has network access (`SandboxSpec::network`).
    pub network: Option<paddock_types::NetworkLink>,
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
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per sandbox when a server starts; boxing the handle would buy nothing"
)]
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

/// How much storage a snapshot holds, measured from the extents of its files (not from its quota
/// group: under the pool's simple quotas every extent stays charged to the sandbox that wrote it).
/// Data only; file system metadata is not counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotUsage {
    /// Bytes of file data the snapshot refers to, shared with its sandbox, other snapshots or the
    /// template included.
    pub referenced_bytes: u64,
    /// Bytes of file data nothing else refers to: what deleting the snapshot frees. Grows as the
    /// sandbox it was taken of (and its forks) overwrite or delete what the snapshot keeps.
    pub exclusive_bytes: u64,
}

/// An isolation backend.
///
/// The futures of [`AnyBackend`]'s methods are `Send` (a test says so), so a multi-threaded server
/// can share one `Arc<AnyBackend>`. `create_sandbox`, `destroy_sandbox`, `reclaim_sandbox`,
/// `rollback_sandbox`, `snapshot_sandbox`, `snapshot_usage` and the reclaiming paths of
/// `adopt_sandbox` do blocking work (processes, btrfs ioctls and transaction commits, walking a
/// snapshot's files, waiting up to 10 s for killed processes): call them from `spawn_blocking` or
/// `block_in_place` in such a server.
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
    /// Stops a sandbox: its processes end and its resources go, but its file system is kept (outside
    /// garbage collection's reach) until [`Backend::delete_stopped`], or until a create with
    /// [`VolumeSource::Stopped`](paddock_types::VolumeSource::Stopped) and the same id resumes it.
    async fn stop_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError>;
    /// Deletes a stopped sandbox's file system; false if there is none.
    async fn delete_stopped(&self, id: &SandboxId) -> Result<bool, RuntimeError>;
    /// Ends whatever of sandbox `id` still runs without an owner and keeps its file system as a
    /// stopped sandbox's (for a stop or resume a crash interrupted). Whether its files are kept.
    async fn park_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError>;
    /// The ids of every stopped sandbox's kept file system.
    fn list_stopped(&self) -> Vec<SandboxId>;
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
    /// Takes a crash-consistent, read-only snapshot of the sandbox's file system as `snapshot`: every
    /// process of the sandbox is frozen for the moment the snapshot takes, then thawed (a paused
    /// sandbox stays paused). [`RuntimeError::InvalidSpec`] if `snapshot` exists already;
    /// [`RuntimeError::Unsupported`] where the host cannot freeze a sandbox (cgroup v1 only).
    async fn snapshot_sandbox(
        &self,
        handle: &SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<(), RuntimeError>;
    /// Makes a rollback of the sandbox to `snapshot` cheaper by doing its work now: the native backend
    /// boots a copy of the sandbox on the snapshot, which the rollback then switches to. Optional: a
    /// rollback works without it. Replaces what was prepared for another snapshot. Blocking work
    /// (a sandbox boot); callers run it in the background.
    async fn prepare_rollback(
        &self,
        handle: &SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<(), RuntimeError>;
    /// Releases what [`Backend::prepare_rollback`] holds (the snapshot was committed away).
    async fn discard_rollback(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;
    /// Deletes a snapshot; false if it did not exist. Sandboxes created from it are not affected.
    async fn delete_snapshot(&self, snapshot: &SnapshotId) -> Result<bool, RuntimeError>;
    /// How much storage a snapshot holds ([`RuntimeError::InvalidSpec`] if it does not exist). Maps
    /// the extents of every file in it: about 20 ms per thousand files, whatever their size.
    async fn snapshot_usage(&self, snapshot: &SnapshotId) -> Result<SnapshotUsage, RuntimeError>;
    /// Every snapshot that exists, whoever took it (for garbage collection against records).
    fn list_snapshots(&self) -> Result<Vec<SnapshotId>, RuntimeError>;
    /// Writes `snapshot` to `out` as a POSIX (pax) tar stream: its tree with owners as the sandbox
    /// sees them, modes (setuid and setgid cleared unless `options` keep them), mtimes, symlinks,
    /// hard links and file contents (fifos, sockets and devices are skipped).
    /// [`RuntimeError::InvalidSpec`] if it does not exist; [`RuntimeError::Stream`] if `out` fails.
    /// Blocking, and as long as the stream: call it from a blocking thread.
    fn export_snapshot(
        &self,
        snapshot: &SnapshotId,
        options: &ExportOptions,
        out: &mut dyn std::io::Write,
    ) -> Result<TransferSummary, RuntimeError>;
    /// Creates the read-only snapshot `snapshot` from the tar stream `input` (as
    /// [`Backend::export_snapshot`] writes them), usable like a taken one. The archive is untrusted:
    /// it is unpacked into a staging area it cannot leave, refused with
    /// [`RuntimeError::InvalidArchive`] or [`RuntimeError::ArchiveTooLarge`] when unsafe, malformed
    /// or past `limits`, and on any error nothing of it remains. Blocking: call it from a blocking
    /// thread.
    fn import_snapshot(
        &self,
        snapshot: &SnapshotId,
        input: &mut dyn std::io::Read,
        limits: &ImportLimits,
    ) -> Result<TransferSummary, RuntimeError>;
    /// Creates an empty named volume, writable by the sandbox's default user, holding at most `size`
    /// bytes (writes beyond fail with `EDQUOT`) when given.
    async fn create_volume(&self, volume: &VolumeId, size: Option<ByteSize>) -> Result<(), RuntimeError>;
    /// Deletes a named volume and frees its storage; false if it did not exist. The caller makes sure
    /// no live sandbox mounts it.
    async fn delete_volume(&self, volume: &VolumeId) -> Result<bool, RuntimeError>;
    /// What a named volume holds and its size limit.
    async fn volume_usage(&self, volume: &VolumeId) -> Result<VolumeUsage, RuntimeError>;
    /// Every named volume that exists (for garbage collection against records).
    fn list_volumes(&self) -> Result<Vec<VolumeId>, RuntimeError>;
    /// What changed in the sandbox's files since `snapshot` (added, modified, deleted paths, and
    /// unified diffs of text files when asked). Walks both trees: blocking work, bounded by `options`.
    async fn diff_sandbox(
        &self,
        handle: &SandboxHandle,
        snapshot: &SnapshotId,
        options: &paddock_types::diff::DiffOptions,
    ) -> Result<paddock_types::diff::TreeDiff, RuntimeError>;
    /// Freezes every process of the sandbox until [`Backend::resume_sandbox`]: they use no CPU and
    /// keep their memory. The state is the kernel's, so it survives a restart of this process (an
    /// adopted sandbox may come back paused). Pausing a paused sandbox does nothing.
    async fn pause_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;
    /// Lets a paused sandbox run again. Resuming a running sandbox does nothing.
    async fn resume_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;
    /// Returns the sandbox's file system exactly to `snapshot` and restarts it: every process is
    /// killed (a paused sandbox is resumed), and a new init and agent start with the same id, limits,
    /// root file system and user; the returned handle's agent is ready. Connections to the old agent
    /// end. On any error, checking the snapshot included, the sandbox is destroyed: check that the
    /// snapshot exists first.
    async fn rollback_sandbox(
        &self,
        handle: SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<SandboxHandle, RuntimeError>;
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
    async fn stop_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.stop_sandbox(handle).await,
        }
    }
    async fn delete_stopped(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        match self {
            Self::Native(b) => b.delete_stopped(id).await,
        }
    }

    async fn park_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        match self {
            Self::Native(b) => b.park_sandbox(id).await,
        }
    }
    fn list_stopped(&self) -> Vec<SandboxId> {
        match self {
            Self::Native(b) => b.list_stopped(),
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
    async fn snapshot_sandbox(
        &self,
        handle: &SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.snapshot_sandbox(handle, snapshot).await,
        }
    }
    async fn prepare_rollback(
        &self,
        handle: &SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.prepare_rollback(handle, snapshot).await,
        }
    }
    async fn discard_rollback(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.discard_rollback(handle).await,
        }
    }
    async fn delete_snapshot(&self, snapshot: &SnapshotId) -> Result<bool, RuntimeError> {
        match self {
            Self::Native(b) => b.delete_snapshot(snapshot).await,
        }
    }
    async fn snapshot_usage(&self, snapshot: &SnapshotId) -> Result<SnapshotUsage, RuntimeError> {
        match self {
            Self::Native(b) => b.snapshot_usage(snapshot).await,
        }
    }
    fn list_snapshots(&self) -> Result<Vec<SnapshotId>, RuntimeError> {
        match self {
            Self::Native(b) => b.list_snapshots(),
        }
    }
    fn export_snapshot(
        &self,
        snapshot: &SnapshotId,
        options: &ExportOptions,
        out: &mut dyn std::io::Write,
    ) -> Result<TransferSummary, RuntimeError> {
        match self {
            Self::Native(b) => b.export_snapshot(snapshot, options, out),
        }
    }
    fn import_snapshot(
        &self,
        snapshot: &SnapshotId,
        input: &mut dyn std::io::Read,
        limits: &ImportLimits,
    ) -> Result<TransferSummary, RuntimeError> {
        match self {
            Self::Native(b) => b.import_snapshot(snapshot, input, limits),
        }
    }
    async fn create_volume(&self, volume: &VolumeId, size: Option<ByteSize>) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.create_volume(volume, size).await,
        }
    }
    async fn delete_volume(&self, volume: &VolumeId) -> Result<bool, RuntimeError> {
        match self {
            Self::Native(b) => b.delete_volume(volume).await,
        }
    }
    async fn volume_usage(&self, volume: &VolumeId) -> Result<VolumeUsage, RuntimeError> {
        match self {
            Self::Native(b) => b.volume_usage(volume).await,
        }
    }
    fn list_volumes(&self) -> Result<Vec<VolumeId>, RuntimeError> {
        match self {
            Self::Native(b) => b.list_volumes(),
        }
    }
    async fn diff_sandbox(
        &self,
        handle: &SandboxHandle,
        snapshot: &SnapshotId,
        options: &paddock_types::diff::DiffOptions,
    ) -> Result<paddock_types::diff::TreeDiff, RuntimeError> {
        match self {
            Self::Native(b) => b.diff_sandbox(handle, snapshot, options).await,
        }
    }
    async fn pause_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.pause_sandbox(handle).await,
        }
    }
    async fn resume_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        match self {
            Self::Native(b) => b.resume_sandbox(handle).await,
        }
    }
    async fn rollback_sandbox(
        &self,
        handle: SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<SandboxHandle, RuntimeError> {
        match self {
            Self::Native(b) => b.rollback_sandbox(handle, snapshot).await,
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
        other: SandboxHandle,
        limits: &Limits,
        snapshot: &SnapshotId,
    ) {
        send(&backend.create_sandbox(spec));
        send(&backend.wait_sandbox(&mut handle));
        send(&backend.sandbox_usage(&handle));
        send(&backend.update_limits(&handle, limits));
        send(&backend.adopt_sandbox(&spec.id));
        send(&backend.reclaim_sandbox(&spec.id));
        send(&backend.collect_garbage());
        send(&backend.delete_stopped(&spec.id));
        send(&backend.snapshot_sandbox(&handle, snapshot));
        send(&backend.prepare_rollback(&handle, snapshot));
        send(&backend.discard_rollback(&handle));
        send(&backend.delete_snapshot(snapshot));
        send(&backend.snapshot_usage(snapshot));
        send(&backend.pause_sandbox(&handle));
        send(&backend.resume_sandbox(&handle));
        send(&backend.rollback_sandbox(other, snapshot));
        let volume = VolumeId::from_random([0; 8]);
        send(&backend.create_volume(&volume, None));
        send(&backend.delete_volume(&volume));
        send(&backend.volume_usage(&volume));
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
