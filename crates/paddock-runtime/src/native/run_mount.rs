//! `<state>/run` is a tmpfs: it holds only what lives as long as the host is up (each sandbox's lock,
//! agent socket, records of its processes and link, the agent's stderr), and every sandbox creation
//! and teardown makes and removes a dozen inodes there. On a disk file system that churn is costly
//! (an ext4 without a journal scans its recently deleted inodes at each creation: half of
//! `paddock serve`'s CPU and three quarters of the setup shim's in a create-exec-destroy burst), and
//! after a reboot, when no sandbox survives, an empty run directory is also the truth.
//!
//! Mounted by the first backend to open the state directory (under `run.lock`), private, `nosuid`,
//! `nodev`, `noexec`. A run directory an older paddock made on disk that still holds sandboxes is
//! left as it is (mounting over it would hide live sandboxes); it becomes a tmpfs on the first open
//! that finds it empty.
//!
//! A tmpfs is seen only in the mount namespace that mounted it (and those copied from it later). A
//! process sharing the state directory from another namespace (say, a server started in a private
//! one) would see an empty directory on disk, take the other side's sandboxes for orphans and reclaim
//! them. So `<state>/run.mount` records the boot and mount namespace of the mount, and an open that
//! cannot see the tmpfs although it was mounted in this boot in another namespace, while sandboxes
//! have processes, is refused. Pages written there are charged to the memory cgroup of their writer (a
//! sandbox's agent log to that sandbox). This module does not decide what goes in the directory.

use std::fs;
use std::path::Path;

use paddock_sys::mount::{self, MountAttrs};

use super::lock::StateLock;
use super::sandbox::state_err;
use crate::RuntimeError;

/// What the run directory's tmpfs may hold at most: run directories are a few KiB each, and each
/// agent writes at most 256 KiB to its log (`paddock-agent`'s `stderr_log.rs`): room for a thousand
/// full logs.
const SIZE: &str = "256m";
/// At most this many inodes (about 15 per sandbox).
const INODES: u32 = 1 << 20;

fn is_tmpfs(run: &Path) -> Result<bool, RuntimeError> {
    mount::fs_magic(run)
        .map(|m| m == mount::TMPFS_MAGIC)
        .map_err(state_err("inspect", run))
}

/// Whether `run` holds anything.
fn occupied(run: &Path) -> Result<bool, RuntimeError> {
    Ok(fs::read_dir(run)
        .map_err(state_err("read", run))?
        .next()
        .is_some())
}

/// Where the mount is recorded, under the state directory.
const RECORD: &str = "run.mount";

/// This boot and this process's mount namespace, as `run.mount` records them.
fn whereabouts() -> Option<String> {
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let namespace = fs::read_link("/proc/self/ns/mnt").ok()?;
    Some(format!("{} {}", boot.trim(), namespace.display()))
}

/// The mount namespace that mounted the run directory's tmpfs in this boot, when it is not this
/// process's (`here`, from [`whereabouts`]).
fn mounted_elsewhere(state: &Path, here: &str) -> Option<String> {
    let recorded = fs::read_to_string(state.join(RECORD)).ok()?;
    let (boot, namespace) = recorded.trim().split_once(' ')?;
    let (this_boot, this_namespace) = here.split_once(' ')?;
    (boot == this_boot && namespace != this_namespace).then(|| namespace.to_owned())
}

/// Mounts a tmpfs on `<state>/run` (which exists, mode 0710, group `gid`) unless it is one already
/// or holds an older paddock's sandboxes. Refused when it is a tmpfs in another mount namespace and
/// `sandboxes_live()` says some sandbox has processes (module docs).
pub(super) fn mount_if_needed(
    state: &Path,
    gid: u32,
    sandboxes_live: impl Fn() -> bool,
) -> Result<(), RuntimeError> {
    let run = state.join("run");
    if is_tmpfs(&run)? {
        return Ok(());
    }
    let _lock = StateLock::acquire(&state.join("run.lock"))?;
    if is_tmpfs(&run)? {
        return Ok(());
    }
    let here = whereabouts();
    if let Some(namespace) = here.as_deref().and_then(|h| mounted_elsewhere(state, h)) {
        if sandboxes_live() {
            return Err(RuntimeError::InvalidConfig(format!(
                "the run directory {} is a tmpfs in another mount namespace ({namespace}), where \
                 sandboxes are running; run paddock in that mount namespace",
                run.display()
            )));
        }
    }
    if occupied(&run)? {
        tracing::info!(run_dir = %run.display(), "the run directory holds sandboxes of an earlier start; it stays on disk until it is empty");
        return Ok(());
    }
    let attrs = MountAttrs {
        nosuid: true,
        nodev: true,
        noexec: true,
        ..MountAttrs::default()
    };
    let options = format!("mode=0710,uid=0,gid={gid},size={SIZE},nr_inodes={INODES}");
    mount::mount_fs("tmpfs", &run, attrs, &options).map_err(state_err("mount a tmpfs on", &run))?;
    if let Err(e) = mount::make_private(&run) {
        let _ = mount::unmount_detach(&run);
        return Err(state_err("make private", &run)(e));
    }
    if let Some(here) = here {
        let record = state.join(RECORD);
        if let Err(e) = fs::write(&record, format!("{here}\n")) {
            tracing::warn!(record = %record.display(), error = %e, "cannot record where the run directory is mounted");
        }
    }
    Ok(())
}

/// Unmounts `<state>/run`'s tmpfs if it is one and holds nothing (`paddock pool destroy`).
pub(crate) fn unmount_if_empty(state: &Path) -> Result<(), RuntimeError> {
    let run = state.join("run");
    if !run.exists() || !is_tmpfs(&run)? {
        return Ok(());
    }
    if occupied(&run)? {
        return Err(RuntimeError::InvalidConfig(format!(
            "the run directory {} still holds sandboxes; delete them or run `paddock gc` first",
            run.display()
        )));
    }
    mount::unmount_detach(&run).map_err(state_err("unmount", &run))?;
    let _ = fs::remove_file(state.join(RECORD));
    Ok(())
}
