//! Spare volumes: writable snapshots of the host template made before a sandbox needs one, so that
//! a creation from the template renames a spare into `sandboxes/<id>/volume` instead of waiting for a
//! snapshot's transaction commit (4-5 ms, the largest step of a creation).
//!
//! Layout, under the pool root (mode 0700, never reachable from a sandbox):
//! - `spares/<key>.<random>`: a ready spare, where `<key>` names the template it was made from
//!   (`t<subvolume id>`; a rebuilt template is a new subvolume with a higher id, so spares of an
//!   older one are never claimed, and gc deletes them).
//! - `spares/.making/<name>/volume`: a spare being made, in a directory of its own (the snapshot
//!   ioctl holds its destination directory's lock through the commit, so claims from `spares/` do
//!   not wait for it), owned by the process holding the `flock` on `spares/.making/<name>.lock`.
//!   The lock is taken before the directory exists, and names are random: a directory whose lock
//!   is free was left by a process that died, and [`collect`] deletes it.
//!
//! A spare is made from the template only, by paddock, and is claimed by one rename
//! (`RENAME_NOREPLACE`, atomic: two claims never get the same spare); a sandbox's volume is never
//! given back as a spare. So a sandbox from a spare starts from exactly what a snapshot of the
//! template made at claim time would hold.
//!
//! This module does not decide when spares are made (the caller does, off its creation's path) and
//! does not set disk limits (the claimer does, as for a snapshot).

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use paddock_sys::btrfs;
use rustix::fs::{RenameFlags, CWD};

use super::{delete_with_qgroup, pool_err, private_dir};
use crate::native::lock::StateLock;
use crate::RuntimeError;

/// The directory of spares, under the pool root.
const DIR: &str = "spares";
/// Spares being made, under [`DIR`].
const MAKING: &str = ".making";
/// The subvolume's name inside its making directory.
const VOLUME: &str = "volume";
/// Most ready spares of the current template kept: [`make`] makes none past it, [`collect`]
/// deletes extras (concurrent makers can overshoot by a few).
pub(crate) const MAX_SPARES: usize = 2;

/// What [`make`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Made {
    /// A spare was made.
    One,
    /// Enough spares are ready; none was made.
    Enough,
}

/// Makes spare volumes of one pool's host template; cheap to clone and `Send`, so a caller can make
/// one on a thread of its own while its sandbox runs.
#[derive(Debug, Clone)]
pub struct SpareMaker {
    pub(super) root: PathBuf,
    pub(super) template: PathBuf,
}

impl SpareMaker {
    /// Makes one spare unless [`MAX_SPARES`] are ready (a btrfs snapshot: one transaction commit).
    pub fn make(&self) -> Result<Made, RuntimeError> {
        make(&self.root, &self.template)
    }
}

/// The key of the template at `template`: spares named with another are not its.
pub(super) fn key(template: &Path) -> Result<String, RuntimeError> {
    let id = btrfs::subvolume_id(template).map_err(pool_err("inspect", template))?;
    Ok(format!("t{id}"))
}

/// Whether the spare `name` was made from the template keyed `key` (`<key>.<random>`).
fn keyed(name: &str, key: &str) -> bool {
    name.strip_prefix(key).is_some_and(|rest| rest.starts_with('.'))
}

/// The names of the ready spares in `dir` made from the template keyed `key`.
fn ready(dir: &Path, key: &str) -> Vec<String> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| keyed(n, key))
        .collect()
}

/// Moves a ready spare of `template` to `target` (a volume path that must not exist); whether one
/// was there to take. An error leaves no spare half-moved: the rename is atomic.
pub(super) fn claim(root: &Path, template: &Path, target: &Path) -> Result<bool, RuntimeError> {
    let dir = root.join(DIR);
    if !dir.exists() {
        return Ok(false);
    }
    let key = key(template)?;
    for name in ready(&dir, &key) {
        match rustix::fs::renameat_with(CWD, dir.join(&name), CWD, target, RenameFlags::NOREPLACE) {
            Ok(()) => return Ok(true),
            // Claimed (or collected) by another process since the listing.
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(pool_err("move a spare volume into place at", target)(e.into())),
        }
    }
    Ok(false)
}

/// Makes one spare of the template at `template` unless [`MAX_SPARES`] are ready.
fn make(root: &Path, template: &Path) -> Result<Made, RuntimeError> {
    let dir = private_dir(&root.join(DIR))?;
    let key = key(template)?;
    if ready(&dir, &key).len() >= MAX_SPARES {
        return Ok(Made::Enough);
    }
    let making = private_dir(&dir.join(MAKING))?;
    let name = format!("{key}.{:016x}", rand::random::<u64>());
    let lock_path = making.join(format!("{name}.lock"));
    // Before the directory exists: gc takes a directory whose lock is free for abandoned.
    let lock = StateLock::acquire(&lock_path)?;
    let own = making.join(&name);
    let made = fs::DirBuilder::new()
        .mode(0o700)
        .create(&own)
        .map_err(pool_err("create", &own))
        .and_then(|()| {
            btrfs::snapshot_subvolume(template, &own, VOLUME, false)
                .map_err(pool_err("snapshot a spare volume into", &own))
        })
        .and_then(|()| {
            crate::fault::point("spare.made");
            let target = dir.join(&name);
            rustix::fs::renameat_with(CWD, own.join(VOLUME), CWD, &target, RenameFlags::NOREPLACE)
                .map_err(|e| pool_err("move a spare volume into", &target)(e.into()))
        });
    remove_making(root, &making, &name);
    drop(lock);
    made.map(|()| Made::One)
}

/// Removes `making/<name>` (its subvolume if it is still there) and its lock file; the caller holds
/// the lock.
fn remove_making(root: &Path, making: &Path, name: &str) {
    let own = making.join(name);
    if fs::symlink_metadata(own.join(VOLUME)).is_ok() {
        delete_with_qgroup(root, &own, VOLUME);
    }
    match fs::remove_dir(&own) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(dir = %own.display(), error = %e, "cannot remove a spare's making directory; gc will")
        }
    }
    let _ = fs::remove_file(making.join(format!("{name}.lock")));
}

/// gc: deletes the spares of any other template than the one at `template` (all of them when it is
/// missing), ready ones past [`MAX_SPARES`], and what makers that died left in `.making/`.
pub(super) fn collect(root: &Path, template: &Path) {
    let dir = root.join(DIR);
    let Ok(entries) = fs::read_dir(&dir) else {
        return;
    };
    let current = key(template).ok();
    let mut kept = 0;
    for entry in entries.flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name == MAKING {
            continue;
        }
        let ours = current.as_deref().is_some_and(|k| keyed(&name, k));
        if ours && kept < MAX_SPARES {
            kept += 1;
            continue;
        }
        // A claim may move it first: then there is nothing to delete here.
        delete_with_qgroup(root, &dir, &name);
    }
    let making = dir.join(MAKING);
    for entry in fs::read_dir(&making).into_iter().flatten().flatten() {
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.ends_with(".lock") || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if let Ok(Some(_lock)) = StateLock::try_acquire(&making.join(format!("{name}.lock"))) {
            remove_making(root, &making, &name);
        }
    }
}

/// Deletes the spares being made and `.making/` itself (the pool is being destroyed; the ready
/// spares are subvolumes of `spares/` like any other of the pool's).
pub(super) fn delete_making(root: &Path) -> Result<(), RuntimeError> {
    let making = root.join(DIR).join(MAKING);
    for entry in fs::read_dir(&making).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) && fs::symlink_metadata(path.join(VOLUME)).is_ok() {
            btrfs::delete_subvolume(&path, VOLUME).map_err(pool_err("delete subvolume", &path))?;
        }
    }
    match fs::remove_dir_all(&making) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(pool_err("remove", &making)(e)),
        _ => Ok(()),
    }
}
