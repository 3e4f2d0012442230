//! One of the two trees of a diff: its root, and the stat-and-check of its entries through the
//! host side's walk primitives (`native/walk/`).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use paddock_types::diff::EntryKind;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Statx, StatxFlags, CWD};
use rustix::io::Errno;

use super::{display_path, join, DiffError};
use crate::native::walk::{open_listed_dir, open_parent, Fs, Opened, Place, PLACE_MASK};

/// The metadata the comparison uses, from `statx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Meta {
    pub(super) file_type: FileType,
    pub(super) perm: u32,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) size: u64,
    pub(super) ctime: (i64, u32),
    pub(super) rdev: (u32, u32),
    /// Inode, device and mount: what the walk primitives check.
    pub(super) place: Place,
}

const STATX_MASK: StatxFlags = PLACE_MASK
    .union(StatxFlags::MODE)
    .union(StatxFlags::UID)
    .union(StatxFlags::GID)
    .union(StatxFlags::SIZE)
    .union(StatxFlags::CTIME);

impl Meta {
    pub(super) fn from_statx(s: &Statx) -> Self {
        let mode = u32::from(s.stx_mode);
        Self {
            file_type: FileType::from_raw_mode(mode),
            perm: mode & 0o7777,
            uid: s.stx_uid,
            gid: s.stx_gid,
            size: s.stx_size,
            ctime: (s.stx_ctime.tv_sec, s.stx_ctime.tv_nsec),
            rdev: (s.stx_rdev_major, s.stx_rdev_minor),
            place: Place::from_statx(s),
        }
    }

    pub(super) fn of_fd(fd: BorrowedFd<'_>) -> rustix::io::Result<Self> {
        rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, STATX_MASK).map(|s| Self::from_statx(&s))
    }

    pub(super) fn kind(&self) -> EntryKind {
        match self.file_type {
            FileType::RegularFile => EntryKind::File,
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        }
    }

    pub(super) fn is_file(&self) -> bool {
        self.file_type == FileType::RegularFile
    }

    /// The size clients care about: files and symlinks only (a directory's is bookkeeping).
    pub(super) fn reported_size(&self) -> Option<u64> {
        matches!(self.file_type, FileType::RegularFile | FileType::Symlink).then_some(self.size)
    }

    /// Same inode, size and change time: unchanged since the snapshot (which preserves all three).
    pub(super) fn unchanged_since(&self, old: &Meta) -> bool {
        self.place.ino == old.place.ino && self.size == old.size && self.ctime == old.ctime
    }
}

/// One of the two trees.
pub(super) struct Tree {
    pub(super) path: PathBuf,
    pub(super) fd: OwnedFd,
    /// The root's file system and mount, which the walk stays on.
    pub(super) fs: Fs,
}

impl Tree {
    /// Opens a root. The root is a host path chosen by the host, so it may contain symlinks.
    pub(super) fn open(path: &Path) -> Result<Self, DiffError> {
        let err = |e: Errno| DiffError::OpenRoot {
            path: path.to_owned(),
            source: e.into(),
        };
        let fd = rustix::fs::openat(
            CWD,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(err)?;
        let root = Place::of_fd(fd.as_fd()).map_err(err)?;
        Ok(Self {
            path: path.to_owned(),
            fd,
            fs: Fs::of(&root),
        })
    }

    /// Whether `m` lies on this tree's file system and mount, and is not itself a mount point.
    pub(super) fn same_fs(&self, m: &Meta) -> bool {
        self.fs.holds(&m.place)
    }

    pub(super) fn err(&self, step: &'static str, rel: &[u8], e: Errno) -> DiffError {
        self.io_err(step, rel, e.into())
    }

    pub(super) fn io_err(&self, step: &'static str, rel: &[u8], source: io::Error) -> DiffError {
        DiffError::Walk {
            step,
            tree: self.path.clone(),
            path: display_path(rel),
            source,
        }
    }

    /// `lstat` of `name` in `dir`; `None` if it vanished.
    pub(super) fn stat(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        rel: &[u8],
    ) -> Result<Option<Meta>, DiffError> {
        match rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, STATX_MASK) {
            Ok(s) => Ok(Some(Meta::from_statx(&s))),
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
            Err(e) => Err(self.err("stat", rel, e)),
        }
    }

    /// Opens the directory `name` if it is still the one `expected` describes, on this file system.
    pub(super) fn open_dir(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        rel: &[u8],
        expected: &Meta,
    ) -> Result<Option<OwnedFd>, DiffError> {
        match open_listed_dir(dir, name, expected.place.ino, &self.fs) {
            Ok(Opened::Dir(fd)) => Ok(Some(fd)),
            Ok(Opened::Changed | Opened::Foreign) => Ok(None),
            Err(e) => Err(self.io_err("open the directory", rel, e)),
        }
    }

    /// Opens the regular file `name` for reading if it is still the one `expected` describes, on this
    /// file system; `None` if it changed in between (or, for a non-root caller, is unreadable).
    pub(super) fn open_file(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        rel: &[u8],
        expected: &Meta,
    ) -> Result<Option<OwnedFd>, DiffError> {
        // O_NONBLOCK: if the file was swapped for a fifo, opening it does not wait for a writer (and
        // the type check below refuses to read it). A device node cannot appear here: the sandbox's
        // user namespace cannot create one.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(dir, name, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(
                Errno::NOENT
                | Errno::NOTDIR
                | Errno::LOOP
                | Errno::NXIO
                | Errno::AGAIN
                | Errno::ACCESS
                | Errno::PERM,
            ) => return Ok(None),
            Err(e) => return Err(self.err("open the file", rel, e)),
        };
        let m = Meta::of_fd(fd.as_fd()).map_err(|e| self.err("stat", rel, e))?;
        Ok((m.is_file() && m.place.ino == expected.place.ino && self.same_fs(&m)).then_some(fd))
    }

    /// Reopens the directory at `rel` that `expected` describes (its descriptor was closed to bound
    /// descriptors): through `..` of `child`, a directory the walk entered from it, when that is it;
    /// else component by component from the root. `None` if it is no longer there.
    pub(super) fn reopen(
        &self,
        child: Option<&OwnedFd>,
        rel: &[u8],
        expected: &Meta,
    ) -> Result<Option<OwnedFd>, DiffError> {
        // The directory it was: the same inode on the same mount (a mount's root only for the
        // tree's own root, which the walk started from).
        let is_it = |m: &Meta| {
            m.file_type == FileType::Directory
                && m.place.ino == expected.place.ino
                && self.fs.same_mount(&m.place)
        };
        if let Some(child) = child {
            if let Ok(Some(up)) = open_parent(child.as_fd(), expected.place.ino, &self.fs) {
                return Ok(Some(up));
            }
        }
        let mut current = rustix::io::dup(&self.fd).map_err(|e| self.err("open the directory", rel, e))?;
        let mut at = Vec::new();
        for component in rel.split(|&b| b == b'/').filter(|c| !c.is_empty()) {
            let Ok(name) = CString::new(component) else {
                return Ok(None);
            };
            at = join(&at, &name);
            let Some(m) = self.stat(current.as_fd(), &name, &at)? else {
                return Ok(None);
            };
            if m.file_type != FileType::Directory || !self.same_fs(&m) {
                return Ok(None);
            }
            let Some(next) = self.open_dir(current.as_fd(), &name, &at, &m)? else {
                return Ok(None);
            };
            current = next;
        }
        let m = Meta::of_fd(current.as_fd()).map_err(|e| self.err("stat", rel, e))?;
        Ok(is_it(&m).then_some(current))
    }

    /// The target of the symlink `name`; `None` if it is no longer one.
    pub(super) fn read_link(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        rel: &[u8],
    ) -> Result<Option<CString>, DiffError> {
        match rustix::fs::readlinkat(dir, name, Vec::new()) {
            Ok(target) => Ok(Some(target)),
            Err(Errno::NOENT | Errno::NOTDIR | Errno::INVAL) => Ok(None),
            Err(e) => Err(self.err("read the symlink", rel, e)),
        }
    }
}
