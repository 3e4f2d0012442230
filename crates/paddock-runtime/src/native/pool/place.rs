//! Where a sandbox's volume lives: the subvolume `sandboxes/<id>/volume`, in a directory of its own.
//!
//! Why a directory of its own: the btrfs ioctls that make and delete a subvolume (snapshot, destroy)
//! hold their parent directory's lock until they are done, waits for the running transaction commit
//! included (3-5 ms, longer under load). With every volume straight in `sandboxes/`, one sandbox's
//! delete held up every other create and delete of the pool; and a volume made elsewhere and renamed
//! into `sandboxes/` waited for that lock holding the file system's rename mutex, so every
//! cross-directory rename of the pool waited too. With `sandboxes/<id>/` its own, concurrent creates
//! and destroys share commits and wait for no one's directory; `sandboxes/` itself only sees a
//! `mkdir` and an `rmdir` per sandbox, which commit nothing.
//!
//! `sandboxes/<id>/` is the host's: root's, of the sandbox root group, mode 0710 like `sandboxes/`
//! (the sandbox's init builds its root as the sandbox's root user and must traverse it; no other host
//! user can). A sandbox never sees it, only the volume inside.
//!
//! Volumes made by an older paddock are the subvolume `sandboxes/<id>` itself. They are still read
//! where they are ([`volume_path`] tells the layouts apart by the directory's inode: a subvolume's
//! root is inode 256, a plain directory never is), and go the way they came: a stop, a rollback or a
//! delete takes them out of `sandboxes/`, and what is made again for the sandbox has the new layout.
//! Likewise `incoming/<id>/`, where an older paddock made volumes before renaming them into place, is
//! only ever cleaned (`incoming.rs`).
//!
//! A crash leaves at most an empty `sandboxes/<id>/` (made, not yet filled; or emptied, not yet
//! removed): it belongs to sandbox `<id>` like its volume does, so whatever removes that sandbox's
//! volume removes it, and a create of the name uses it. This module does not decide whose a name is:
//! callers hold the sandbox's lock.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use paddock_sys::btrfs;
use paddock_types::ByteSize;
use rustix::fs::{RenameFlags, CWD};

use super::pool_err;
use crate::native::users::IdRange;
use crate::RuntimeError;

/// The directory of sandboxes' volumes, under the pool root.
pub(super) const DIR: &str = "sandboxes";
/// The subvolume's name inside its sandbox's directory.
const VOLUME: &str = "volume";
/// The inode number of every btrfs subvolume's root directory (`BTRFS_FIRST_FREE_OBJECTID`).
const SUBVOLUME_ROOT_INODE: u64 = 256;

/// `sandboxes/<id>`: the volume's directory (or an older paddock's volume).
fn entry(root: &Path, id: &str) -> PathBuf {
    root.join(DIR).join(id)
}

/// Whether `path` is a subvolume's root, not followed if a symlink.
fn is_subvolume(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.is_dir() && m.ino() == SUBVOLUME_ROOT_INODE)
}

/// The path of sandbox `id`'s volume: `sandboxes/<id>/volume`, or `sandboxes/<id>` for a volume an
/// older paddock made. Where a volume made now goes if there is none ([`fresh_path`]).
pub(super) fn volume_path(root: &Path, id: &str) -> PathBuf {
    let entry = entry(root, id);
    if is_subvolume(&entry) {
        entry
    } else {
        entry.join(VOLUME)
    }
}

/// Where a volume made now for sandbox `id` goes, whatever is there now.
pub(super) fn fresh_path(root: &Path, id: &str) -> PathBuf {
    entry(root, id).join(VOLUME)
}

/// Makes `sandboxes/<id>/` (or takes an empty one a crash left) for a volume about to be put there;
/// returns the volume's path. Refused if sandbox `id` has a volume already, of either layout: a
/// volume is never replaced.
fn make_dir(root: &Path, ids: IdRange, id: &str) -> Result<PathBuf, RuntimeError> {
    let dir = entry(root, id);
    match fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(&dir).map_err(pool_err("inspect", &dir))?;
            let taken = !meta.is_dir()
                || meta.ino() == SUBVOLUME_ROOT_INODE
                || fs::symlink_metadata(dir.join(VOLUME)).is_ok();
            if taken {
                return Err(pool_err("make a volume at", &dir)(io::Error::from(
                    io::ErrorKind::AlreadyExists,
                )));
            }
        }
        Err(e) => return Err(pool_err("create", &dir)(e)),
    }
    super::searchable_by_sandbox_root(&dir, ids)?;
    crate::fault::point("volume.dir_made");
    Ok(dir.join(VOLUME))
}

/// Removes `sandboxes/<id>/` if it is an empty directory (a new layout's, its volume gone); anything
/// else there is left as it is.
pub(super) fn remove_empty_dir(root: &Path, id: &str) -> Result<(), RuntimeError> {
    let dir = entry(root, id);
    match fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() && m.ino() != SUBVOLUME_ROOT_INODE => {}
        _ => return Ok(()),
    }
    match fs::remove_dir(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(pool_err("remove", &dir)(e)),
    }
}

/// Makes sandbox `id`'s volume: its directory, then `make` with the volume's path, which puts a
/// subvolume there ([`snapshot_to`], [`rename_to`], a spare's claim). Refused if `id` has a volume
/// already; if `make` fails, nothing is left behind. Returns the volume's path.
pub(super) fn make(
    root: &Path,
    ids: IdRange,
    id: &str,
    make: impl FnOnce(&Path) -> Result<(), RuntimeError>,
) -> Result<PathBuf, RuntimeError> {
    let volume = make_dir(root, ids, id)?;
    if let Err(e) = make(&volume) {
        if let Err(cleanup) = remove_empty_dir(root, id) {
            tracing::warn!(sandbox_id = id, error = %cleanup, "cannot remove an empty volume directory; gc will");
        }
        return Err(e);
    }
    Ok(volume)
}

/// Snapshots the subvolume `source` (writable) as `volume`, a path [`make`] gave, with `disk` as its
/// limit from the start (see `btrfs::snapshot_subvolume_limited`); `None`: no limit.
pub(super) fn snapshot_to(source: &Path, volume: &Path, disk: Option<ByteSize>) -> Result<(), RuntimeError> {
    let parent = volume.parent().unwrap_or(volume);
    let made = match disk {
        Some(_) => btrfs::snapshot_subvolume_limited(source, parent, VOLUME, disk_limit(disk)),
        None => btrfs::snapshot_subvolume(source, parent, VOLUME, false),
    };
    made.map_err(pool_err("snapshot a volume into", volume))
}

/// A sandbox volume's quota-group limit for disk size `disk`: referenced bytes only (`None`: none).
pub(super) fn disk_limit(disk: Option<ByteSize>) -> btrfs::QgroupLimit {
    btrfs::QgroupLimit {
        max_exclusive: None,
        max_referenced: disk.map(ByteSize::as_u64),
    }
}

/// Renames the subvolume `from` to `volume`, a path [`make`] gave (never over anything).
pub(super) fn rename_to(from: &Path, volume: &Path, what: &'static str) -> Result<(), RuntimeError> {
    rustix::fs::renameat_with(CWD, from, CWD, volume, RenameFlags::NOREPLACE)
        .map_err(|e| pool_err(what, from)(e.into()))
}

/// Moves sandbox `id`'s volume out of its place, to `to` (one rename), then removes its directory;
/// false if it has none. A crash in between leaves an empty directory (see the module docs).
pub(super) fn take_out(root: &Path, id: &str, to: &Path, what: &'static str) -> Result<bool, RuntimeError> {
    let path = volume_path(root, id);
    match fs::symlink_metadata(&path) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            remove_empty_dir(root, id)?;
            return Ok(false);
        }
        Err(e) => return Err(pool_err("inspect", &path)(e)),
    }
    rustix::fs::renameat_with(CWD, &path, CWD, to, RenameFlags::NOREPLACE)
        .map_err(|e| pool_err(what, &path)(e.into()))?;
    remove_empty_dir(root, id)?;
    Ok(true)
}

/// Deletes sandbox `id`'s volume, of either layout, and its directory; the subvolume's id if there
/// was one (for its qgroup).
pub(super) fn delete(root: &Path, id: &str) -> Result<Option<u64>, RuntimeError> {
    let legacy = entry(root, id);
    let (parent, name) = if is_subvolume(&legacy) {
        (root.join(DIR), id)
    } else {
        (legacy, VOLUME)
    };
    let path = parent.join(name);
    let deleted = match fs::symlink_metadata(&path) {
        Ok(_) => {
            let subvol_id = btrfs::subvolume_id(&path).ok();
            match btrfs::delete_subvolume(&parent, name) {
                Ok(()) => subvol_id,
                // Deleted meanwhile (a retire's thread).
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(pool_err("delete subvolume", &path)(e)),
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(pool_err("inspect", &path)(e)),
    };
    remove_empty_dir(root, id)?;
    Ok(deleted)
}

/// Whether anything of sandbox `id` is in `sandboxes/` (its volume, or its empty directory).
pub(super) fn holds(root: &Path, id: &str) -> bool {
    fs::symlink_metadata(entry(root, id)).is_ok()
}

/// The names in `sandboxes/`.
pub(super) fn list(root: &Path) -> Vec<String> {
    super::names_in(&root.join(DIR))
}
