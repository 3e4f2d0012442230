//! Where untrusted content is unpacked before it becomes a pool object: a subvolume
//! `<pool>/<area>/<name>` (an import's `imports/<sn-id>`, a template build's `builds/<tp-id>`), owned
//! by the process holding the `flock` on `<pool>/<area>/<name>.lock`.
//!
//! It becomes the object by being renamed into its place (`renameat2(RENAME_NOREPLACE)`: it appears
//! whole, or not at all) and made read-only, before the caller records it. On any failure, and when
//! dropped unfinished, it is deleted. A process that dies meanwhile leaves it with a free lock, and
//! [`collect_abandoned`] (part of the backend's gc) deletes it.

use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use paddock_sys::btrfs;
use rustix::fs::{Mode, OFlags, RenameFlags};

use crate::native::lock::StateLock;
use crate::RuntimeError;

fn pool_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    move |source| RuntimeError::Pool {
        what,
        path: path.to_owned(),
        source,
    }
}

/// Where staging subvolumes of one kind live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Area {
    /// Snapshot imports (`transfer/`), becoming `snapshots/<sn-id>`.
    Imports,
    /// Template builds (`template/`), becoming `images/<tp-id>`.
    Builds,
}

impl Area {
    fn dir(self) -> &'static str {
        match self {
            Self::Imports => "imports",
            Self::Builds => "builds",
        }
    }

    fn destination(self) -> &'static str {
        match self {
            Self::Imports => "snapshots",
            Self::Builds => "images",
        }
    }
}

/// The directory of staging subvolumes.
fn area_dir(pool_root: &Path, area: Area) -> PathBuf {
    pool_root.join(area.dir())
}

/// A staging subvolume being filled; deleted on drop unless [`Staging::finish`] succeeded.
#[derive(Debug)]
pub(crate) struct Staging {
    area: Area,
    dir: PathBuf,
    name: String,
    path: PathBuf,
    lock_path: PathBuf,
    lock: Option<StateLock>,
    done: bool,
}

impl Staging {
    /// Creates `<area>/<name>`, empty or (with `seed`) as a writable snapshot of the subvolume
    /// `seed`, with a disk limit of `max_bytes` (what may be written into it), and takes its lock.
    pub(crate) fn begin(
        pool_root: &Path,
        area: Area,
        name: &str,
        seed: Option<&Path>,
        max_bytes: u64,
    ) -> Result<Self, RuntimeError> {
        let dir = area_dir(pool_root, area);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(pool_err("create", &dir))?;
        let name = name.to_owned();
        let lock_path = dir.join(format!("{name}.lock"));
        let lock = StateLock::acquire(&lock_path)?;
        let path = dir.join(&name);
        match seed {
            None => btrfs::create_subvolume(&dir, &name).map_err(pool_err("create subvolume", &path))?,
            Some(seed) => btrfs::snapshot_subvolume(seed, &dir, &name, false)
                .map_err(pool_err("snapshot a staging subvolume into", &path))?,
        }
        let staging = Self {
            area,
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

    /// Commits the unpacked files to disk, moves the subvolume to its destination (`snapshots/` or
    /// `images/`, under its own name; refused if that exists) and makes it read-only. (In that
    /// order: btrfs refuses to move a read-only subvolume to another directory, whose `..` would
    /// change. Until the caller records it, the object is storage without a record, which startup
    /// gc removes.)
    pub(crate) fn finish(mut self) -> Result<PathBuf, RuntimeError> {
        // An object whose record exists must not lose files to a crash before the next commit.
        btrfs::sync(&self.path).map_err(pool_err("sync", &self.path))?;
        let destination = self.dir.with_file_name(self.area.destination());
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&destination)
            .map_err(pool_err("create", &destination))?;
        let open = |p: &Path| {
            rustix::fs::open(
                p,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| pool_err("open", p)(e.into()))
        };
        let from = open(&self.dir)?;
        let to = open(&destination)?;
        let target = destination.join(&self.name);
        rustix::fs::renameat_with(
            &from,
            self.name.as_str(),
            &to,
            self.name.as_str(),
            RenameFlags::NOREPLACE,
        )
        .map_err(|e| pool_err("move into place", &target)(e.into()))?;
        // From here the subvolume is in its place: deleted there if this fails.
        self.dir = destination;
        self.path = target;
        btrfs::set_subvolume_readonly(&self.path, true).map_err(pool_err("make read-only", &self.path))?;
        self.done = true;
        let _ = fs::remove_file(&self.lock_path);
        self.lock.take();
        Ok(self.path.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Err(e) = delete(&self.dir, &self.name) {
            // Left for gc, which finds it unlocked once this process no longer holds the lock.
            tracing::warn!(staging = %self.path.display(), error = %e, "staging subvolume not removed");
            return;
        }
        let _ = fs::remove_file(&self.lock_path);
    }
}

/// Deletes the subvolume `dir/name` and its quota group; a missing one is fine.
pub(crate) fn delete(dir: &Path, name: &str) -> io::Result<()> {
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

/// Deletes the staging subvolumes of `area` whose process is gone (their lock is free); returns
/// their names. A lock file without a subvolume is left alone: its owner may be about to create it.
pub(crate) fn collect_abandoned(pool_root: &Path, area: Area) -> Vec<String> {
    let dir = area_dir(pool_root, area);
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
                tracing::info!(staging = %name, area = area.dir(), "removing an abandoned staging subvolume");
                match delete(&dir, &name) {
                    Ok(()) => {
                        let _ = fs::remove_file(&lock_path);
                        removed.push(name);
                    }
                    Err(e) => {
                        tracing::warn!(staging = %name, error = %e, "abandoned staging subvolume not removed")
                    }
                }
            }
            Ok(None) => {} // in progress
            Err(e) => tracing::warn!(staging = %name, error = %e, "cannot check a staging lock"),
        }
    }
    removed
}

/// Deletes every staging subvolume of `area`, whoever owns it (for `pool destroy`).
pub(crate) fn delete_all(pool_root: &Path, area: Area) -> io::Result<()> {
    let dir = area_dir(pool_root, area);
    for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // Locks and a build's claim file (`template/cache.rs`) are files; the rest subvolumes.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            btrfs::delete_subvolume(&dir, name)?;
        } else {
            let _ = fs::remove_file(entry.path());
        }
    }
    Ok(())
}
