//! How a sandbox's volume is made: snapshotted into a directory of its own, `incoming/<name>/volume`,
//! then renamed into `sandboxes/<name>`.
//!
//! The snapshot ioctl holds its destination directory's lock through the transaction commit it
//! ends with (3-5 ms). Snapshots made straight into `sandboxes/` therefore wait for each other and
//! commit one by one; made each in its own directory, concurrent ones (a fork's copies, many API
//! clients creating at once) join the same commits. The rename into place is no commit, and it
//! uses `RENAME_NOREPLACE`: an existing volume of the name is never replaced.
//!
//! A crash leaves `incoming/<name>/` behind; it belongs to sandbox `<name>` like its volume does, so
//! whatever removes that sandbox's volume (its teardown, gc's reclaim) removes it too
//! ([`remove_leftovers`]), and gc lists these names among the subvolumes it checks for owners.
//! This module does not decide whose a name is: callers hold the sandbox's lock.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

use paddock_sys::btrfs;
use rustix::fs::{RenameFlags, CWD};

use super::{delete_with_qgroup, pool_err, StoragePool};
use crate::RuntimeError;

/// The directory of volumes being made, under the pool root.
const DIR: &str = "incoming";
/// The subvolume's name inside its own directory.
const VOLUME: &str = "volume";

/// Snapshots `source` (writable) as `<root>/sandboxes/<name>`, through `incoming/<name>/`; refused
/// (nothing left behind) if `sandboxes/<name>` exists.
pub(super) fn snapshot_into_place(pool: &StoragePool, source: &Path, name: &str) -> Result<(), RuntimeError> {
    let root = pool.root();
    let dir = pool.private_dir(DIR)?.join(name);
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            // Left by a crashed create of this name, which the caller's lock says is over.
            remove_leftovers(root, name)?;
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(pool_err("create", &dir))?;
        }
        Err(e) => return Err(pool_err("create", &dir)(e)),
    }
    let staged = dir.join(VOLUME);
    if let Err(e) = btrfs::snapshot_subvolume(source, &dir, VOLUME, false) {
        let _ = fs::remove_dir(&dir);
        return Err(pool_err("snapshot a volume into", &staged)(e));
    }
    crate::fault::point("volume.staged");
    let target = root.join("sandboxes").join(name);
    if let Err(e) = rustix::fs::renameat_with(CWD, &staged, CWD, &target, RenameFlags::NOREPLACE) {
        let moved = pool_err("move into place", &target)(e.into());
        if let Err(cleanup) = remove_leftovers(root, name) {
            tracing::warn!(name, error = %cleanup, "cannot remove a volume that did not move into place; gc will");
        }
        return Err(moved);
    }
    if let Err(e) = fs::remove_dir(&dir) {
        // Empty, and removed with the sandbox's volume or by gc.
        tracing::warn!(dir = %dir.display(), error = %e, "cannot remove an empty staging directory");
    }
    Ok(())
}

/// Whether a create of `name` left something in `incoming/`.
pub(super) fn has_leftovers(root: &Path, name: &str) -> bool {
    fs::symlink_metadata(root.join(DIR).join(name)).is_ok()
}

/// Removes what a create of `name` left in `incoming/` (its staged subvolume and directory); nothing
/// there is not an error.
pub(super) fn remove_leftovers(root: &Path, name: &str) -> Result<(), RuntimeError> {
    let dir = root.join(DIR).join(name);
    match fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return fs::remove_file(&dir).map_err(pool_err("remove", &dir)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(pool_err("inspect", &dir)(e)),
    }
    if fs::symlink_metadata(dir.join(VOLUME)).is_ok() {
        delete_with_qgroup(root, &dir, VOLUME);
    }
    match fs::remove_dir(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(pool_err("remove", &dir)(e)),
    }
}

/// The names with something in `incoming/`.
pub(super) fn list(root: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir(root.join(DIR)) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect()
}
