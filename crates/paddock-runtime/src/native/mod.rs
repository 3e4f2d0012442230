//! The native backend: Linux namespaces, a btrfs storage pool, cgroups, seccomp, Landlock.
//!
//! State directory layout (default `/var/lib/paddock`):
//!
//! ```text
//! <state>/pool.img, <state>/pool/      the storage pool (see pool/mod.rs)
//! <state>/run/                         a private tmpfs (run_mount.rs)
//! <state>/run/<id>/lock                flock held by the process that owns the sandbox
//! <state>/run/<id>/init.pid            the init's host pid and start time (for adoption, adopt.rs)
//! <state>/run/<id>/boot.json           rootfs, mounts, volumes, user and network link, to restart the
//!                                      init (rollback.rs)
//! <state>/run/<id>/netns               a networked sandbox's network namespace, pinned (network/)
//! <state>/run/<id>/agent.sock          the agent's socket
//! <state>/run/<id>/agent.log           the agent's stderr
//! <state>/run/<id>/root/               mount point of the sandbox root (inside its mount ns only)
//! <state>/pool/sandboxes/<id>/volume   the sandbox's writable subvolume (/etc, /home, /root, /tmp), in a
//!                                      directory of its own (pool/place.rs)
//! <state>/pool/snapshots/<id>          read-only snapshots of sandboxes (snapshot.rs); not owned by any
//!                                      sandbox: gc leaves them alone, `pool destroy` removes them
//! <state>/pool/imports/<id>            an import being unpacked (transfer/), with <id>.lock held by
//!                                      its process: gc removes one whose lock is free
//! <state>/pool/volumes/<vol-id>        named volumes (named_volumes.rs), bound into the sandboxes that
//!                                      mount them; owned by no sandbox either
//! <state>/pool/spares/<key>.<n>        writable snapshots of the host template made ahead, renamed into
//!                                      sandboxes/<id>/ by a creation (pool/spare.rs); gc removes stale ones
//! ```

mod adopt;
mod cgroup;
mod deferred;
pub mod diff;
mod early_volume;
mod gc;
mod handover;
mod host;
pub mod image;
mod lifecycle;
mod lock;
mod named_volumes;
mod network;
mod pool;
mod ports;
mod ready;
mod resources;
mod rollback;
mod run_mount;
mod sandbox;
mod seam;
pub mod setup;
mod snapshot;
mod snapshot_usage;
mod staging;
mod template;
pub mod transfer;
mod untar;
mod users;
mod walk;

use std::path::{Path, PathBuf};

pub use cgroup::{CgroupKind, CgroupLayout};
pub use handover::{BadKept, KeptAcrossExec};
pub use host::host_facts;
pub use network::{ruleset, NetworkError, NetworkSubnet, ParseSubnetError};
pub use pool::{Made, SpareMaker, StoragePool};
pub use ready::{ready_eligible, MakerLock, MAX_READY};
pub(crate) use sandbox::NativeSandbox;
pub use users::IdRange;

use paddock_types::ByteSize;

use crate::{AnyHandle, Capabilities, RuntimeError, SandboxHandle};

/// Configuration of the native backend.
#[derive(Debug, Clone)]
pub struct NativeConfig {
    /// State directory.
    pub state_dir: PathBuf,
    /// Size of the pool image when the state directory is not on btrfs (sparse; caps the total that
    /// all sandboxes can write).
    pub pool_size: ByteSize,
    /// Host id range sandbox ids map to.
    pub ids: IdRange,
    /// The in-sandbox agent binary (static).
    pub agent_binary: PathBuf,
    /// The setup shim's executable (`paddock-setup`, next to `paddock`), started once per sandbox
    /// with its spec on stdin.
    pub setup_binary: PathBuf,
    /// Name of the parent cgroup sandboxes are created under in every hierarchy.
    pub cgroup_parent: String,
    /// Kill sandboxes when the creating process dies (`paddock run`), instead of letting them outlive
    /// it (`paddock serve`, which re-adopts them).
    pub die_with_parent: bool,
    /// The subnet networked sandboxes' links are cut from (one /30 each); default `10.253.0.0/16`.
    /// Pools on one host may share it: a slot is taken by creating its host interface, which the
    /// kernel lets only one process do.
    pub network_subnet: NetworkSubnet,
}

/// The native backend.
#[derive(Debug)]
pub struct NativeBackend {
    config: NativeConfig,
    pool: StoragePool,
    cgroups: CgroupLayout,
    /// The block I/O weight file sandboxes get, if the host's cgroups offer one.
    io_weight: Option<&'static str>,
    /// The tools that make networked sandboxes' links, or the names of those missing.
    network_tools: Result<network::NetworkTools, String>,
    /// Teardown steps running in the background (`deferred.rs`).
    deferred: deferred::Deferred,
}

impl NativeBackend {
    /// Checks the host and opens (creating on first use) the storage pool. Refuses, with the reason,
    /// when the host lacks something the isolation needs.
    pub fn open(config: NativeConfig) -> Result<Self, RuntimeError> {
        if !rustix::process::geteuid().is_root() {
            return Err(RuntimeError::Unsupported(
                "the native backend needs root on the host (to map sandbox users to an unprivileged uid \
                 range, create cgroups and manage the btrfs pool)"
                    .into(),
            ));
        }
        if !config.agent_binary.is_file() {
            return Err(RuntimeError::Unsupported(format!(
                "the agent binary {} does not exist (build it with `cargo build -p paddock-agent`, or set \
                 PADDOCK_AGENT)",
                config.agent_binary.display()
            )));
        }
        if !config.setup_binary.is_file() {
            return Err(RuntimeError::Unsupported(format!(
                "the setup shim binary {} does not exist (it is built with `cargo build -p paddock`, next \
                 to `paddock`)",
                config.setup_binary.display()
            )));
        }
        if setup::owner::OwnerPool::default_pool().overlaps(config.ids) {
            return Err(RuntimeError::InvalidConfig(format!(
                "the sandbox id range {}..+{} overlaps the uids that own sandboxes' user namespaces",
                config.ids.base, config.ids.count
            )));
        }
        let cgroups = CgroupLayout::detect(
            &config.cgroup_parent,
            config.state_dir.join(cgroup::CREATED_PARENTS),
        )?;
        if paddock_sys::landlock::kernel_abi().is_none() {
            tracing::warn!(
                "this kernel has no Landlock: sandboxes run without its write restrictions (namespaces, \
                 read-only mounts, seccomp and dropped capabilities still apply)"
            );
        }
        prepare_state_dir(&config, || {
            cgroups
                .list_ids()
                .iter()
                .any(|id| !cgroups.sandbox(id).pids().is_empty())
        })?;
        let pool = StoragePool::open(&config.state_dir, config.pool_size, config.ids)?;
        let network_tools = network::NetworkTools::find();
        if let Err(missing) = &network_tools {
            tracing::info!(%missing, "sandboxes cannot have network access on this host (tools missing)");
        }
        let io_weight = cgroups.io_weight_file()?;
        match io_weight {
            Some(file) => tracing::info!(
                file,
                weight = cgroup::DEFAULT_IO_WEIGHT,
                "block I/O: every sandbox gets its own weight (it acts where the pool's device is \
                 scheduled by BFQ, or io.cost on cgroup v2)"
            ),
            // Info, not warn: a host property, not a fault, and `paddock run` prints warnings on
            // every call (serve logs info by default, so operators still see it).
            None => tracing::info!(
                "block I/O: sandboxes' disk I/O is not weighted: this host's cgroups offer no weight \
                 file (blkio.weight or blkio.bfq.weight on cgroup v1, which needs the BFQ scheduler; \
                 io.weight or io.bfq.weight on cgroup v2)"
            ),
        }
        Ok(Self {
            config,
            pool,
            cgroups,
            io_weight,
            network_tools,
            deferred: deferred::Deferred::default(),
        })
    }

    /// What makes spare volumes of the host template ahead of need (`pool/spare.rs`): a caller runs
    /// it off its creation's path, on a thread of its own.
    pub fn spare_maker(&self) -> SpareMaker {
        self.pool.spare_maker()
    }

    /// The capabilities of the native backend.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            disk_limits: true,
            cheap_snapshots: true,
            custom_rootfs: true,
            host_mounts: true,
            network: self.network_tools.is_ok(),
            io_weight: self.io_weight,
        }
    }

    /// The host's figures that bound what one sandbox may ask for, with this backend's pool.
    pub fn host_facts(&self) -> Result<paddock_types::HostFacts, RuntimeError> {
        host_facts(&self.config.state_dir, self.config.pool_size)
    }

    fn run_dir(&self, id: &str) -> PathBuf {
        self.config.state_dir.join("run").join(id)
    }
}

/// Creates the state directory and `run/`, and makes both searchable by the sandbox root group (mode
/// 0710): each sandbox's init builds its root under `run/<id>/` as the sandbox's root user, an
/// unprivileged host uid. Other host users get no access. `run/` becomes a tmpfs (`run_mount.rs`;
/// `sandboxes_live` says whether any sandbox has processes, for its check of another namespace's).
fn prepare_state_dir(config: &NativeConfig, sandboxes_live: impl Fn() -> bool) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    let state = &config.state_dir;
    if let Some(dir) = unsearchable_ancestor(state) {
        return Err(RuntimeError::InvalidConfig(format!(
            "state directory {} is unusable: {} is not searchable by other users (chmod o+x), and \
             sandboxes set themselves up as an unprivileged user",
            state.display(),
            dir.display()
        )));
    }
    // Two first starts at once (two `paddock run`s on a new host) would each see the other's
    // half-made directory as someone else's, and could each mount `run/`: the preparation is
    // serialised by a lock on the directory itself (which exists from here on).
    let _serialised = lock_directory(state)?;
    // The state directory's permissions are paddock's to set, so it must be paddock's: new, empty, or
    // marked by an earlier start. Never re-permission a directory such as /tmp or a home directory.
    let marker = state.join(".paddock-state");
    if let Ok(mut entries) = std::fs::read_dir(state) {
        if entries.next().is_some() && !marker.exists() {
            return Err(RuntimeError::InvalidConfig(format!(
                "state directory {} is not empty and was not created by paddock; choose a new or empty directory",
                state.display()
            )));
        }
    }
    // Marked first: a start killed anywhere after this leaves a directory the next start recognises
    // (everything below is idempotent), never one it refuses as someone else's.
    if !marker.exists() {
        std::fs::write(&marker, "paddock state directory\n").map_err(|source| RuntimeError::State {
            what: "write",
            path: marker.clone(),
            source,
        })?;
    }
    for dir in [state.clone(), state.join("run")] {
        let err = |what: &'static str| {
            let path = dir.clone();
            move |source| RuntimeError::State { what, path, source }
        };
        std::fs::create_dir_all(&dir).map_err(err("create"))?;
        std::os::unix::fs::chown(&dir, None, Some(config.ids.host_gid(0))).map_err(err("chown"))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o710)).map_err(err("chmod"))?;
    }
    crate::fault::point("state.run_made");
    run_mount::mount_if_needed(state, config.ids.host_gid(0), sandboxes_live)?;
    Ok(())
}

/// Creates directory `dir` (and its parents) if missing, and holds an exclusive `flock` on it until
/// the returned descriptor is dropped. A lock only: nothing in the directory is touched.
fn lock_directory(dir: &Path) -> Result<std::os::fd::OwnedFd, RuntimeError> {
    let err = |what: &'static str| {
        let path = dir.to_owned();
        move |source: std::io::Error| RuntimeError::State { what, path, source }
    };
    std::fs::create_dir_all(dir).map_err(err("create"))?;
    let fd = rustix::fs::open(
        dir,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| err("open")(e.into()))?;
    rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive).map_err(|e| err("lock")(e.into()))?;
    Ok(fd)
}

/// The first existing directory above `path` that other users cannot search (mode without o+x), if
/// any. Sandboxes set themselves up as an unprivileged host uid, which must traverse every one of
/// them; directories that do not exist yet are created searchable, so they do not count.
pub(super) fn unsearchable_ancestor(path: &Path) -> Option<&Path> {
    use std::os::unix::fs::PermissionsExt;
    path.ancestors()
        .skip(1)
        .find(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 == 0))
}

impl SandboxHandle {
    /// The native part of a handle; a handle of another backend is refused.
    pub(crate) fn native(&self) -> Result<&NativeSandbox, RuntimeError> {
        match &self.inner {
            AnyHandle::Native(sb) => Ok(sb),
            #[cfg(feature = "fake")]
            AnyHandle::Fake(_) => Err(foreign_handle()),
        }
    }
}

/// The native part of a handle's private state, taken; a handle of another backend is refused.
pub(crate) fn into_native(inner: AnyHandle) -> Result<NativeSandbox, RuntimeError> {
    match inner {
        AnyHandle::Native(sb) => Ok(sb),
        #[cfg(feature = "fake")]
        AnyHandle::Fake(_) => Err(foreign_handle()),
    }
}

#[cfg(feature = "fake")]
fn foreign_handle() -> RuntimeError {
    RuntimeError::Unsupported("a sandbox of another backend was handed to the native backend".into())
}
