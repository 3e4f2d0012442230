//! "Diff since a snapshot": a host-side comparison of two directory trees, `old` (a read-only btrfs
//! snapshot of a sandbox's volume) and `new` (its live volume).
//!
//! Both trees hold content written by sandboxed code, and `new` changes while it is walked, so:
//! - every lookup is one path component relative to an open directory descriptor (`openat`,
//!   `statx(AT_SYMLINK_NOFOLLOW)`, `readlinkat`), never a path string: swapping a directory for a
//!   symlink mid-walk cannot redirect a read outside the tree, and symlinks are never followed;
//! - a directory or file is used only after `fstat` of the opened descriptor shows the expected type
//!   and inode on the tree's own file system and mount (another file system, a bind mount or a nested
//!   subvolume is listed but not entered, and files on it are not read): directories are opened and
//!   checked, and parents reopened, with the host side's walk primitives (`native/walk/`:
//!   `open_listed_dir`, `open_parent`, `Fs`), the same as every other walk of a sandbox's tree. The
//!   diff is not a visitor of that walker because it walks two trees in lockstep and tolerates a
//!   live tree changing under it (the module docs there say why in full);
//! - fifos, sockets and devices are compared by metadata only and never opened; regular files are
//!   opened `O_NONBLOCK`, so a file swapped for a fifo after its `statx` cannot block the walk;
//! - the work is bounded: entries listed, directory entries scanned, depth (at most the walks'
//!   ceiling, `walk::MAX_DEPTH`), bytes read to compare contents, bytes of text diffs, and the time
//!   of each text diff; and so are open descriptors:
//!   only the innermost [`OPEN_LEVELS`] directories of the walk keep theirs (two per level, one per
//!   tree), an outer one is closed and reopened when the walk returns to it, through `..` of the
//!   directory it comes back from (checked to be the same inode) or else component by component
//!   from the root (a directory moved away meanwhile is then seen as gone);
//! - something that vanishes or changes type between listing and use is not an error: it is reported
//!   as seen (absent, or "modified" when its content could not be compared).
//!
//! The walk is depth-first with siblings in byte order, so the output is deterministic: a directory
//! comes before its children, and `/a/x` comes before `/a.b`. A deleted directory is listed with all
//! its descendants (each `Deleted`, within `max_entries`), and likewise an added one, so a client sees
//! everything that was lost or created. A path changing type (file to directory, say) is one
//! `TypeChanged` entry followed by the old directory's descendants as `Deleted` or the new one's as
//! `Added`.
//!
//! "Modified" means the permission bits, owner, symlink target, device number or content differ. A
//! directory is modified only by its own mode or owner (its size is the file system's bookkeeping);
//! extended attributes and timestamps alone do not count. btrfs snapshots keep inode numbers and
//! timestamps, and `ctime` cannot be set from user space, so a regular file with the same inode
//! number, size and `ctime` (to the nanosecond) on both sides is unchanged without reading it. Any
//! other file of equal size is compared byte for byte; one too large for the bounds is reported as
//! modified without being read.
//!
//! This module does not take snapshots, lock the sandbox or know about tenants; callers map a
//! sandbox to its two trees.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use paddock_sys::fs_in_root::list_names;
use paddock_types::diff::{Change, DiffEntry, DiffOptions, EntryKind, TreeDiff};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Statx, StatxFlags, CWD};
use rustix::io::Errno;
use similar::TextDiff;

use super::walk::{open_listed_dir, open_parent, Fs, Opened, Place, MAX_DEPTH, PLACE_MASK};

/// How many of the innermost directories of the walk keep their descriptors open (see the module
/// docs): the walk holds at most twice as many, whatever the depth.
const OPEN_LEVELS: usize = 8;

/// Chunk size of streamed content comparison.
const CHUNK: usize = 64 * 1024;
/// Longest a single text diff may run before `similar` settles for a coarser (still correct) diff:
/// line diffs are quadratic in the worst case, and the content is untrusted.
const TEXT_DIFF_TIMEOUT: Duration = Duration::from_millis(250);

/// Why a diff could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A tree's root is missing or not a directory.
    #[error("failed to open the tree {path}")]
    OpenRoot {
        /// The root.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A subtree in [`DiffOptions::paths`] is not a plain relative path.
    #[error("invalid subtree path {path:?}: {reason}")]
    InvalidPath {
        /// The path as given.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Reading the tree failed (other than by something vanishing mid-walk).
    #[error("failed to {step} {path} in {tree}")]
    Walk {
        /// The step: "stat", "list the directory", "open the directory", "read the symlink",
        /// "open the file", "read the file".
        step: &'static str,
        /// The root of the tree.
        tree: PathBuf,
        /// The entry, as the sandbox sees it.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Compares the tree `old` with the tree `new` (see the module docs for what is compared and how
/// untrusted content is handled).
pub fn diff_trees(old: &Path, new: &Path, options: &DiffOptions) -> Result<TreeDiff, DiffError> {
    let subtrees = parse_subtrees(&options.paths)?;
    let mut walker = Walker {
        options,
        old: Tree::open(old)?,
        new: Tree::open(new)?,
        diff: TreeDiff {
            entries: Vec::new(),
            truncated: false,
            added: 0,
            modified: 0,
            deleted: 0,
            bytes_added: 0,
            bytes_deleted: 0,
        },
        scanned: 0,
        compare_left: options.max_total_compare_bytes,
        text_left: options.max_total_text_bytes,
        stopped: false,
    };
    if subtrees.is_empty() {
        let start = walker.root_frame()?;
        walker.walk(start)?;
    } else {
        for components in &subtrees {
            if walker.stopped {
                break;
            }
            let start = walker.subtree_frame(components)?;
            walker.walk(start)?;
        }
    }
    Ok(walker.diff)
}

/// Splits and checks the subtrees; sorted, and without those inside another one.
fn parse_subtrees(paths: &[String]) -> Result<Vec<Vec<CString>>, DiffError> {
    let invalid = |path: &String, reason| DiffError::InvalidPath {
        path: path.clone(),
        reason,
    };
    let mut parsed = Vec::new();
    for path in paths {
        let mut components = Vec::new();
        for c in path.split('/').filter(|c| !c.is_empty()) {
            if c == "." || c == ".." {
                return Err(invalid(path, "`.` and `..` are not allowed"));
            }
            components.push(CString::new(c).map_err(|_| invalid(path, "contains a NUL byte"))?);
        }
        if components.is_empty() {
            return Ok(Vec::new()); // the whole tree
        }
        parsed.push(components);
    }
    parsed.sort();
    let mut kept: Vec<Vec<CString>> = Vec::new();
    for p in parsed {
        if !kept.last().is_some_and(|k| p.starts_with(k)) {
            kept.push(p);
        }
    }
    Ok(kept)
}

/// The metadata the comparison uses, from `statx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    file_type: FileType,
    perm: u32,
    uid: u32,
    gid: u32,
    size: u64,
    ctime: (i64, u32),
    rdev: (u32, u32),
    /// Inode, device and mount: what the walk primitives check.
    place: Place,
}

const STATX_MASK: StatxFlags = PLACE_MASK
    .union(StatxFlags::MODE)
    .union(StatxFlags::UID)
    .union(StatxFlags::GID)
    .union(StatxFlags::SIZE)
    .union(StatxFlags::CTIME);

impl Meta {
    fn from_statx(s: &Statx) -> Self {
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

    fn of_fd(fd: BorrowedFd<'_>) -> rustix::io::Result<Self> {
        rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, STATX_MASK).map(|s| Self::from_statx(&s))
    }

    fn kind(&self) -> EntryKind {
        match self.file_type {
            FileType::RegularFile => EntryKind::File,
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        }
    }

    fn is_file(&self) -> bool {
        self.file_type == FileType::RegularFile
    }

    /// The size clients care about: files and symlinks only (a directory's is bookkeeping).
    fn reported_size(&self) -> Option<u64> {
        matches!(self.file_type, FileType::RegularFile | FileType::Symlink).then_some(self.size)
    }

    /// Same inode, size and change time: unchanged since the snapshot (which preserves all three).
    fn unchanged_since(&self, old: &Meta) -> bool {
        self.place.ino == old.place.ino && self.size == old.size && self.ctime == old.ctime
    }
}

/// One of the two trees.
struct Tree {
    path: PathBuf,
    fd: OwnedFd,
    /// The root's file system and mount, which the walk stays on.
    fs: Fs,
}

impl Tree {
    /// Opens a root. The root is a host path chosen by the host, so it may contain symlinks.
    fn open(path: &Path) -> Result<Self, DiffError> {
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
    fn same_fs(&self, m: &Meta) -> bool {
        self.fs.holds(&m.place)
    }

    fn err(&self, step: &'static str, rel: &[u8], e: Errno) -> DiffError {
        self.io_err(step, rel, e.into())
    }

    fn io_err(&self, step: &'static str, rel: &[u8], source: io::Error) -> DiffError {
        DiffError::Walk {
            step,
            tree: self.path.clone(),
            path: display_path(rel),
            source,
        }
    }

    /// `lstat` of `name` in `dir`; `None` if it vanished.
    fn stat(&self, dir: BorrowedFd<'_>, name: &CStr, rel: &[u8]) -> Result<Option<Meta>, DiffError> {
        match rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, STATX_MASK) {
            Ok(s) => Ok(Some(Meta::from_statx(&s))),
            Err(Errno::NOENT | Errno::NOTDIR) => Ok(None),
            Err(e) => Err(self.err("stat", rel, e)),
        }
    }

    /// Opens the directory `name` if it is still the one `expected` describes, on this file system.
    fn open_dir(
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
    fn open_file(
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
    fn reopen(
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
    fn read_link(&self, dir: BorrowedFd<'_>, name: &CStr, rel: &[u8]) -> Result<Option<CString>, DiffError> {
        match rustix::fs::readlinkat(dir, name, Vec::new()) {
            Ok(target) => Ok(Some(target)),
            Err(Errno::NOENT | Errno::NOTDIR | Errno::INVAL) => Ok(None),
            Err(e) => Err(self.err("read the symlink", rel, e)),
        }
    }
}

/// A directory being walked: its (sorted) names in either tree and how far the walk got.
struct Frame {
    rel: Vec<u8>,
    old: Option<OwnedFd>,
    new: Option<OwnedFd>,
    /// The old and new side's directory while its descriptor is closed ([`Walker::park`]).
    parked: [Option<Meta>; 2],
    names: Vec<CString>,
    next: usize,
    depth: usize,
}

/// An entry about to be added, with the file bytes it accounts for.
struct Found {
    entry: DiffEntry,
    bytes_added: u64,
    bytes_deleted: u64,
}

struct Walker<'a> {
    options: &'a DiffOptions,
    old: Tree,
    new: Tree,
    diff: TreeDiff,
    scanned: u64,
    compare_left: u64,
    text_left: u64,
    stopped: bool,
}

impl Walker<'_> {
    fn root_frame(&mut self) -> Result<Frame, DiffError> {
        let old = self.old.fd.try_clone().map_err(|e| self.root_err(&self.old, e))?;
        let new = self.new.fd.try_clone().map_err(|e| self.root_err(&self.new, e))?;
        let names = self.list_both(Some(&old), Some(&new), b"")?;
        Ok(Frame {
            rel: Vec::new(),
            old: Some(old),
            new: Some(new),
            parked: [None, None],
            names,
            next: 0,
            depth: 0,
        })
    }

    fn root_err(&self, tree: &Tree, e: io::Error) -> DiffError {
        DiffError::OpenRoot {
            path: tree.path.clone(),
            source: e,
        }
    }

    /// A frame holding just the subtree's last component, in its parent directories (absent on a
    /// side where an ancestor is missing, not a directory, or on another file system).
    fn subtree_frame(&mut self, components: &[CString]) -> Result<Frame, DiffError> {
        let Some((last, ancestors)) = components.split_last() else {
            return self.root_frame(); // not produced by parse_subtrees: the whole tree
        };
        let mut rel = Vec::new();
        let mut fds = [None, None];
        for (fd, tree) in fds.iter_mut().zip([&self.old, &self.new]) {
            let mut current = Some(tree.fd.try_clone().map_err(|e| self.root_err(tree, e))?);
            let mut at = Vec::new();
            for c in ancestors {
                at = join(&at, c);
                current = match current {
                    Some(dir) => match tree.stat(dir.as_fd(), c, &at)? {
                        Some(m) if m.file_type == FileType::Directory && tree.same_fs(&m) => {
                            tree.open_dir(dir.as_fd(), c, &at, &m)?
                        }
                        _ => None,
                    },
                    None => None,
                };
            }
            *fd = current;
            rel = at;
        }
        let [old, new] = fds;
        Ok(Frame {
            rel,
            old,
            new,
            parked: [None, None],
            names: vec![last.clone()],
            next: 0,
            depth: ancestors.len(),
        })
    }

    /// The names in both directories, sorted, each once; charged to `max_scanned`.
    fn list_both(
        &mut self,
        old: Option<&OwnedFd>,
        new: Option<&OwnedFd>,
        rel: &[u8],
    ) -> Result<Vec<CString>, DiffError> {
        let mut a = match old {
            Some(fd) => self.list(true, fd.as_fd(), rel)?,
            None => Vec::new(),
        };
        let b = match new {
            Some(fd) => self.list(false, fd.as_fd(), rel)?,
            None => Vec::new(),
        };
        a.extend(b);
        a.sort_unstable();
        a.dedup();
        Ok(a)
    }

    fn tree(&self, old: bool) -> &Tree {
        if old {
            &self.old
        } else {
            &self.new
        }
    }

    /// The names in one side's directory, each charged to `max_scanned` (the walk stops where it
    /// runs out).
    fn list(&mut self, old: bool, fd: BorrowedFd<'_>, rel: &[u8]) -> Result<Vec<CString>, DiffError> {
        let left = self.options.max_scanned.saturating_sub(self.scanned);
        let listed = match list_names(fd, left) {
            Ok(listed) => listed,
            Err(Errno::NOENT) => return Ok(Vec::new()), // removed while we held it
            Err(e) => return Err(self.tree(old).err("list the directory", rel, e)),
        };
        self.scanned += listed.names.len() as u64;
        if !listed.complete {
            self.stop();
        }
        Ok(listed.names)
    }

    fn stop(&mut self) {
        self.stopped = true;
        self.diff.truncated = true;
    }

    /// Walks depth-first from `start`, with an explicit stack (a tree may be deeper than ours).
    fn walk(&mut self, start: Frame) -> Result<(), DiffError> {
        let max_depth = self.options.max_depth.min(MAX_DEPTH);
        let mut stack = vec![start];
        while let Some(frame) = stack.last_mut() {
            if self.stopped {
                break;
            }
            let Some(name) = frame.names.get(frame.next).cloned() else {
                let done = stack.pop();
                if let (Some(parent), Some(done)) = (stack.last_mut(), done) {
                    self.unpark(parent, &done)?;
                }
                continue;
            };
            frame.next += 1;
            let depth = frame.depth + 1;
            if depth > max_depth {
                self.diff.truncated = true;
                continue;
            }
            let rel = join(&frame.rel, &name);
            let old_dir = frame.old.as_ref().map(|fd| fd.as_fd());
            let new_dir = frame.new.as_ref().map(|fd| fd.as_fd());
            let old = match old_dir {
                Some(dir) => self.old.stat(dir, &name, &rel)?,
                None => None,
            };
            let new = match new_dir {
                Some(dir) => self.new.stat(dir, &name, &rel)?,
                None => None,
            };
            if let Some(found) = self.compare(old_dir, new_dir, &name, &rel, old, new)? {
                if !self.push(found) {
                    break;
                }
            }
            // Enter the directory on each side where it is one, on the tree's own file system.
            let enter = |tree: &Tree, m: Option<Meta>| {
                m.filter(|m| m.file_type == FileType::Directory && tree.same_fs(m))
            };
            let (old_enter, new_enter) = (enter(&self.old, old), enter(&self.new, new));
            if old_enter.is_none() && new_enter.is_none() {
                continue;
            }
            if depth >= max_depth {
                self.diff.truncated = true;
                continue;
            }
            let old_fd = match (old_dir, old_enter) {
                (Some(dir), Some(m)) => self.old.open_dir(dir, &name, &rel, &m)?,
                _ => None,
            };
            let new_fd = match (new_dir, new_enter) {
                (Some(dir), Some(m)) => self.new.open_dir(dir, &name, &rel, &m)?,
                _ => None,
            };
            let names = self.list_both(old_fd.as_ref(), new_fd.as_ref(), &rel)?;
            stack.push(Frame {
                rel,
                old: old_fd,
                new: new_fd,
                parked: [None, None],
                names,
                next: 0,
                depth,
            });
            if let Some(outer) = stack.len().checked_sub(OPEN_LEVELS + 1) {
                self.park(&mut stack[outer])?;
            }
        }
        Ok(())
    }

    /// Closes a frame's descriptors, remembering which directories they were.
    fn park(&self, frame: &mut Frame) -> Result<(), DiffError> {
        for (i, (tree, side)) in [(&self.old, &mut frame.old), (&self.new, &mut frame.new)]
            .into_iter()
            .enumerate()
        {
            if let Some(fd) = side.take() {
                let m = Meta::of_fd(fd.as_fd()).map_err(|e| tree.err("stat", &frame.rel, e))?;
                frame.parked[i] = Some(m);
            }
        }
        Ok(())
    }

    /// Reopens what [`Walker::park`] closed of `frame`, which the walk returns to from `child`.
    fn unpark(&self, frame: &mut Frame, child: &Frame) -> Result<(), DiffError> {
        let sides = [
            (&self.old, &mut frame.old, child.old.as_ref()),
            (&self.new, &mut frame.new, child.new.as_ref()),
        ];
        for (i, (tree, side, from)) in sides.into_iter().enumerate() {
            if let Some(expected) = frame.parked[i].take() {
                *side = tree.reopen(from, &frame.rel, &expected)?;
            }
        }
        Ok(())
    }

    /// Adds an entry; `false` (and the walk stops) when the list is full.
    fn push(&mut self, found: Found) -> bool {
        if self.diff.entries.len() >= self.options.max_entries {
            self.stop();
            return false;
        }
        match found.entry.change {
            Change::Added => self.diff.added += 1,
            Change::Deleted => self.diff.deleted += 1,
            Change::Modified | Change::TypeChanged => self.diff.modified += 1,
        }
        self.diff.bytes_added += found.bytes_added;
        self.diff.bytes_deleted += found.bytes_deleted;
        self.diff.entries.push(found.entry);
        true
    }

    /// Compares one path's two sides; `None` if unchanged (or absent on both).
    fn compare(
        &mut self,
        old_dir: Option<BorrowedFd<'_>>,
        new_dir: Option<BorrowedFd<'_>>,
        name: &CStr,
        rel: &[u8],
        old: Option<Meta>,
        new: Option<Meta>,
    ) -> Result<Option<Found>, DiffError> {
        let file_bytes = |m: Option<Meta>| m.filter(Meta::is_file).map_or(0, |m| m.size);
        let (change, mode_changed, owner_changed, unified) = match (old, new) {
            (None, None) => return Ok(None),
            (None, Some(n)) => {
                let text = self.side_text(false, new_dir, name, rel, &n)?;
                (
                    Change::Added,
                    false,
                    false,
                    text.and_then(|t| self.unified(rel, None, Some(&t))),
                )
            }
            (Some(o), None) => {
                let text = self.side_text(true, old_dir, name, rel, &o)?;
                (
                    Change::Deleted,
                    false,
                    false,
                    text.and_then(|t| self.unified(rel, Some(&t), None)),
                )
            }
            (Some(o), Some(n)) => {
                let mode_changed = o.perm != n.perm;
                let owner_changed = o.uid != n.uid || o.gid != n.gid;
                if o.file_type != n.file_type {
                    let old_text = self.side_text(true, old_dir, name, rel, &o)?;
                    let new_text = self.side_text(false, new_dir, name, rel, &n)?;
                    let unified = match (old_text, new_text) {
                        (Some(t), None) => self.unified(rel, Some(&t), None),
                        (None, Some(t)) => self.unified(rel, None, Some(&t)),
                        _ => None,
                    };
                    (Change::TypeChanged, mode_changed, owner_changed, unified)
                } else {
                    let (Some(od), Some(nd)) = (old_dir, new_dir) else {
                        return Ok(None); // both sides were found in their directories
                    };
                    let (differs, unified) = match n.file_type {
                        FileType::RegularFile => self.compare_files(od, nd, name, rel, &o, &n)?,
                        FileType::Symlink => {
                            let differs = !n.unchanged_since(&o)
                                && self.old.read_link(od, name, rel)? != self.new.read_link(nd, name, rel)?;
                            (differs, None)
                        }
                        FileType::Directory => (false, None),
                        _ => (o.rdev != n.rdev, None),
                    };
                    if !(differs || mode_changed || owner_changed) {
                        return Ok(None);
                    }
                    (Change::Modified, mode_changed, owner_changed, unified)
                }
            }
        };
        let (bytes_added, bytes_deleted) = match change {
            Change::Modified => (0, 0),
            _ => (file_bytes(new), file_bytes(old)),
        };
        let kind = new.or(old).map_or(EntryKind::Other, |m| m.kind());
        Ok(Some(Found {
            entry: DiffEntry {
                path: display_path(rel),
                change,
                kind,
                old_size: old.and_then(|m| m.reported_size()),
                new_size: new.and_then(|m| m.reported_size()),
                mode_changed,
                owner_changed,
                unified,
            },
            bytes_added,
            bytes_deleted,
        }))
    }

    /// Whether two regular files' contents differ (`true` when that cannot be known within the
    /// bounds), and their unified diff when asked for and possible.
    fn compare_files(
        &mut self,
        old_dir: BorrowedFd<'_>,
        new_dir: BorrowedFd<'_>,
        name: &CStr,
        rel: &[u8],
        o: &Meta,
        n: &Meta,
    ) -> Result<(bool, Option<String>), DiffError> {
        if n.unchanged_since(o) {
            return Ok((false, None));
        }
        if self.wants_text(o) && self.wants_text(n) && o.size.saturating_add(n.size) <= self.compare_left {
            let a = self.read_small(true, old_dir, name, rel, o)?;
            let b = self.read_small(false, new_dir, name, rel, n)?;
            if let (Some(a), Some(b)) = (a, b) {
                if a == b {
                    // Equal now; a size that differed was a write racing with the read.
                    return Ok((o.size != n.size, None));
                }
                let unified = match (text(&a), text(&b)) {
                    (Some(a), Some(b)) => self.unified(rel, Some(a), Some(b)),
                    _ => None,
                };
                return Ok((true, unified));
            }
            return Ok((true, None));
        }
        if o.size != n.size {
            return Ok((true, None));
        }
        let limit = self.options.max_compare_bytes;
        if o.size > limit || o.size.saturating_mul(2) > self.compare_left {
            return Ok((true, None));
        }
        let (Some(a), Some(b)) = (
            self.old.open_file(old_dir, name, rel, o)?,
            self.new.open_file(new_dir, name, rel, n)?,
        ) else {
            return Ok((true, None));
        };
        let mut buf_a = vec![0; CHUNK];
        let mut buf_b = vec![0; CHUNK];
        let mut total = 0u64;
        loop {
            let got_a = self.read_chunk(true, &a, &mut buf_a, rel)?;
            let got_b = self.read_chunk(false, &b, &mut buf_b, rel)?;
            if got_a != got_b || buf_a[..got_a] != buf_b[..got_b] {
                return Ok((true, None));
            }
            if got_a == 0 {
                return Ok((false, None));
            }
            total += got_a as u64;
            if total > limit {
                return Ok((true, None)); // grew past the bound while being read
            }
        }
    }

    fn wants_text(&self, m: &Meta) -> bool {
        self.options.text_diff && self.text_left > 0 && m.is_file() && m.size <= self.options.max_text_bytes
    }

    /// The content of one side for a text diff of an added, deleted or retyped file, if it is text.
    fn side_text(
        &mut self,
        old: bool,
        dir: Option<BorrowedFd<'_>>,
        name: &CStr,
        rel: &[u8],
        m: &Meta,
    ) -> Result<Option<String>, DiffError> {
        let Some(dir) = dir else { return Ok(None) };
        if !self.wants_text(m) || m.size > self.compare_left || m.size == 0 {
            return Ok(None);
        }
        let bytes = self.read_small(old, dir, name, rel, m)?;
        Ok(bytes.and_then(|b| text(&b).map(str::to_owned)))
    }

    /// A whole file of at most `max_text_bytes`; `None` if it changed into something else or grew
    /// past the bound.
    fn read_small(
        &mut self,
        old: bool,
        dir: BorrowedFd<'_>,
        name: &CStr,
        rel: &[u8],
        m: &Meta,
    ) -> Result<Option<Vec<u8>>, DiffError> {
        let Some(fd) = self.tree(old).open_file(dir, name, rel, m)? else {
            return Ok(None);
        };
        let limit = self.options.max_text_bytes;
        let mut bytes = Vec::with_capacity(usize::try_from(m.size.min(limit)).unwrap_or(0));
        let mut buf = vec![0; CHUNK];
        loop {
            let got = self.read_chunk(old, &fd, &mut buf, rel)?;
            if got == 0 {
                return Ok(Some(bytes));
            }
            bytes.extend_from_slice(&buf[..got]);
            if bytes.len() as u64 > limit {
                return Ok(None);
            }
        }
    }

    /// Fills `buf` as far as the file goes; charges the bytes to `max_total_compare_bytes`.
    fn read_chunk(
        &mut self,
        old: bool,
        fd: &OwnedFd,
        buf: &mut [u8],
        rel: &[u8],
    ) -> Result<usize, DiffError> {
        let mut filled = 0;
        while filled < buf.len() {
            match rustix::io::read(fd, &mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(self.tree(old).err("read the file", rel, e)),
            }
        }
        self.compare_left = self.compare_left.saturating_sub(filled as u64);
        Ok(filled)
    }

    /// A unified diff between two texts (`None` for an absent side), within `max_total_text_bytes`.
    fn unified(&mut self, rel: &[u8], old: Option<&str>, new: Option<&str>) -> Option<String> {
        let (a, b) = (old.unwrap_or(""), new.unwrap_or(""));
        if a == b || self.text_left == 0 {
            return None;
        }
        let a_name = if old.is_some() {
            header_path("a/", rel)
        } else {
            "/dev/null".to_owned()
        };
        let b_name = if new.is_some() {
            header_path("b/", rel)
        } else {
            "/dev/null".to_owned()
        };
        let diff = TextDiff::configure().timeout(TEXT_DIFF_TIMEOUT).diff_lines(a, b);
        let unified = diff
            .unified_diff()
            .context_radius(3)
            .header(&a_name, &b_name)
            .to_string();
        if unified.len() as u64 > self.text_left {
            self.text_left = 0; // no further diffs: the budget is spent
            return None;
        }
        self.text_left -= unified.len() as u64;
        Some(unified)
    }
}

/// Text for a diff: UTF-8 without NUL bytes.
fn text(bytes: &[u8]) -> Option<&str> {
    if bytes.contains(&0) {
        return None;
    }
    std::str::from_utf8(bytes).ok()
}

fn join(rel: &[u8], name: &CStr) -> Vec<u8> {
    let mut path = Vec::with_capacity(rel.len() + 1 + name.to_bytes().len());
    path.extend_from_slice(rel);
    if !rel.is_empty() {
        path.push(b'/');
    }
    path.extend_from_slice(name.to_bytes());
    path
}

/// The path as the sandbox sees it (the volume's `home` is `/home`).
fn display_path(rel: &[u8]) -> String {
    format!("/{}", String::from_utf8_lossy(rel))
}

/// A unified diff header's file name: `prefix` + path, C-quoted as git does when the path holds
/// control characters, quotes, backslashes or bytes that are not UTF-8 (a newline in a file name must
/// not be able to forge diff lines).
fn header_path(prefix: &str, rel: &[u8]) -> String {
    let plain = std::str::from_utf8(rel)
        .ok()
        .filter(|s| !s.chars().any(|c| c.is_control() || c == '"' || c == '\\'));
    if let Some(s) = plain {
        return format!("{prefix}{s}");
    }
    let mut quoted = format!("\"{prefix}");
    for &byte in rel {
        match byte {
            b'"' => quoted.push_str("\\\""),
            b'\\' => quoted.push_str("\\\\"),
            b'\n' => quoted.push_str("\\n"),
            b'\t' => quoted.push_str("\\t"),
            0x20..=0x7e => quoted.push(char::from(byte)),
            _ => quoted.push_str(&format!("\\{byte:03o}")),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walker<'a>(old: &Path, new: &Path, options: &'a DiffOptions) -> Walker<'a> {
        Walker {
            options,
            old: Tree::open(old).expect("old"),
            new: Tree::open(new).expect("new"),
            diff: TreeDiff {
                entries: Vec::new(),
                truncated: false,
                added: 0,
                modified: 0,
                deleted: 0,
                bytes_added: 0,
                bytes_deleted: 0,
            },
            scanned: 0,
            compare_left: options.max_total_compare_bytes,
            text_left: options.max_total_text_bytes,
            stopped: false,
        }
    }

    fn two_trees() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let (old, new) = (dir.path().join("old"), dir.path().join("new"));
        std::fs::create_dir(&old).expect("old");
        std::fs::create_dir(&new).expect("new");
        (dir, old, new)
    }

    /// A name that was listed but is gone by the time it is looked at (deleted between the
    /// directory read and the `statx`) is skipped, not an error.
    #[test]
    fn vanished_between_listing_and_stat() {
        let (_dir, old, new) = two_trees();
        std::fs::write(new.join("kept"), "x").expect("write");
        let options = DiffOptions::default();
        let mut w = walker(&old, &new, &options);
        let mut frame = w.root_frame().expect("frame");
        assert_eq!(frame.names, [c"kept".to_owned()]);
        frame.names = vec![c"gone".to_owned(), c"kept".to_owned()];
        w.walk(frame).expect("walk");
        let paths: Vec<_> = w.diff.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/kept"]);
    }

    /// A file swapped for a fifo after its `statx` is not read (opening it does not block either),
    /// and a directory swapped for a symlink is not entered.
    #[test]
    fn swapped_after_stat_is_not_used() {
        let (_dir, old, new) = two_trees();
        std::fs::write(new.join("f"), "x").expect("write");
        std::fs::create_dir(new.join("d")).expect("mkdir");
        let options = DiffOptions::default();
        let w = walker(&old, &new, &options);
        let root = w.new.fd.as_fd();
        let file_meta = w.new.stat(root, c"f", b"f").expect("stat").expect("exists");
        let dir_meta = w.new.stat(root, c"d", b"d").expect("stat").expect("exists");
        std::fs::remove_file(new.join("f")).expect("rm");
        rustix::fs::mknodat(root, c"f", FileType::Fifo, Mode::from_raw_mode(0o644), 0).expect("mkfifo");
        std::fs::remove_dir(new.join("d")).expect("rmdir");
        std::os::unix::fs::symlink(&old, new.join("d")).expect("symlink");
        assert!(w
            .new
            .open_file(root, c"f", b"f", &file_meta)
            .expect("open")
            .is_none());
        assert!(w
            .new
            .open_dir(root, c"d", b"d", &dir_meta)
            .expect("open")
            .is_none());
    }

    /// Directories on another file system or mount are listed, not entered (here: every directory
    /// looks foreign because the root's device is pretended to differ).
    #[test]
    fn other_file_systems_are_not_entered() {
        let (_dir, old, new) = two_trees();
        std::fs::create_dir(new.join("mnt")).expect("mkdir");
        std::fs::write(new.join("mnt").join("inside"), "x").expect("write");
        let options = DiffOptions::default();
        let mut w = walker(&old, &new, &options);
        let frame = w.root_frame().expect("frame");
        w.new.fs.dev = w.new.fs.dev.wrapping_add(1);
        w.walk(frame).expect("walk");
        let paths: Vec<_> = w.diff.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["/mnt"]);
    }

    #[test]
    fn header_paths_are_quoted_when_needed() {
        assert_eq!(header_path("a/", b"home/user/x y"), "a/home/user/x y");
        assert_eq!(header_path("a/", "h\u{e9}".as_bytes()), "a/h\u{e9}");
        assert_eq!(header_path("b/", b"x\n+++ b/etc"), "\"b/x\\n+++ b/etc\"");
        assert_eq!(header_path("a/", b"q\"\\\xff"), "\"a/q\\\"\\\\\\377\"");
    }

    #[test]
    fn subtrees_are_checked_sorted_and_deduplicated() {
        let p = |v: &[&str]| parse_subtrees(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        let names = |v: Vec<Vec<CString>>| {
            v.into_iter()
                .map(|c| {
                    c.iter()
                        .map(|c| c.to_str().expect("utf-8"))
                        .collect::<Vec<_>>()
                        .join("/")
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(p(&["tmp", "/home/user/", "home"]).expect("ok")),
            ["home", "tmp"]
        );
        assert_eq!(
            names(p(&["home//user", "home/user/x"]).expect("ok")),
            ["home/user"]
        );
        assert!(p(&["home", "/"]).expect("ok").is_empty());
        assert!(p(&["home/../etc"]).is_err());
        assert!(p(&["./home"]).is_err());
        assert!(p(&["a\0b"]).is_err());
    }
}
