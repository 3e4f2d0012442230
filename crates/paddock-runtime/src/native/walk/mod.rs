//! The host side's walk of a tree a sandbox wrote (its volume, a snapshot, an import), and the
//! checks every such walk makes. Snapshot export (`transfer/export.rs`), snapshot usage
//! (`snapshot_usage.rs`) and an import's last pass over the tree it unpacked (`transfer/import/`)
//! are visitors of [`walk_tree`]; the diff (`diff/`) shares its primitives.
//!
//! What every walk here does and does not do:
//! - it is fd-relative: each lookup is one name relative to an open directory, never a path string;
//!   directories are opened with `paddock_sys::fs_in_root::open_dir_at` (`O_RDONLY | O_DIRECTORY |
//!   O_NOFOLLOW | O_CLOEXEC`) and entries described with `lstat`/`statx(AT_SYMLINK_NOFOLLOW)`, so a
//!   symlink is listed, never followed, and a directory swapped for a symlink mid-walk is not entered;
//! - it enters a directory only when the descriptor it opened is, by `statx` of that descriptor,
//!   the inode that was listed, on the root's file system and mount, and not itself a mount's root
//!   ([`Fs::holds`], [`open_listed_dir`]): another file system, a bind mount or a nested subvolume is
//!   listed but not entered;
//! - it opens nothing but directories: files are the visitor's, regular ones through
//!   `paddock_sys::fs_in_root::open_regular_at` (`O_PATH` and `fstat` first, so a fifo or device is
//!   never opened for reading);
//! - its depth is bounded: [`WalkOptions::max_depth`], never more than [`MAX_DEPTH`] (the path and a
//!   name list per level are its memory); a directory at the bound is listed, and if it holds
//!   anything the walk fails rather than leave its entries out;
//! - its descriptors are bounded: it holds the current directory's (and one more while it lists or
//!   enters a directory) however deep or wide the tree, and goes back up through `..`, checked to be
//!   the directory it came from ([`open_parent`]): a tree rearranged while walked fails the walk
//!   rather than lead it elsewhere. It is a loop, not a recursion, so depth costs no stack either;
//! - its order is deterministic: depth-first, a directory before its entries, siblings in byte order.
//!
//! Why the diff is not a visitor: it walks two trees in lockstep, visiting the union of both
//! directories' names and entering each side where it is a directory (a directory on one side only
//! is walked alone; one that changed type is entered on one side), and it reads a live volume: a
//! directory that vanishes or moves while it is walked is reported as seen, not an error, so an
//! outer directory whose `..` no longer leads back is reopened from the root. A one-tree walker that
//! hands out one entry at a time would need the visitor to keep a second walk in step inside it.
//! Instead the diff uses the same open, the same stat-and-check ([`Fs`], [`Place`],
//! [`open_listed_dir`], [`open_parent`]), the same listing (`list_names`, with its own bound on
//! names read) and the same ceiling on depth ([`MAX_DEPTH`]); it keeps the descriptors of its
//! innermost levels open (its own `OPEN_LEVELS`) because it reopens two trees at once.
//!
//! `paddock_sys::fs_in_root::Root::remove_tree` walks on its own, on the same primitives: the
//! agent removes trees through it and cannot depend on this crate.

use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use paddock_sys::fs_in_root::{is_not_a_dir, list_names, open_dir_at};
use rustix::fs::{AtFlags, FileType, Stat, Statx, StatxAttributes, StatxFlags};

#[cfg(test)]
mod tests;

/// The deepest any walk of a sandbox's tree goes (a top-level entry is at depth 1). Callers bound
/// their walks lower where a format does (an archive member's depth, a diff's `max_depth`); this is
/// the ceiling that bounds a walk's memory (the path, and a name list per level).
pub(crate) const MAX_DEPTH: usize = 1 << 16;

/// Where an inode lies: what [`Fs`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    /// Inode number.
    pub(crate) ino: u64,
    /// Device of its file system (`makedev` of the `statx` major and minor).
    pub(crate) dev: u64,
    /// Its mount's id, where the kernel reports one.
    pub(crate) mnt_id: Option<u64>,
    /// Whether it is the root of a mount.
    pub(crate) mount_root: bool,
}

/// What `statx` must report for a [`Place`].
pub(crate) const PLACE_MASK: StatxFlags = StatxFlags::TYPE.union(StatxFlags::INO).union(StatxFlags::MNT_ID);

impl Place {
    /// From a `statx` made with at least [`PLACE_MASK`].
    pub(crate) fn from_statx(s: &Statx) -> Self {
        Self {
            ino: s.stx_ino,
            dev: rustix::fs::makedev(s.stx_dev_major, s.stx_dev_minor),
            mnt_id: StatxFlags::from_bits_retain(s.stx_mask)
                .contains(StatxFlags::MNT_ID)
                .then_some(s.stx_mnt_id),
            mount_root: s.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
                && s.stx_attributes.contains(StatxAttributes::MOUNT_ROOT),
        }
    }

    /// Of an open descriptor.
    pub(crate) fn of_fd(fd: BorrowedFd<'_>) -> rustix::io::Result<Self> {
        rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, PLACE_MASK).map(|s| Self::from_statx(&s))
    }
}

/// The file system and mount a walk stays on: its root's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fs {
    /// The device of the root's file system.
    pub(crate) dev: u64,
    /// The root's mount id, where the kernel reports one.
    pub(crate) mnt_id: Option<u64>,
}

impl Fs {
    /// The file system and mount of the root `place`.
    pub(crate) fn of(root: &Place) -> Self {
        Self {
            dev: root.dev,
            mnt_id: root.mnt_id,
        }
    }

    /// Whether `p` lies on this file system and mount (an unknown mount id passes on the device).
    pub(crate) fn same_mount(&self, p: &Place) -> bool {
        p.dev == self.dev && (p.mnt_id.is_none() || p.mnt_id == self.mnt_id)
    }

    /// Whether a walk may enter `p`: on this file system and mount, and not the root of a mount (of
    /// another file system, or a bind mount of this one).
    pub(crate) fn holds(&self, p: &Place) -> bool {
        self.same_mount(p) && !p.mount_root
    }
}

/// What [`open_listed_dir`] found.
#[derive(Debug)]
pub(crate) enum Opened {
    /// The directory that was listed, open, on the walk's file system and mount.
    Dir(OwnedFd),
    /// Something else is there now (another inode, a symlink, a file, or nothing).
    Changed,
    /// The directory that was listed, but another mount's root or on another mount: not entered.
    Foreign,
}

/// Opens the directory `name` of `dir` ([`open_dir_at`]: never through a symlink) and checks with
/// `statx` of the new descriptor that it is the inode `ino` on `fs`'s device that was listed, and
/// that `fs` [holds](Fs::holds) it.
pub(crate) fn open_listed_dir(dir: BorrowedFd<'_>, name: &CStr, ino: u64, fs: &Fs) -> io::Result<Opened> {
    let fd = match open_dir_at(dir, name) {
        Ok(fd) => fd,
        Err(e) if is_not_a_dir(e) => return Ok(Opened::Changed),
        Err(e) => return Err(e.into()),
    };
    let place = Place::of_fd(fd.as_fd())?;
    if place.ino != ino || place.dev != fs.dev {
        return Ok(Opened::Changed);
    }
    if !fs.holds(&place) {
        return Ok(Opened::Foreign);
    }
    Ok(Opened::Dir(fd))
}

/// The parent of the open directory `dir` through `..`, if it is the directory `ino` on `fs`'s
/// mount (the one a walk came from); `None` when the tree was rearranged meanwhile.
pub(crate) fn open_parent(dir: BorrowedFd<'_>, ino: u64, fs: &Fs) -> io::Result<Option<OwnedFd>> {
    let up = open_dir_at(dir, c"..")?;
    let place = Place::of_fd(up.as_fd())?;
    Ok((place.ino == ino && fs.same_mount(&place)).then_some(up))
}

/// How deep a walk may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WalkOptions {
    /// The deepest entries visited (a top-level entry is at depth 1); a directory at this depth that
    /// holds anything the visitor wants entered fails the walk. At most [`MAX_DEPTH`].
    pub(crate) max_depth: usize,
}

/// One entry met by [`walk_tree`].
#[derive(Debug)]
pub(crate) struct WalkEntry<'a> {
    /// The open directory holding the entry (`openat`, `readlinkat` relative to it).
    pub(crate) dir: BorrowedFd<'a>,
    /// Its name in `dir`.
    pub(crate) name: &'a OsStr,
    /// Its path from the root: names joined by `/`, without a leading `/`.
    pub(crate) path: &'a [u8],
    /// `lstat` of the entry (a symlink is described, not followed).
    pub(crate) stat: &'a Stat,
}

impl WalkEntry<'_> {
    /// The kind of the entry.
    pub(crate) fn file_type(&self) -> FileType {
        FileType::from_raw_mode(self.stat.st_mode)
    }
}

/// What the visitor wants after an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WalkStep {
    /// Enter it (directories on the root's own file system and mount only; ignored for anything
    /// else).
    Descend,
    /// Go on with its next sibling.
    Continue,
}

/// The walk itself failed (not the visitor).
#[derive(Debug, thiserror::Error)]
#[error("failed to {step} {}", String::from_utf8_lossy(.path))]
pub(crate) struct WalkError {
    /// What it was doing: "open", "stat", "list", "enter", "descend into", "return to".
    pub(crate) step: &'static str,
    /// The directory or entry, relative to the root (empty for the root).
    pub(crate) path: Vec<u8>,
    /// The cause.
    #[source]
    pub(crate) source: io::Error,
}

/// Why [`walk_tree`] stopped early: the walk failed, or the visitor did.
#[derive(Debug)]
pub(crate) enum Stopped<E> {
    /// The walk failed.
    Walk(WalkError),
    /// The visitor returned this error.
    Visitor(E),
}

impl<E> Stopped<E> {
    /// The caller's error: the visitor's as it is, the walk's turned into one by `walk` (which
    /// adds what the caller knows: the tree's path, the operation).
    pub(crate) fn into_error(self, walk: impl FnOnce(WalkError) -> E) -> E {
        match self {
            Self::Walk(e) => walk(e),
            Self::Visitor(e) => e,
        }
    }
}

/// A directory being walked: the names still to visit (reverse-sorted, taken from the end) and
/// which inode it is.
struct Frame {
    names: Vec<CString>,
    ino: u64,
    /// Length of its path in the walk's path buffer.
    path_len: usize,
}

/// Walks the tree below the directory `root` (see the module docs), calling `visit` for every
/// entry; the root itself is not visited. An entry that vanishes between listing and `lstat` is
/// skipped. Stops at the first error, of the walk or of `visit`.
pub(crate) fn walk_tree<E>(
    root: BorrowedFd<'_>,
    options: &WalkOptions,
    mut visit: impl FnMut(&WalkEntry<'_>) -> Result<WalkStep, E>,
) -> Result<(), Stopped<E>> {
    let max_depth = options.max_depth.min(MAX_DEPTH);
    let fail = |step, path: &[u8], source: io::Error| {
        Stopped::Walk(WalkError {
            step,
            path: path.to_vec(),
            source,
        })
    };
    let mut cur = open_dir_at(root, c".").map_err(|e| fail("open", b"", e.into()))?;
    let top = Place::of_fd(cur.as_fd()).map_err(|e| fail("stat", b"", e.into()))?;
    let fs = Fs::of(&top);
    let mut path: Vec<u8> = Vec::new();
    let mut stack = vec![Frame {
        names: sorted_names(cur.as_fd()).map_err(|e| fail("list", b"", e))?,
        ino: top.ino,
        path_len: 0,
    }];
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.names.pop() else {
            stack.pop();
            if let Some(parent) = stack.last() {
                path.truncate(parent.path_len);
                cur = match open_parent(cur.as_fd(), parent.ino, &fs) {
                    Ok(Some(up)) => up,
                    Ok(None) => {
                        let moved = io::Error::other("the tree was rearranged while walked");
                        return Err(fail("return to", &path, moved));
                    }
                    Err(e) => return Err(fail("return to", &path, e)),
                };
            }
            continue;
        };
        path.truncate(frame.path_len);
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name.to_bytes());
        let depth = stack.len();
        let st = match rustix::fs::statat(&cur, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(e) => return Err(fail("stat", &path, e.into())),
        };
        let step = visit(&WalkEntry {
            dir: cur.as_fd(),
            name: OsStr::from_bytes(name.to_bytes()),
            path: &path,
            stat: &st,
        })
        .map_err(Stopped::Visitor)?;
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        if step != WalkStep::Descend || !is_dir || st.st_dev != fs.dev {
            continue;
        }
        let child = match open_listed_dir(cur.as_fd(), &name, st.st_ino, &fs) {
            Ok(Opened::Dir(child)) => child,
            Ok(Opened::Foreign) => continue,
            Ok(Opened::Changed) => {
                return Err(fail("enter", &path, io::Error::other("it changed while walked")))
            }
            Err(e) => return Err(fail("enter", &path, e)),
        };
        let names = sorted_names(child.as_fd()).map_err(|e| fail("list", &path, e))?;
        if names.is_empty() {
            continue; // nothing inside: no need to go in and back up
        }
        if depth >= max_depth {
            let deep = io::Error::other(format!("directories nest deeper than {max_depth} levels"));
            return Err(fail("descend into", &path, deep));
        }
        cur = child;
        stack.push(Frame {
            names,
            ino: st.st_ino,
            path_len: path.len(),
        });
    }
    Ok(())
}

/// The names in an open directory, without `.` and `..`, sorted in reverse byte order (the walk
/// takes them from the end).
fn sorted_names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    let mut names = list_names(dir, u64::MAX)?.names;
    names.reverse();
    Ok(names)
}
