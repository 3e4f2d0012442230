//! Sandboxes made ahead (`paddock run --keep-ready`): a whole sandbox (run directory, cgroups,
//! volume, namespaces, its agent waiting as PID 1), made by a short-lived process a run starts as it
//! ends (which then tears that run's sandbox down), and taken by the next run shaped like it, which
//! then pays neither the setup shim nor the volume nor the cgroups on its path.
//!
//! A ready sandbox is `run/<id>/` with `ready.json` in it ([`ReadyRecord`]: what it was made for and
//! with). Nobody holds its lock. What keeps it from gc's "lock free: abandoned" rule is that record,
//! a live init ([`NativeBackend::live_init`]: the recorded pid, start time and cgroup) and a record
//! that still matches this host (the same agent and setup binaries, host template and parent cgroup);
//! gc reclaims one that fails any of these.
//!
//! Claiming one is taking its lock, checking the record and the init, and removing the record, in
//! that order, so two claims never share one, and a claimer that dies after the removal leaves an
//! ordinary abandoned sandbox to gc. Its init is not the claimer's child (its maker exited), so no
//! parent-death signal ties it to the claimer: the run holds it through its agent connection instead
//! (`Request::Hold`), and the agent ends the sandbox when that connection closes.
//!
//! A ready sandbox is made only from the host template with no mounts, volumes or network, for one
//! set of limits and one default user (`ready_eligible`); limits live in its cgroups and qgroup, so a
//! run asking for others does not take it. It is never a recycled sandbox: each is made fresh and
//! used once, so nothing of one run reaches another.
//!
//! This module does not decide when a sandbox is made ahead or start the process that makes it (the
//! `paddock run` front does), and does not keep more than [`MAX_READY`]: makers are serialised by
//! [`MakerLock`], which `paddock pool destroy` takes too, so no sandbox is made in a pool being
//! destroyed.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use paddock_sys::fs_in_root::{Root, Symlinks};
use paddock_types::{Limits, RootfsSpec, SandboxId, SandboxSpec, VolumeSource};
use serde::{Deserialize, Serialize};

use super::lock::StateLock;
use super::sandbox::{state_err, BootSpec, NativeSandbox};
use super::NativeBackend;
use crate::{RuntimeError, SandboxHandle};

/// Most sandboxes kept ready per state directory, of all shapes.
pub const MAX_READY: usize = 4;

/// The record in a ready sandbox's run directory.
const RECORD: &str = "ready.json";

/// Most bytes of a record read.
const MAX_RECORD: u64 = 64 * 1024;

/// Whether a sandbox of `spec` may be made ahead: one from the host template, with nothing of the
/// host or of other sandboxes in it (no mounts, volumes or network), fresh (not a snapshot's or a
/// stopped sandbox's files).
pub fn ready_eligible(spec: &SandboxSpec) -> bool {
    spec.rootfs == RootfsSpec::Host
        && spec.mounts.is_empty()
        && spec.volumes.is_empty()
        && spec.network.is_none()
        && spec.volume == VolumeSource::Template
}

/// What a ready sandbox was made for and with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadyRecord {
    /// How its init was started (a run asking for anything else does not take it).
    boot: BootSpec,
    /// Its cgroups' and qgroup's limits.
    limits: Limits,
    made_with: MadeWith,
}

/// What a sandbox was made with on this host: one made with anything else is stale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MadeWith {
    agent: FileStamp,
    setup: FileStamp,
    /// The host template's key (its subvolume id).
    template: String,
    cgroup_parent: String,
}

/// A file's identity and version: replaced or rewritten, it differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl FileStamp {
    fn of(path: &Path) -> Result<Self, RuntimeError> {
        let m = fs::metadata(path).map_err(state_err("inspect", path))?;
        Ok(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
        })
    }
}

impl ReadyRecord {
    fn write(&self, run_dir: &Path) -> Result<(), RuntimeError> {
        let staging = run_dir.join(".ready.json.new");
        let path = run_dir.join(RECORD);
        let json =
            serde_json::to_vec(self).map_err(|e| state_err("encode", &path)(std::io::Error::other(e)))?;
        fs::write(&staging, json).map_err(state_err("write", &staging))?;
        fs::rename(&staging, &path).map_err(state_err("rename", &staging))
    }

    /// The record in `run_dir`, if there is a readable one (never through a symlink, at most
    /// [`MAX_RECORD`] bytes).
    fn read(run_dir: &Path) -> Option<Self> {
        let bytes = Root::open(run_dir)
            .and_then(|r| r.read_regular(Path::new(RECORD), MAX_RECORD, Symlinks::Refuse))
            .ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// The lock serialising the makers of ready sandboxes (and `paddock pool destroy`) of one state
/// directory: `<state>/ready.lock`.
#[derive(Debug)]
pub struct MakerLock {
    _lock: StateLock,
}

impl MakerLock {
    fn path(state_dir: &Path) -> PathBuf {
        state_dir.join("ready.lock")
    }

    /// For a maker: the lock if nobody holds it and the state directory's pool is there (mounted,
    /// or on the state directory's own btrfs); `None` otherwise (another maker is at work, a
    /// destroy is under way, or there is no pool: a maker never makes one).
    pub fn for_maker(state_dir: &Path) -> Result<Option<Self>, RuntimeError> {
        if !state_dir.join("run").is_dir() {
            return Ok(None);
        }
        let Some(lock) = StateLock::try_acquire(&Self::path(state_dir))? else {
            return Ok(None);
        };
        let pool = state_dir.join("pool");
        if !paddock_sys::btrfs::is_btrfs(&pool).unwrap_or(false) {
            return Ok(None);
        }
        Ok(Some(Self { _lock: lock }))
    }

    /// Keeps the lock's descriptor open across an exec or a spawn (clears its close-on-exec flag),
    /// for a maker started by this process to hold it from the start ([`Self::inherited`]); returns
    /// its number.
    pub fn keep_across_spawn(&self) -> Result<std::os::fd::RawFd, RuntimeError> {
        use std::os::fd::AsRawFd;
        paddock_sys::exec::keep_across_exec(self._lock.as_fd()).map_err(|source| RuntimeError::State {
            what: "keep a descriptor across exec",
            path: PathBuf::from("ready.lock"),
            source,
        })?;
        Ok(self._lock.as_fd().as_raw_fd())
    }

    /// The lock held through `fd`, inherited from the process that started this maker: refused
    /// unless it is `<state>/ready.lock` itself and held through it.
    pub fn inherited(fd: std::os::fd::RawFd, state_dir: &Path) -> Result<Self, RuntimeError> {
        let path = Self::path(state_dir);
        let fd = paddock_sys::exec::take_inherited_fd(fd).map_err(state_err("inherited lock", &path))?;
        StateLock::inherited(fd, &path).map(|lock| Self { _lock: lock })
    }

    /// For `paddock pool destroy`: waits for a maker at work, then holds the lock.
    pub fn for_destroy(state_dir: &Path) -> Result<Option<Self>, RuntimeError> {
        if !state_dir.is_dir() {
            return Ok(None);
        }
        StateLock::acquire(&Self::path(state_dir)).map(|lock| Some(Self { _lock: lock }))
    }
}

impl NativeBackend {
    /// The record a sandbox made now for `spec` gets.
    fn ready_record(&self, spec: &SandboxSpec) -> Result<ReadyRecord, RuntimeError> {
        Ok(ReadyRecord {
            boot: BootSpec::of(spec, None),
            limits: spec.limits.clone(),
            made_with: self.made_with()?,
        })
    }

    /// What a sandbox made now is made with.
    pub(super) fn made_with(&self) -> Result<MadeWith, RuntimeError> {
        Ok(MadeWith {
            agent: FileStamp::of(&self.config.agent_binary)?,
            setup: FileStamp::of(&self.config.setup_binary)?,
            template: self.pool.template_key()?,
            cgroup_parent: self.config.cgroup_parent.clone(),
        })
    }

    /// The ids of the run directories holding a ready record, with its modification time.
    fn ready_ids(&self) -> Vec<(String, std::time::SystemTime)> {
        let run = self.config.state_dir.join("run");
        fs::read_dir(run)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                if name.starts_with('.') {
                    return None;
                }
                let made = fs::symlink_metadata(e.path().join(RECORD))
                    .ok()?
                    .modified()
                    .ok()?;
                Some((name, made))
            })
            .collect()
    }

    /// Takes a ready sandbox made for `spec` (see the module's documentation), if there is one: its
    /// handle, whose init is not this process's child. `spec`'s id is not used: the sandbox keeps
    /// its own.
    pub fn claim_ready(&self, spec: &SandboxSpec) -> Option<SandboxHandle> {
        if !ready_eligible(spec) {
            return None;
        }
        let wanted = match self.ready_record(spec) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "no ready sandbox: cannot describe this host's");
                return None;
            }
        };
        for (name, _) in self.ready_ids() {
            let run_dir = self.run_dir(&name);
            let Ok(Some(lock)) = StateLock::try_acquire(&run_dir.join("lock")) else {
                continue;
            };
            if ReadyRecord::read(&run_dir).as_ref() != Some(&wanted) {
                // Another shape's, or stale: gc decides.
                continue;
            }
            let Ok(id) = name.parse::<SandboxId>() else {
                continue;
            };
            let cgroup = self.cgroups.sandbox(&name);
            let (record, pidfd) = match self.live_init(&run_dir, &cgroup) {
                Ok(live) => live,
                Err(why) => {
                    tracing::info!(sandbox_id = %name, reason = %why, "reclaiming a ready sandbox that did not survive");
                    if let Err(e) = self.reclaim(&name) {
                        tracing::warn!(sandbox_id = %name, error = %e, "cannot reclaim a dead ready sandbox; gc will retry");
                    }
                    continue;
                }
            };
            // From here it is this process's: a death leaves an abandoned sandbox for gc.
            if let Err(e) = fs::remove_file(run_dir.join(RECORD)) {
                tracing::warn!(sandbox_id = %name, error = %e, "cannot claim a ready sandbox");
                continue;
            }
            crate::fault::point("ready.claimed");
            tracing::debug!(sandbox_id = %name, "claimed a ready sandbox");
            return Some(NativeSandbox::not_a_child(
                id, run_dir, cgroup, record.pid, pidfd, lock,
            ));
        }
        None
    }

    /// Makes one sandbox ahead for runs shaped like `spec` (with an id of its own), unless one is
    /// ready already; to stay within [`MAX_READY`], reclaims the oldest ready sandboxes of other
    /// shapes first. Returns the id of the one made. Needs a backend whose sandboxes outlive their
    /// creator (`die_with_parent: false`) and the [`MakerLock`].
    pub fn make_ready(
        &self,
        spec: &SandboxSpec,
        _lock: &MakerLock,
    ) -> Result<Option<SandboxId>, RuntimeError> {
        if !ready_eligible(spec) {
            return Err(RuntimeError::InvalidSpec(
                "only a sandbox of the host template without mounts, volumes or a network is made ahead"
                    .into(),
            ));
        }
        if self.config.die_with_parent {
            return Err(RuntimeError::Unsupported(
                "a sandbox made ahead must outlive its maker".into(),
            ));
        }
        let record = self.ready_record(spec)?;
        let mut others = Vec::new();
        for (name, made) in self.ready_ids() {
            match ReadyRecord::read(&self.run_dir(&name)) {
                Some(r) if r == record => return Ok(None),
                _ => others.push((made, name)),
            }
        }
        others.sort();
        while others.len() >= MAX_READY {
            let (_, name) = others.remove(0);
            self.reclaim_ready(&name);
        }
        let handle = self.create(spec)?;
        let id = handle.id.clone();
        crate::fault::point("ready.made");
        if let Err(e) = record.write(&handle.native()?.run_dir) {
            if let Err(d) = self.destroy(handle) {
                tracing::warn!(sandbox_id = %id, error = %d, "cannot remove a sandbox made ahead whose record failed");
            }
            return Err(e);
        }
        // Its lock goes with the handle: from now on the record keeps it.
        drop(handle);
        Ok(Some(id))
    }

    /// Reclaims the ready sandbox `name` if nobody holds it (a claim may have taken it meanwhile).
    fn reclaim_ready(&self, name: &str) {
        let run_dir = self.run_dir(name);
        if let Ok(Some(_lock)) = StateLock::try_acquire(&run_dir.join("lock")) {
            if ReadyRecord::read(&run_dir).is_some() {
                tracing::info!(sandbox_id = %name, "reclaiming a ready sandbox");
                if let Err(e) = self.reclaim(name) {
                    tracing::warn!(sandbox_id = %name, error = %e, "cannot reclaim a ready sandbox; gc will retry");
                }
            }
        }
    }

    /// Reclaims every ready sandbox nobody holds (`paddock pool destroy`, with the [`MakerLock`]).
    pub fn drop_ready(&self, _lock: &MakerLock) {
        for (name, _) in self.ready_ids() {
            self.reclaim_ready(&name);
        }
    }

    /// For gc, holding `name`'s lock: whether it is a ready sandbox to keep (its record matches this
    /// host, `made_with`, and its init lives).
    pub(super) fn ready_to_keep(&self, name: &str, made_with: Option<&MadeWith>) -> bool {
        let run_dir = self.run_dir(name);
        let Some(record) = ReadyRecord::read(&run_dir) else {
            return false;
        };
        if made_with != Some(&record.made_with) {
            tracing::info!(sandbox_id = %name, "a ready sandbox is stale");
            return false;
        }
        match self.live_init(&run_dir, &self.cgroups.sandbox(name)) {
            Ok(_) => true,
            Err(why) => {
                tracing::info!(sandbox_id = %name, reason = %why, "a ready sandbox did not survive");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SandboxSpec {
        SandboxSpec {
            id: SandboxId::from_random([1; 8]),
            limits: Limits::default(),
            rootfs: RootfsSpec::Host,
            mounts: Vec::new(),
            workdir: None,
            user: "user".parse().expect("user"),
            env: Vec::new(),
            volume: VolumeSource::Template,
            volumes: Vec::new(),
            network: None,
        }
    }

    #[test]
    fn only_a_fresh_template_sandbox_without_host_parts_is_made_ahead() {
        assert!(ready_eligible(&spec()));
        let mut s = spec();
        s.rootfs = RootfsSpec::Dir {
            path: "/srv/root".into(),
        };
        assert!(!ready_eligible(&s), "a --rootfs directory");
        let mut s = spec();
        s.mounts.push(paddock_types::MountSpec {
            host: "/srv".into(),
            sandbox: "/srv".parse().expect("path"),
            read_only: true,
        });
        assert!(!ready_eligible(&s), "a mount");
        let mut s = spec();
        s.volume = VolumeSource::Stopped;
        assert!(!ready_eligible(&s), "a stopped sandbox's files");
    }

    #[test]
    fn a_record_reads_back_and_a_symlink_or_junk_is_no_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stamp = FileStamp {
            dev: 1,
            ino: 2,
            size: 3,
            mtime: 4,
            mtime_nsec: 5,
        };
        let record = ReadyRecord {
            boot: BootSpec::of(&spec(), None),
            limits: Limits::default(),
            made_with: MadeWith {
                agent: stamp,
                setup: stamp,
                template: "t256".into(),
                cgroup_parent: "paddock".into(),
            },
        };
        record.write(dir.path()).expect("write");
        assert_eq!(ReadyRecord::read(dir.path()), Some(record.clone()));
        assert!(!dir.path().join(".ready.json.new").exists());

        let elsewhere = tempfile::tempdir().expect("tempdir");
        record.write(elsewhere.path()).expect("write");
        fs::remove_file(dir.path().join(RECORD)).expect("remove");
        std::os::unix::fs::symlink(elsewhere.path().join(RECORD), dir.path().join(RECORD)).expect("symlink");
        assert_eq!(
            ReadyRecord::read(dir.path()),
            None,
            "never read through a symlink"
        );

        fs::remove_file(dir.path().join(RECORD)).expect("remove");
        fs::write(dir.path().join(RECORD), b"{\"boot\":").expect("junk");
        assert_eq!(ReadyRecord::read(dir.path()), None);
    }
}
