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
//! that finds it empty. Pages written there are charged to the memory cgroup of their writer (a
//! sandbox's agent log to that sandbox). This module does not decide what goes in the directory.

use std::fs;
use std::path::Path;

use paddock_sys::mount::{self, MountAttrs};

use super::lock::StateLock;
use crate::RuntimeError;

/// tmpfs's `statfs` magic (`TMPFS_MAGIC`).
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// What the run directory's tmpfs may hold at most: run directories are a few KiB each, and each
/// agent writes at most 256 KiB to its log (`paddock-agent`'s `stderr_log.rs`): room for a thousand
/// full logs.
const SIZE: &str = "256m";
/// At most this many inodes (about 15 per sandbox).
const INODES: u32 = 1 << 20;

fn state_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::State {
        what,
        path: path.to_owned(),
        source,
    }
}

fn is_tmpfs(run: &Path) -> Result<bool, RuntimeError> {
    mount::fs_magic(run)
        .map(|m| m == TMPFS_MAGIC)
        .map_err(state_err("inspect", run))
}

/// Whether `run` holds anything.
fn occupied(run: &Path) -> Result<bool, RuntimeError> {
    Ok(fs::read_dir(run)
        .map_err(state_err("read", run))?
        .next()
        .is_some())
}

/// Mounts a tmpfs on `<state>/run` (which exists, mode 0710, group `gid`) unless it is one already
/// or holds an older paddock's sandboxes.
pub(super) fn mount_if_needed(state: &Path, gid: u32) -> Result<(), RuntimeError> {
    let run = state.join("run");
    if is_tmpfs(&run)? {
        return Ok(());
    }
    let _lock = StateLock::acquire(&state.join("run.lock"))?;
    if is_tmpfs(&run)? {
        return Ok(());
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
    mount::unmount_detach(&run).map_err(state_err("unmount", &run))
}
