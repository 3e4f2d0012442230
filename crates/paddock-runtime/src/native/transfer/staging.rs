//! Where an import is unpacked: a fresh subvolume `<pool>/imports/<sn-id>`, owned by the process
//! holding the `flock` on `<pool>/imports/<sn-id>.lock`.
//!
//! It becomes a snapshot by being renamed to `<pool>/snapshots/<sn-id>` (`renameat2(RENAME_NOREPLACE)`:
//! it appears whole, or not at all) and made read-only, before the caller records it. On any failure, and when
//! dropped unfinished, it is deleted. A process that dies mid-import leaves it with a free lock, and
//! [`collect_abandoned_imports`] (part of the backend's gc) deletes it.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use paddock_sys::btrfs;
use paddock_types::SnapshotId;
use rustix::fs::{Mode, OFlags, RenameFlags};

use crate::native::lock::StateLock;
use crate::native::StoragePool;
use crate::RuntimeError;

fn pool_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Pool {
        what,
        path: path.to_owned(),
        source,
    }
}

/// The directory of staging subvolumes.
fn imports_dir(pool: &StoragePool) -> PathBuf {
    pool.root().join("imports")
}

/// A staging subvolume being filled; deleted on drop unless [`ImportStaging::finish`] succeeded.
#[derive(Debug)]
pub(crate) struct ImportStaging {
    dir: PathBuf,
    name: String,
    path: PathBuf,
    lock_path: PathBuf,
    lock: Option<StateLock>,
    done: bool,
}

impl ImportStaging {
    /// Creates `imports/<snapshot>` with a disk limit of `max_bytes` (what the import may write), and
    /// takes its lock.
    pub(crate) fn begin(
        pool: &StoragePool,
        snapshot: &SnapshotId,
        max_bytes: u64,
    ) -> Result<Self, RuntimeError> {
        let dir = imports_dir(pool);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(pool_err("create", &dir))?;
        let name = snapshot.to_string();
        let lock_path = dir.join(format!("{name}.lock"));
        let lock = StateLock::acquire(&lock_path)?;
        let path = dir.join(&name);
        btrfs::create_subvolume(&dir, &name).map_err(pool_err("create subvolume", &path))?;
        let staging = Self {
            dir,
            name,
            path,
            lock_path,
            lock: Some(lock),
            done: false,
        };
        let limit = btrfs::QgroupLimit {
            max_exclusive: None,
            max_referenced: Some(max_bytes),
        };
        btrfs::set_qgroup_limit(&staging.path, limit)
            .map_err(pool_err("set the disk limit on", &staging.path))?;
        Ok(staging)
    }

    /// The staging subvolume's root.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Commits the unpacked files to disk, moves the subvolume to `snapshots/<snapshot>` (refused if
    /// that exists) and makes it read-only. (In that order: btrfs refuses to move a read-only
    /// subvolume to another directory, whose `..` would change. Until the caller records it, the
    /// snapshot is storage without a record, which startup gc removes.)
    pub(crate) fn finish(mut self, pool: &StoragePool, snapshot: &SnapshotId) -> Result<(), RuntimeError> {
        // A snapshot whose record exists must not lose files to a crash before the next commit.
        btrfs::sync(&self.path).map_err(pool_err("sync", &self.path))?;
        let snapshots = pool.root().join("snapshots");
        let open = |p: &Path| {
            rustix::fs::open(
                p,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| pool_err("open", p)(e.into()))
        };
        let from = open(&self.dir)?;
        let to = open(&snapshots)?;
        let target = pool.snapshot_path(snapshot);
        rustix::fs::renameat_with(
            &from,
            self.name.as_str(),
            &to,
            snapshot.as_str(),
            RenameFlags::NOREPLACE,
        )
        .map_err(|e| pool_err("move into place", &target)(e.into()))?;
        // From here the subvolume is `snapshots/<snapshot>`: deleted there if this fails.
        self.dir = snapshots;
        self.name = snapshot.to_string();
        self.path = target;
        btrfs::set_subvolume_readonly(&self.path, true).map_err(pool_err("make read-only", &self.path))?;
        self.done = true;
        let _ = fs::remove_file(&self.lock_path);
        self.lock.take();
        Ok(())
    }
}

impl Drop for ImportStaging {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = delete(&self.dir, &self.name) {
            // Left for gc, which finds it unlocked once this process no longer holds the lock.
            tracing::warn!(staging = %self.path.display(), error = %e, "import staging not removed");
            return;
        }
        let _ = fs::remove_file(&self.lock_path);
    }
}

/// Deletes the subvolume `dir/name` and its quota group; a missing one is fine.
fn delete(dir: &Path, name: &str) -> io::Result<()> {
    let path = dir.join(name);
    let id = match btrfs::subvolume_id(&path) {
        Ok(id) => id,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    btrfs::delete_subvolume(dir, name)?;
    if let Some(root) = dir.parent() {
        // As for volumes: the kernel drops the qgroup once the extents are cleaned; gc retries.
        let _ = btrfs::remove_qgroup(root, id);
    }
    Ok(())
}

/// Deletes the staging subvolumes of imports whose process is gone (their lock is free); returns
/// their names. A lock file without a subvolume is left alone: its import may be about to create it.
pub(crate) fn collect_abandoned_imports(pool: &StoragePool) -> Vec<String> {
    let dir = imports_dir(pool);
    let Ok(rd) = fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in rd.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if name.ends_with(".lock") || !entry.path().is_dir() {
            continue;
        }
        let lock_path = dir.join(format!("{name}.lock"));
        match StateLock::try_acquire(&lock_path) {
            Ok(Some(_held)) => {
                tracing::info!(staging = %name, "removing the staging subvolume of an abandoned import");
                match delete(&dir, &name) {
                    Ok(()) => {
                        let _ = fs::remove_file(&lock_path);
                        removed.push(name);
                    }
                    Err(e) => tracing::warn!(staging = %name, error = %e, "abandoned import not removed"),
                }
            }
            Ok(None) => {} // an import in progress
            Err(e) => tracing::warn!(staging = %name, error = %e, "cannot check an import's lock"),
        }
    }
    removed
}

/// Deletes every staging subvolume, whoever owns it (for `pool destroy`).
pub(crate) fn delete_all_imports(pool_root: &Path) -> io::Result<()> {
    let dir = pool_root.join("imports");
    for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.ends_with(".lock") {
            let _ = fs::remove_file(entry.path());
        } else {
            btrfs::delete_subvolume(&dir, name)?;
        }
    }
    Ok(())
}
