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
//!
//! Here: the lockstep walk, its bounds and its descriptors; `tree.rs`: one tree's lookups, checked
//! through the walk primitives; `compare.rs`: one path's two sides compared.

mod compare;
#[cfg(test)]
mod tests;
mod tree;

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use paddock_sys::fs_in_root::list_names;
use paddock_types::diff::{Change, DiffEntry, DiffOptions, TreeDiff};
use rustix::fs::FileType;
use rustix::io::Errno;

use super::walk::MAX_DEPTH;
use tree::{Meta, Tree};

/// How many of the innermost directories of the walk keep their descriptors open (see the module
/// docs): the walk holds at most twice as many, whatever the depth.
const OPEN_LEVELS: usize = 8;

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
