//! Depth-first walks of a tree a sandbox wrote, holding one directory descriptor at a time.
//!
//! The walk keeps, per level, the names still to visit (sorted, so the order is deterministic: a
//! directory before its entries, siblings in byte order) and the identity (`st_dev`, `st_ino`) of the
//! directory, but a descriptor for the current directory only. It descends with `openat(name,
//! O_NOFOLLOW | O_DIRECTORY)` (checked with `fstat` to be the inode that was listed) and goes back up
//! with `openat("..")`, checked to be the directory it came from: a tree rearranged while walked
//! fails the walk rather than leading it anywhere else. Descriptors stay bounded (the current
//! directory, plus one while a directory is listed or entered) however deep or wide the tree is, and
//! the walk is a loop, not a recursion, so depth costs no stack either.
//!
//! What this does not do: follow symlinks, enter another file system or a mount (such a directory
//! is visited, not entered), bound the depth (a visitor that wants a bound checks
//! [`WalkEntry::depth`]), or open files (the visitor does, relative to [`WalkEntry::dir`]).

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat, StatxAttributes, StatxFlags};
use rustix::io::Errno;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// One entry met by [`walk_tree`].
#[derive(Debug)]
pub struct WalkEntry<'a> {
    /// The open directory holding the entry (`openat`, `readlinkat` relative to it).
    pub dir: BorrowedFd<'a>,
    /// Its name in `dir`.
    pub name: &'a OsStr,
    /// Its path from the root: names joined by `/`, without a leading `/`.
    pub path: &'a [u8],
    /// `lstat` of the entry (a symlink is described, not followed).
    pub stat: &'a Stat,
    /// 1 for the root's own entries.
    pub depth: usize,
}

impl WalkEntry<'_> {
    /// The kind of the entry.
    pub fn file_type(&self) -> FileType {
        FileType::from_raw_mode(self.stat.st_mode)
    }
}

/// What the visitor wants after an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkStep {
    /// Enter it (directories on the root's own file system only; ignored for anything else).
    Descend,
    /// Go on with its next sibling.
    Continue,
}

/// The walk itself failed (not the visitor).
#[derive(Debug, thiserror::Error)]
#[error("failed to {step} {}", String::from_utf8_lossy(.path))]
pub struct WalkError {
    /// What it was doing: "open", "list", "stat", "enter", "return to".
    pub step: &'static str,
    /// The directory or entry, relative to the root (empty for the root).
    pub path: Vec<u8>,
    /// The cause.
    #[source]
    pub source: io::Error,
}

/// A directory being walked: the names still to visit (reverse-sorted, taken from the end) and who
/// it is.
struct Frame {
    names: Vec<OsString>,
    dev: u64,
    ino: u64,
    /// Length of its path in the walk's path buffer.
    path_len: usize,
}

/// Walks the tree below the directory `root` depth-first (see the module docs), calling `visit` for
/// every entry; the root itself is not visited. An entry that vanishes between listing and `lstat`
/// is skipped. Stops at the first error, of the walk (converted with `From<WalkError>`) or of
/// `visit`.
pub fn walk_tree<E: From<WalkError>>(
    root: BorrowedFd<'_>,
    mut visit: impl FnMut(&WalkEntry<'_>) -> Result<WalkStep, E>,
) -> Result<(), E> {
    let fail = |step, path: &[u8], source: io::Error| WalkError {
        step,
        path: path.to_vec(),
        source,
    };
    let mut cur =
        rustix::fs::openat(root, c".", DIR_FLAGS, Mode::empty()).map_err(|e| fail("open", b"", e.into()))?;
    let st = rustix::fs::fstat(&cur).map_err(|e| fail("stat", b"", e.into()))?;
    let root_dev = st.st_dev;
    let mut path: Vec<u8> = Vec::new();
    let mut stack = vec![Frame {
        names: sorted_names(cur.as_fd()).map_err(|e| fail("list", b"", e))?,
        dev: st.st_dev,
        ino: st.st_ino,
        path_len: 0,
    }];
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.names.pop() else {
            stack.pop();
            if let Some(parent) = stack.last() {
                path.truncate(parent.path_len);
                cur = go_up(cur.as_fd(), parent).map_err(|e| fail("return to", &path, e))?;
            }
            continue;
        };
        path.truncate(frame.path_len);
        if !path.is_empty() {
            path.push(b'/');
        }
        path.extend_from_slice(name.as_bytes());
        let depth = stack.len();
        let st = match rustix::fs::statat(&cur, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(fail("stat", &path, e.into()).into()),
        };
        let step = visit(&WalkEntry {
            dir: cur.as_fd(),
            name: &name,
            path: &path,
            stat: &st,
            depth,
        })?;
        let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        if step != WalkStep::Descend || !is_dir || st.st_dev != root_dev {
            continue;
        }
        let Some(child) = enter(cur.as_fd(), &name, &st).map_err(|e| fail("enter", &path, e))? else {
            continue;
        };
        let names = sorted_names(child.as_fd()).map_err(|e| fail("list", &path, e))?;
        cur = child;
        stack.push(Frame {
            names,
            dev: st.st_dev,
            ino: st.st_ino,
            path_len: path.len(),
        });
    }
    Ok(())
}

/// Removes `name` in `parent` and, if it is a directory, everything below it, depth-first with one
/// directory descriptor at a time (see [`super::Root::remove_tree`]). A missing `name` is an error;
/// anything below it that vanishes meanwhile is not.
pub(super) fn remove_entry_tree(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let st = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Ok(rustix::fs::unlinkat(parent, name, AtFlags::empty())?);
    }
    let mut cur = open_listed(parent, name, &st)?;
    let mut stack = vec![(
        Frame {
            names: sorted_names(cur.as_fd())?,
            dev: st.st_dev,
            ino: st.st_ino,
            path_len: 0,
        },
        name.to_os_string(),
    )];
    while let Some((frame, _)) = stack.last_mut() {
        if let Some(child) = frame.names.pop() {
            let st = match rustix::fs::statat(&cur, &child, AtFlags::SYMLINK_NOFOLLOW) {
                Err(Errno::NOENT) => continue,
                other => other?,
            };
            if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
                ignore_vanished(rustix::fs::unlinkat(&cur, &child, AtFlags::empty()))?;
                continue;
            }
            let next = match open_listed(cur.as_fd(), &child, &st) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                other => other?,
            };
            let names = sorted_names(next.as_fd())?;
            cur = next;
            stack.push((
                Frame {
                    names,
                    dev: st.st_dev,
                    ino: st.st_ino,
                    path_len: 0,
                },
                child,
            ));
            continue;
        }
        let Some((_, done)) = stack.pop() else { break };
        match stack.last() {
            Some((parent_frame, _)) => {
                cur = go_up(cur.as_fd(), parent_frame)?;
                ignore_vanished(rustix::fs::unlinkat(&cur, &done, AtFlags::REMOVEDIR))?;
            }
            None => {
                drop(cur);
                return Ok(rustix::fs::unlinkat(parent, &done, AtFlags::REMOVEDIR)?);
            }
        }
    }
    Ok(())
}

/// `Ok` for an entry that is already gone.
fn ignore_vanished(result: rustix::io::Result<()>) -> io::Result<()> {
    match result {
        Err(Errno::NOENT) => Ok(()),
        other => Ok(other?),
    }
}

/// Opens directory `name` of `dir`, which must still be the inode `listed` describes.
fn open_listed(dir: BorrowedFd<'_>, name: &OsStr, listed: &Stat) -> io::Result<OwnedFd> {
    let child = rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())?;
    let st = rustix::fs::fstat(&child)?;
    if st.st_ino != listed.st_ino || st.st_dev != listed.st_dev {
        return Err(io::Error::other("it changed while walked"));
    }
    Ok(child)
}

/// Opens directory `name` of `dir` if it is still the inode `listed` describes; `None` when it is
/// the root of a mount (another file system's, or a bind mount of this one).
fn enter(dir: BorrowedFd<'_>, name: &OsStr, listed: &Stat) -> io::Result<Option<OwnedFd>> {
    let child = rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())?;
    let opened = rustix::fs::statx(&child, c"", AtFlags::EMPTY_PATH, StatxFlags::INO)?;
    let dev = rustix::fs::makedev(opened.stx_dev_major, opened.stx_dev_minor);
    if opened.stx_ino != listed.st_ino || dev != listed.st_dev {
        return Err(io::Error::other("it changed while walked"));
    }
    let mount_root = opened.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
        && opened.stx_attributes.contains(StatxAttributes::MOUNT_ROOT);
    Ok((!mount_root).then_some(child))
}

/// The parent of `dir` through `..`, which must be `parent` (the directory the walk came from).
fn go_up(dir: BorrowedFd<'_>, parent: &Frame) -> io::Result<OwnedFd> {
    let up = rustix::fs::openat(dir, c"..", DIR_FLAGS, Mode::empty())?;
    let st = rustix::fs::fstat(&up)?;
    if st.st_dev != parent.dev || st.st_ino != parent.ino {
        return Err(io::Error::other("the tree was rearranged while walked"));
    }
    Ok(up)
}

/// The names in an open directory, without `.` and `..`, sorted in reverse byte order (the walk
/// takes them from the end).
fn sorted_names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut names = super::read_names(dir)?;
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::Path;

    use super::*;

    /// Descriptors this process has open now.
    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").expect("fds").count()
    }

    /// Every path visited (each reduced to its last 64 bytes: a deep tree's paths add up to
    /// gigabytes) and the most descriptors open during a visit.
    fn walk_all(root: &Path) -> (Vec<String>, usize) {
        let fd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root");
        let mut seen = Vec::new();
        let mut most = 0;
        walk_tree::<WalkError>(fd.as_fd(), |e| {
            if seen.len() % 64 == 0 {
                most = most.max(open_fds());
            }
            let tail = &e.path[e.path.len().saturating_sub(64)..];
            seen.push(String::from_utf8_lossy(tail).into_owned());
            Ok(WalkStep::Descend)
        })
        .expect("walk");
        (seen, most)
    }

    #[test]
    fn visits_depth_first_in_byte_order_without_following_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("secret"), "x").expect("write");
        for d in ["a/x", "a.b", "b"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        std::fs::write(dir.path().join("a/x/f"), "x").expect("write");
        symlink(outside.path(), dir.path().join("a/out")).expect("symlink");
        let (seen, _) = walk_all(dir.path());
        assert_eq!(seen, ["a", "a/out", "a/x", "a/x/f", "a.b", "b"]);
    }

    #[test]
    fn descriptors_stay_bounded_however_deep_or_wide() {
        // On tmpfs: 50,000 directories on a journalled disk take a minute to make and remove.
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("tempdir");
        let before = open_fds();
        // 25,000 nested directories, made fd-relative (the path is far beyond PATH_MAX).
        let mut cur =
            rustix::fs::open(dir.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).expect("dir");
        for _ in 0..25_000 {
            rustix::fs::mkdirat(&cur, c"d", Mode::from_raw_mode(0o755)).expect("mkdir");
            cur = rustix::fs::openat(&cur, c"d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .expect("open");
        }
        rustix::fs::mkdirat(&cur, c"leaf", Mode::from_raw_mode(0o755)).expect("mkdir");
        drop(cur);
        // And 25,000 siblings.
        std::fs::create_dir(dir.path().join("wide")).expect("mkdir");
        for i in 0..25_000 {
            std::fs::create_dir(dir.path().join(format!("wide/{i}"))).expect("mkdir");
        }
        let (seen, most) = walk_all(dir.path());
        assert_eq!(seen.len(), 25_000 + 1 + 1 + 25_000);
        assert!(seen.iter().any(|p| p.ends_with("/d/leaf")), "reached the bottom");
        assert!(
            most <= before + 4,
            "the walk held {} descriptors at most (baseline {before})",
            most - before.min(most)
        );
        // Removing what the test made needs the same care: std's remove_dir_all would recurse.
        let fd = rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root");
        remove_nested(fd.as_fd());
    }

    /// Removes the 25,000-deep `d` chain bottom-up without recursion.
    fn remove_nested(root: BorrowedFd<'_>) {
        let mut depth = 0;
        let mut cur = rustix::fs::openat(root, c".", DIR_FLAGS, Mode::empty()).expect("open");
        while let Ok(next) = rustix::fs::openat(&cur, c"d", DIR_FLAGS, Mode::empty()) {
            cur = next;
            depth += 1;
        }
        let _ = rustix::fs::unlinkat(&cur, c"leaf", AtFlags::REMOVEDIR);
        for _ in 0..depth {
            cur = rustix::fs::openat(&cur, c"..", DIR_FLAGS, Mode::empty()).expect("up");
            rustix::fs::unlinkat(&cur, c"d", AtFlags::REMOVEDIR).expect("rmdir");
        }
    }

    #[test]
    fn remove_tree_takes_a_deep_tree_with_bounded_descriptors() {
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("tempdir");
        let mut cur =
            rustix::fs::open(dir.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).expect("dir");
        rustix::fs::mkdirat(&cur, c"top", Mode::from_raw_mode(0o755)).expect("mkdir");
        cur = rustix::fs::openat(&cur, c"top", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .expect("open");
        for _ in 0..5_000 {
            rustix::fs::mkdirat(&cur, c"d", Mode::from_raw_mode(0o755)).expect("mkdir");
            rustix::fs::mkdirat(&cur, c"e", Mode::from_raw_mode(0o755)).expect("mkdir");
            std::os::unix::fs::symlink(
                dir.path(),
                format!("/proc/self/fd/{}/link", std::os::fd::AsRawFd::as_raw_fd(&cur)),
            )
            .expect("symlink");
            cur = rustix::fs::openat(&cur, c"d", OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                .expect("open");
        }
        drop(cur);
        std::fs::write(dir.path().join("keep"), "x").expect("write");
        let root = super::super::Root::open(dir.path()).expect("root");
        let before = open_fds();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let sampler = std::thread::spawn(move || {
            let mut most = 0;
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                most = most.max(open_fds());
            }
            most
        });
        root.remove_tree(Path::new("top")).expect("remove");
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let most = sampler.join().expect("sampler");
        assert!(!dir.path().join("top").exists());
        assert!(
            dir.path().join("keep").exists(),
            "a symlink to the root was not followed"
        );
        assert!(
            most <= before + 4,
            "{most} descriptors open while removing (baseline {before})"
        );
        assert_eq!(open_fds(), before, "descriptors left open");
    }

    #[test]
    fn a_tree_rearranged_while_walked_fails_the_walk() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("a/b/x")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("c")).expect("mkdir");
        let fd = rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root");
        let moved = dir.path().to_owned();
        let err = walk_tree::<WalkError>(fd.as_fd(), |e| {
            if e.path == b"a/b/x" {
                std::fs::rename(moved.join("a/b"), moved.join("c/b")).expect("rename");
            }
            Ok(WalkStep::Descend)
        })
        .expect_err("the walk notices");
        assert_eq!(err.step, "return to");
        assert_eq!(err.path, b"a");
    }
}
