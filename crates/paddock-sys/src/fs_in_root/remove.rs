//! Removing a tree a sandbox wrote ([`Root::remove_tree`](super::Root::remove_tree)): depth-first,
//! holding one directory descriptor at a time however deep or wide the tree is.
//!
//! It descends with [`open_dir_at`] (`O_NOFOLLOW | O_DIRECTORY`, checked with `fstat` to be the
//! inode that was listed), so a symlink is unlinked, never followed, even if an entry is swapped for
//! one mid-way; it goes back up with `openat("..")`, checked to be the directory it came from, so a
//! tree rearranged meanwhile fails the removal rather than lead it elsewhere. The walk is a loop,
//! not a recursion, so depth costs no stack either.
//!
//! This is the one tree walk in this crate: the agent removes trees through it and cannot depend on
//! `paddock-runtime`, whose walker (`native/walk/`) the host side's other walks are visitors of.
//! Both are built on the same primitives ([`open_dir_at`], [`list_names`]).

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::{AtFlags, FileType, Stat};
use rustix::io::Errno;

use super::dir::{list_names, open_dir_at};

/// A directory being removed: the names still to visit (reverse-sorted, taken from the end) and who
/// it is.
struct Frame {
    names: Vec<CString>,
    dev: u64,
    ino: u64,
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
        },
        CString::new(name.as_bytes()).map_err(|_| io::Error::from(Errno::INVAL))?,
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
fn open_listed<P: rustix::path::Arg>(dir: BorrowedFd<'_>, name: P, listed: &Stat) -> io::Result<OwnedFd> {
    let child = open_dir_at(dir, name)?;
    let st = rustix::fs::fstat(&child)?;
    if st.st_ino != listed.st_ino || st.st_dev != listed.st_dev {
        return Err(io::Error::other("it changed while walked"));
    }
    Ok(child)
}

/// The parent of `dir` through `..`, which must be `parent` (the directory the walk came from).
fn go_up(dir: BorrowedFd<'_>, parent: &Frame) -> io::Result<OwnedFd> {
    let up = open_dir_at(dir, c"..")?;
    let st = rustix::fs::fstat(&up)?;
    if st.st_dev != parent.dev || st.st_ino != parent.ino {
        return Err(io::Error::other("the tree was rearranged while walked"));
    }
    Ok(up)
}

/// The names in an open directory, without `.` and `..`, sorted in reverse byte order (the walk
/// takes them from the end).
fn sorted_names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    let mut names = list_names(dir, u64::MAX)?.names;
    names.reverse();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rustix::fs::{Mode, OFlags};

    /// Descriptors this process has open now.
    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").expect("fds").count()
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
}
