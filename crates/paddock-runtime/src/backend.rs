//! The backend seam: what every backend does (two synchronous traits split by concern), the handle of
//! a live sandbox, and the closed set of backends.
//!
//! The traits are honest about their cost: every method may block (processes, btrfs ioctls and
//! transaction commits, walks of a snapshot's files, waiting up to 10 s for killed processes), so an
//! async caller runs them on a blocking thread (the control plane does so in one place,
//! `SandboxService::on_backend`). Both traits are object safe: [`AnyBackend::get`] hands out a
//! `&dyn Backend`, the one `match` over backends. Adding a backend is one module implementing
//! [`SandboxBackend`] and [`StorageBackend`], one variant of [`AnyBackend`] and one of [`AnyHandle`].
//!
//! This module holds no backend's logic.

use std::path::PathBuf;

use paddock_types::diff::{DiffOptions, TreeDiff};
use paddock_types::{
    ByteSize, Limits, NetworkLink, SandboxId, SandboxSpec, SnapshotId, TemplateId, VolumeId,
};
use serde::{Deserialize, Serialize};

use crate::native::{NativeBackend, NativeSandbox};
use crate::{
    ExportOptions, ImportLimits, RuntimeError, TemplateBuilt, TemplateLimits, TemplateProgress,
    TemplateSource, TransferSummary,
};

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
    pub network: Option<NetworkLink>,
    /// Backend-private state needed to operate on it and tear it down.
    pub(crate) inner: AnyHandle,
}

/// The backend-private part of a [`SandboxHandle`]: one variant per backend.
#[derive(Debug)]
#[cfg_attr(
    feature = "fake",
    expect(
        clippy::large_enum_variant,
        reason = "the small fake variant exists in test builds only; boxing the native one would cost every real handle an allocation for nothing"
    )
)]
pub(crate) enum AnyHandle {
    Native(NativeSandbox),
    #[cfg(feature = "fake")]
    Fake(crate::fake::FakeSandbox),
}

impl SandboxHandle {
    /// The sandbox's id.
    pub fn id(&self) -> &SandboxId {
        &self.id
    }

    /// The host pid of the sandbox's init (its agent), where the backend runs it as a host process.
    pub fn init_pid(&self) -> Option<i32> {
        match &self.inner {
            AnyHandle::Native(sb) => Some(sb.init_pid()),
            #[cfg(feature = "fake")]
            AnyHandle::Fake(_) => None,
        }
    }
}

/// What [`SandboxBackend::adopt_sandbox`] found.
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

/// How much a sandbox's or a named volume's storage holds, and its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeUsage {
    /// Bytes written that still exist (for the native backend: its simple-quota group's count, as of
    /// the file system's last transaction commit).
    pub bytes: u64,
    /// Its size limit.
    pub limit: Option<u64>,
}

/// Sandbox lifecycles: create, stop, adopt, pause, roll back, tear down. Every method may block.
pub trait SandboxBackend: Send + Sync + std::fmt::Debug {
    /// What this backend supports.
    fn capabilities(&self) -> Capabilities;
    /// Creates and starts a sandbox whose agent is ready for connections when this returns.
    fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError>;
    /// Kills every process of the sandbox and removes everything it created.
    fn destroy_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError>;
    /// Waits (at most `timeout`) for teardown steps a destroy or stop left running in the
    /// background (a networked sandbox's link, on the native backend); whether none is left. A
    /// server calls it before it exits; what a crash interrupts instead, gc finishes.
    fn settle_teardowns(&self, timeout: std::time::Duration) -> bool {
        let _ = timeout;
        true
    }
    /// Reclaims what crashed runs left behind; returns the ids reclaimed. Every sandbox whose owner
    /// is gone counts, so a restarted server adopts the sandboxes it wants to keep first.
    fn collect_garbage(&self) -> Result<Vec<String>, RuntimeError>;
    /// Stops a sandbox: its processes end and its resources go, but its file system is kept (outside
    /// garbage collection's reach) until [`SandboxBackend::delete_stopped`], or until a create with
    /// [`VolumeSource::Stopped`](paddock_types::VolumeSource::Stopped) and the same id resumes it.
    fn stop_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError>;
    /// Deletes a stopped sandbox's file system; false if there is none.
    fn delete_stopped(&self, id: &SandboxId) -> Result<bool, RuntimeError>;
    /// Ends whatever of sandbox `id` still runs without an owner and keeps its file system as a
    /// stopped sandbox's (for a stop or resume a crash interrupted). Whether its files are kept.
    fn park_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError>;
    /// The ids of every stopped sandbox's kept file system.
    fn list_stopped(&self) -> Vec<SandboxId>;
    /// Takes over sandbox `id`, created by an earlier process that is gone (a server restart), if it
    /// still runs; reclaims its remains if it does not.
    fn adopt_sandbox(&self, id: &SandboxId) -> Result<Adoption, RuntimeError>;
    /// Reads what the sandbox uses now.
    fn sandbox_usage(&self, handle: &SandboxHandle) -> Result<SandboxUsage, RuntimeError>;
    /// Changes the limits of a running sandbox (memory, pids, cpu, disk); `None` removes a limit.
    fn update_limits(&self, handle: &SandboxHandle, limits: &Limits) -> Result<(), RuntimeError>;
    /// Kills and removes everything of sandbox `id` unless a live process owns it; true if something
    /// was there to reclaim.
    fn reclaim_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError>;
    /// Freezes every process of the sandbox until [`SandboxBackend::resume_sandbox`]: they use no CPU
    /// and keep their memory. The state is the kernel's, so it survives a restart of this process (an
    /// adopted sandbox may come back paused). Pausing a paused sandbox does nothing.
    fn pause_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;
    /// Lets a paused sandbox run again. Resuming a running sandbox does nothing.
    fn resume_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;
    /// Freezes the sandbox as [`SandboxBackend::pause_sandbox`] does, for work that needs its files
    /// still across several calls (a fork's copies, made from
    /// [`VolumeSource::Sandbox`](paddock_types::VolumeSource::Sandbox)); whether it was frozen
    /// already (paused, or a snapshot under way), in which case the caller must not resume it after.
    fn freeze_sandbox(&self, handle: &SandboxHandle) -> Result<bool, RuntimeError>;
    /// Makes a rollback of the sandbox to `snapshot` cheaper by doing its work now: the native backend
    /// boots a copy of the sandbox on the snapshot, which the rollback then switches to. Optional: a
    /// rollback works without it. Replaces what was prepared for another snapshot.
    fn prepare_rollback(&self, handle: &SandboxHandle, snapshot: &SnapshotId) -> Result<(), RuntimeError>;
    /// Releases what [`SandboxBackend::prepare_rollback`] holds (the snapshot was committed away).
    fn discard_rollback(&self, handle: &SandboxHandle) -> Result<(), RuntimeError>;
    /// Returns the sandbox's file system exactly to `snapshot` and restarts it: every process is
    /// killed (a paused sandbox is resumed), and a new init and agent start with the same id, limits,
    /// root file system and user; the returned handle's agent is ready. Connections to the old agent
    /// end. On any error, checking the snapshot included, the sandbox is destroyed: check that the
    /// snapshot exists first.
    fn rollback_sandbox(
        &self,
        handle: SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<SandboxHandle, RuntimeError>;
    /// A socket from which the host reaches the sandbox's own TCP port `port` (what a process in it
    /// listening on `127.0.0.1:<port>` or `0.0.0.0:<port>` serves), not yet connected: the native
    /// backend makes it in the sandbox's network namespace (found through the init's pidfd, never
    /// by a pid or a path the sandbox can change). Cheap (no connect is attempted here), so the
    /// caller connects it asynchronously, with its own timeout, without holding the handle.
    fn open_port(&self, handle: &SandboxHandle, port: u16) -> Result<PortSocket, RuntimeError>;
}

/// A socket to a sandbox's port (see [`SandboxBackend::open_port`]): made where the port is
/// reachable, with the address to connect it to.
#[derive(Debug)]
pub struct PortSocket {
    /// A non-blocking, close-on-exec TCP socket, not connected.
    socket: std::os::fd::OwnedFd,
    /// Where to connect it.
    addr: std::net::SocketAddr,
}

impl PortSocket {
    /// A socket and the address it is to be connected to (`socket` must be a non-blocking TCP
    /// socket of `addr`'s family).
    pub fn new(socket: std::os::fd::OwnedFd, addr: std::net::SocketAddr) -> Self {
        Self { socket, addr }
    }

    /// The address it connects to (as the sandbox sees it).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// Connects it (inside a tokio runtime). `ConnectionRefused` when nothing listens on the port.
    pub async fn connect(self) -> std::io::Result<tokio::net::TcpStream> {
        // A socket, not a connected stream yet: std has no type for that, and tokio's `TcpSocket`
        // is made from a std stream's descriptor.
        let socket = tokio::net::TcpSocket::from_std_stream(std::net::TcpStream::from(self.socket));
        socket.set_nodelay(true)?;
        socket.connect(self.addr).await
    }
}

/// Storage: snapshots, their transfer, named volumes and diffs. Every method may block.
pub trait StorageBackend: Send + Sync + std::fmt::Debug {
    /// Takes a crash-consistent, read-only snapshot of the sandbox's file system as `snapshot`: every
    /// process of the sandbox is frozen for the moment the snapshot takes, then thawed (a paused
    /// sandbox stays paused). [`RuntimeError::InvalidSpec`] if `snapshot` exists already;
    /// [`RuntimeError::Unsupported`] where the host cannot freeze a sandbox (cgroup v1 only).
    fn snapshot_sandbox(&self, handle: &SandboxHandle, snapshot: &SnapshotId) -> Result<(), RuntimeError>;
    /// Deletes a snapshot; false if it did not exist. Sandboxes created from it are not affected.
    fn delete_snapshot(&self, snapshot: &SnapshotId) -> Result<bool, RuntimeError>;
    /// How much storage a snapshot holds ([`RuntimeError::InvalidSpec`] if it does not exist). The
    /// native backend maps the extents of every file in it: about 20 ms per thousand files.
    fn snapshot_usage(&self, snapshot: &SnapshotId) -> Result<SnapshotUsage, RuntimeError>;
    /// Every snapshot that exists, whoever took it (for garbage collection against records).
    fn list_snapshots(&self) -> Result<Vec<SnapshotId>, RuntimeError>;
    /// Writes `snapshot` to `out` as a POSIX (pax) tar stream: its tree with owners as the sandbox
    /// sees them, modes (setuid and setgid cleared unless `options` keep them), mtimes, symlinks,
    /// hard links and file contents (fifos, sockets and devices are skipped).
    /// [`RuntimeError::InvalidSpec`] if it does not exist; [`RuntimeError::Stream`] if `out` fails.
    /// As long as the stream.
    fn export_snapshot(
        &self,
        snapshot: &SnapshotId,
        options: &ExportOptions,
        out: &mut dyn std::io::Write,
    ) -> Result<TransferSummary, RuntimeError>;
    /// Creates the read-only snapshot `snapshot` from the tar stream `input` (as
    /// [`StorageBackend::export_snapshot`] writes them), usable like a taken one. The archive is
    /// untrusted: it is unpacked into a staging area it cannot leave, refused with
    /// [`RuntimeError::InvalidArchive`] or [`RuntimeError::ArchiveTooLarge`] when unsafe, malformed
    /// or past `limits`, and on any error nothing of it remains.
    fn import_snapshot(
        &self,
        snapshot: &SnapshotId,
        input: &mut dyn std::io::Read,
        limits: &ImportLimits,
    ) -> Result<TransferSummary, RuntimeError>;
    /// Creates an empty named volume, writable by the sandbox's default user, holding at most `size`
    /// bytes (writes beyond fail with `EDQUOT`) when given.
    fn create_volume(&self, volume: &VolumeId, size: Option<ByteSize>) -> Result<(), RuntimeError>;
    /// Deletes a named volume and frees its storage; false if it did not exist. The caller makes sure
    /// no live sandbox mounts it.
    fn delete_volume(&self, volume: &VolumeId) -> Result<bool, RuntimeError>;
    /// What a named volume holds and its size limit.
    fn volume_usage(&self, volume: &VolumeId) -> Result<VolumeUsage, RuntimeError>;
    /// Every named volume that exists (for garbage collection against records).
    fn list_volumes(&self) -> Result<Vec<VolumeId>, RuntimeError>;
    /// What changed in the sandbox's files since `snapshot` (added, modified, deleted paths, and
    /// unified diffs of text files when asked). Walks both trees, bounded by `options`.
    fn diff_sandbox(
        &self,
        handle: &SandboxHandle,
        snapshot: &SnapshotId,
        options: &DiffOptions,
    ) -> Result<TreeDiff, RuntimeError>;
    /// Builds the template `template` from `source`, calling `progress` as layers are put in
    /// place, and makes it read-only: sandboxes whose rootfs names it start as a copy of it. The
    /// source is untrusted ([`RuntimeError::Image`] when it is unsafe or malformed); on any error,
    /// or if the process dies, nothing of the build remains once gc has run. Layers are cached by
    /// digest and shared between templates. [`RuntimeError::InvalidSpec`] if it exists already.
    fn build_template(
        &self,
        template: &TemplateId,
        source: &TemplateSource,
        limits: &TemplateLimits,
        progress: &mut dyn FnMut(TemplateProgress),
    ) -> Result<TemplateBuilt, RuntimeError>;
    /// Deletes a template and the cached layers no other template uses; false if it did not exist.
    /// The caller makes sure no sandbox (running, stopped) was made from it.
    fn delete_template(&self, template: &TemplateId) -> Result<bool, RuntimeError>;
    /// Every template that exists (for garbage collection against records).
    fn list_templates(&self) -> Result<Vec<TemplateId>, RuntimeError>;
    /// What template `template` holds, measured now from its files (the bytes they refer to): for
    /// templates recorded before [`TemplateBuilt::bytes`] was kept.
    fn template_bytes(&self, template: &TemplateId) -> Result<u64, RuntimeError>;
    /// How many of `chain`'s keys, from the first, the layer cache holds in a row (the longest
    /// cached prefix's length; 0 when not even the first).
    fn cached_prefix(&self, chain: &[String]) -> Result<usize, RuntimeError>;
    /// Keeps template `template`'s tree in the layer cache as `key` (64 hex digits), unless the
    /// cache has that key already; `bytes` is what the tree holds ([`TemplateBuilt::bytes`]).
    fn cache_template(&self, template: &TemplateId, key: &str, bytes: u64) -> Result<(), RuntimeError>;
    /// Makes template `template` from the cached tree of `chain`'s last key (its record naming the
    /// whole chain, which the cache keeps while the template exists); `None` when the cache does
    /// not have it. The digest and process defaults are those recorded with the cached tree.
    fn template_from_cache(
        &self,
        template: &TemplateId,
        chain: &[String],
    ) -> Result<Option<TemplateBuilt>, RuntimeError>;
    /// Makes template `template` from template `from` (which holds `from_bytes`) with the
    /// top-level directories `dirs` added where it has nothing of their names (a recipe's
    /// `WORKDIR` and `COPY` destinations), and caches its tree as `chain`'s last key.
    fn template_with_dirs(
        &self,
        template: &TemplateId,
        from: &TemplateId,
        from_bytes: u64,
        chain: &[String],
        dirs: &[String],
    ) -> Result<TemplateBuilt, RuntimeError>;
    /// Makes template `template` from `snapshot` (a sandbox's files: a recipe step's result) with
    /// the process defaults `config`, and caches its tree as `chain`'s last key. `snapshot_bytes`
    /// is what the snapshot holds (what its sandbox started from plus what it wrote); returns what
    /// the template holds ([`TemplateBuilt::bytes`]).
    fn template_from_snapshot(
        &self,
        template: &TemplateId,
        snapshot: &SnapshotId,
        chain: &[String],
        config: &paddock_types::ImageConfig,
        snapshot_bytes: u64,
    ) -> Result<u64, RuntimeError>;
}

/// A whole backend: lifecycles and storage.
pub trait Backend: SandboxBackend + StorageBackend {}

impl<T: SandboxBackend + StorageBackend> Backend for T {}

/// Every backend paddock has, as a closed set.
#[derive(Debug)]
#[cfg_attr(
    feature = "fake",
    expect(
        clippy::large_enum_variant,
        reason = "one backend per process, made once; the small fake variant exists in test builds only"
    )
)]
pub enum AnyBackend {
    /// Linux namespaces + btrfs pool + cgroups + seccomp + Landlock.
    Native(NativeBackend),
    /// In-memory sandboxes with an agent double, for tests of the control plane without root.
    #[cfg(feature = "fake")]
    Fake(crate::fake::FakeBackend),
}

impl AnyBackend {
    /// The backend behind the seam: the one place that matches on the set of backends.
    pub fn get(&self) -> &dyn Backend {
        match self {
            Self::Native(b) => b,
            #[cfg(feature = "fake")]
            Self::Fake(b) => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shareable<T: Send + Sync + ?Sized>() {}

    #[test]
    fn backend_and_handles_are_shareable_across_threads() {
        shareable::<AnyBackend>();
        shareable::<dyn Backend>();
        shareable::<NativeBackend>();
        shareable::<SandboxHandle>();
        shareable::<Adoption>();
        shareable::<crate::agent_client::AgentClient>();
    }
}
