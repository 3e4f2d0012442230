//! What an older paddock's creates left: it made each volume in `incoming/<name>/volume` and renamed
//! it into `sandboxes/<name>`, so a crash could leave `incoming/<name>/` behind. It belongs to sandbox
//! `<name>` like its volume does: whatever removes that sandbox's volume (its teardown, gc's reclaim)
//! removes it too ([`remove_leftovers`]), and gc lists these names among the subvolumes it checks for
//! owners. Nothing is made here any more (`place.rs` makes volumes where they stay).
//! This module does not decide whose a name is: callers hold the sandbox's lock.

use std::fs;
use std::io;
use std::path::Path;

use super::{delete_with_qgroup, pool_err};
use crate::RuntimeError;

/// The directory of volumes an older paddock was making, under the pool root.
pub(super) const DIR: &str = "incoming";
/// The subvolume's name inside its own directory.
const VOLUME: &str = "volume";

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
    super::names_in(&root.join(DIR))
}
