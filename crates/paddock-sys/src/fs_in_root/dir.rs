//! The two primitives every walk of a tree a sandbox wrote is built on: opening a directory one
//! component at a time without following a symlink ([`open_dir_at`]), and listing it
//! ([`list_names`]). The host side's walker and diff (`paddock-runtime`'s `native/walk/` and
//! `native/diff/`), an import, [`Root::remove_tree`](super::Root::remove_tree) and the agent's
//! directory watches all open directories through here, so the flags are written once.

use std::ffi::{CStr, CString};
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

/// The flags of [`open_dir_at`].
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens the directory `name` relative to the open directory `dir` with `O_RDONLY | O_DIRECTORY |
/// O_NOFOLLOW | O_CLOEXEC`: a symlink there is never followed, even to a directory (Linux answers
/// `ENOTDIR`, as for anything else that is not a directory; [`is_not_a_dir`] tells these apart from
/// real failures), and the descriptor does not leak into programs started later. `name` should be one component (or `.` / `..`); a path of several is
/// resolved by the kernel, following symlinks on the way but not the last. With
/// [`rustix::fs::CWD`] as `dir`, `name` may be a host path chosen by the host.
///
/// Nothing is checked beyond the type: callers that listed the directory check with `fstat` of the
/// descriptor that it is the inode they listed (and on the file system they walk).
pub fn open_dir_at<P: rustix::path::Arg>(dir: BorrowedFd<'_>, name: P) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())
}

/// The names in an open directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// Every name but `.` and `..`, sorted in byte order (at most the `max` asked for).
    pub names: Vec<CString>,
    /// False when the directory held more than `max` names: those past it were not read.
    pub complete: bool,
}

/// Lists the open directory `dir`: its names but `.` and `..`, sorted in byte order, reading at most
/// `max` of them (a walk that bounds its work passes what is left of its budget; `u64::MAX` reads
/// them all). The directory is read from its start whatever its descriptor's offset.
pub fn list_names(dir: BorrowedFd<'_>, max: u64) -> rustix::io::Result<Names> {
    let mut names = Vec::new();
    let mut complete = true;
    let mut reader = rustix::fs::Dir::read_from(dir)?;
    while let Some(entry) = reader.read() {
        let entry = entry?;
        let name: &CStr = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        if names.len() as u64 >= max {
            complete = false;
            break;
        }
        names.push(name.to_owned());
    }
    names.sort_unstable();
    Ok(Names { names, complete })
}

/// `true` for the errors of [`open_dir_at`] that mean "not a directory there (any more)": nothing
/// by that name, a symlink, or something else.
pub fn is_not_a_dir(e: Errno) -> bool {
    matches!(e, Errno::NOENT | Errno::NOTDIR | Errno::LOOP)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn opens_directories_only_and_never_follows_a_symlink() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("d")).expect("mkdir");
        std::fs::write(dir.path().join("f"), "x").expect("write");
        symlink("d", dir.path().join("link")).expect("symlink");
        let root = rustix::fs::open(dir.path(), OFlags::PATH, Mode::empty()).expect("root");
        let d = open_dir_at(root.as_fd(), c"d").expect("a directory");
        let flags = rustix::io::fcntl_getfd(&d).expect("flags");
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
        let link = open_dir_at(root.as_fd(), c"link").expect_err("a symlink to a directory");
        assert!(is_not_a_dir(link), "{link}");
        assert_eq!(open_dir_at(root.as_fd(), c"f").err(), Some(Errno::NOTDIR));
        assert_eq!(open_dir_at(root.as_fd(), c"gone").err(), Some(Errno::NOENT));
        assert!([Errno::LOOP, Errno::NOTDIR, Errno::NOENT]
            .into_iter()
            .all(is_not_a_dir));
        assert!(!is_not_a_dir(Errno::ACCESS));
        assert!(open_dir_at(rustix::fs::CWD, dir.path()).is_ok());
    }

    #[test]
    fn lists_sorted_names_within_a_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in ["b", "a.b", "a", "c"] {
            std::fs::write(dir.path().join(name), "x").expect("write");
        }
        let fd = open_dir_at(rustix::fs::CWD, dir.path()).expect("open");
        let all = list_names(fd.as_fd(), u64::MAX).expect("list");
        assert_eq!(all.names, [c"a", c"a.b", c"b", c"c"].map(CStr::to_owned));
        assert!(all.complete);
        // Read again from the start, and cut at the bound.
        let some = list_names(fd.as_fd(), 3).expect("list");
        assert_eq!(some.names.len(), 3);
        assert!(!some.complete);
        let exact = list_names(fd.as_fd(), 4).expect("list");
        assert!(exact.complete);
    }
}
