//! The walk from a tree's root to the directory that holds a member: one component at a time with
//! `openat(O_DIRECTORY | O_NOFOLLOW)` ([`open_dir_at`]), so a symlink on the way (one an earlier
//! member made, or an earlier layer) is refused rather than followed, and every directory opened is
//! checked to be on the root's own file system and mount. Missing directories are made on the way
//! (as the sandbox's root, mode 0755) when the caller asks. The open directories along the last
//! member's path are kept, since archives list siblings together.
//!
//! This module does not create, replace or remove members: callers do, by name in the directory
//! this hands them, with calls that never follow the final component either.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use paddock_sys::fs_in_root::open_dir_at;
use rustix::fs::{Gid, Mode, Uid};
use rustix::io::Errno;

use super::member_path::MemberPath;
use crate::native::walk::{Fs, Place};
use crate::native::IdRange;

/// Why a member's directory could not be reached.
#[derive(Debug)]
pub(crate) enum DirError {
    /// A component on the way is absent (and was not to be made).
    Missing,
    /// A component on the way (named) is a symlink, a file or anything but a directory.
    NotADir(Vec<u8>),
    /// A component on the way is another file system or mount (a mount point inside the tree).
    Leaves,
    /// A system call failed: the step it was for, and why.
    Io(&'static str, io::Error),
}

/// The tree's root and the open directories along the last path asked for.
pub(crate) struct TreeDirs {
    root: OwnedFd,
    fs: Fs,
    ids: IdRange,
    /// `(name, fd)` from the root down.
    stack: Vec<(Vec<u8>, OwnedFd)>,
}

impl TreeDirs {
    /// Starts at the open directory `root`.
    pub(crate) fn new(root: OwnedFd, ids: IdRange) -> rustix::io::Result<Self> {
        let place = Place::of_fd(root.as_fd())?;
        Ok(Self {
            root,
            fs: Fs::of(&place),
            ids,
            stack: Vec::new(),
        })
    }

    /// The tree's root.
    pub(crate) fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// Forgets the open directories (after something on the way may have been removed).
    pub(crate) fn forget(&mut self) {
        self.stack.clear();
    }

    /// The open directory that holds `path`. With `create`, missing directories on the way are made
    /// (owned by the sandbox's root, mode 0755); without, a missing one is [`DirError::Missing`].
    pub(crate) fn parent(&mut self, path: &MemberPath, create: bool) -> Result<BorrowedFd<'_>, DirError> {
        let parents = path.parents();
        let keep = self
            .stack
            .iter()
            .zip(parents)
            .take_while(|((name, _), wanted)| name == *wanted)
            .count();
        self.stack.truncate(keep);
        for component in &parents[keep..] {
            let dir = match self.stack.last() {
                Some((_, fd)) => fd.as_fd(),
                None => self.root.as_fd(),
            };
            let sub = match self.open_dir(dir, component) {
                Err(DirError::Missing) if create => self.make_dir(dir, component)?,
                other => other?,
            };
            self.stack.push((component.clone(), sub));
        }
        Ok(match self.stack.last() {
            Some((_, fd)) => fd.as_fd(),
            None => self.root.as_fd(),
        })
    }

    /// Makes the directory `name` in `dir`, owned by the sandbox's root, mode 0755, and opens it.
    pub(crate) fn make_dir(&self, dir: BorrowedFd<'_>, name: &[u8]) -> Result<OwnedFd, DirError> {
        rustix::fs::mkdirat(dir, OsStr::from_bytes(name), Mode::from_raw_mode(0o700))
            .map_err(|e| DirError::Io("create a directory for", e.into()))?;
        let fd = self.open_dir(dir, name)?;
        let (uid, gid) = (self.ids.host_uid(0), self.ids.host_gid(0));
        rustix::fs::fchown(&fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .and_then(|()| rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o755)))
            .map_err(|e| DirError::Io("set up a directory for", e.into()))?;
        Ok(fd)
    }

    /// Opens the directory `name` in `dir` without following a symlink; [`DirError::Missing`] if
    /// absent, a refusal if it is anything but a directory on the tree's file system and mount.
    pub(crate) fn open_dir(&self, dir: BorrowedFd<'_>, name: &[u8]) -> Result<OwnedFd, DirError> {
        match open_dir_at(dir, OsStr::from_bytes(name)) {
            Ok(fd) => {
                let place = Place::of_fd(fd.as_fd()).map_err(|e| DirError::Io("stat", e.into()))?;
                if !self.fs.holds(&place) {
                    return Err(DirError::Leaves);
                }
                Ok(fd)
            }
            Err(Errno::NOENT) => Err(DirError::Missing),
            Err(Errno::LOOP | Errno::NOTDIR) => Err(DirError::NotADir(name.to_vec())),
            Err(e) => Err(DirError::Io("open a directory for", e.into())),
        }
    }
}
