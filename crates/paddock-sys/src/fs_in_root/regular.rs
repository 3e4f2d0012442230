//! Regular files inside a [`Root`], for code that must not trust the tree: read bounded, never through
//! a symlink, never opening a fifo or device for reading; replaced, never written through.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};

use super::{resolve_with, Owner, Root};

/// How symlinks on the way to a file are treated (both always stay inside the root and refuse
/// `/proc`-style magic links).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Any symlink on the way, final component included, fails with `ELOOP`: for trees a sandbox
    /// wrote, where a symlink is never what the host meant.
    Refuse,
    /// Symlinks are followed, resolved inside the root (an absolute target names a path of the
    /// root): for trees the operator provides, such as a `--rootfs` directory.
    FollowInRoot,
}

impl Root {
    /// Opens the regular file `path` for reading. It is first opened `O_PATH` (which has no effect on
    /// a fifo or device: nothing waits for a writer, no driver is called), checked with `fstat` to be a
    /// regular file (else `InvalidInput`, "not a regular file"), and only then opened for reading,
    /// through `/proc/self/fd` (the same inode: nothing can be swapped in between).
    pub fn open_regular(&self, path: &Path, symlinks: Symlinks) -> io::Result<File> {
        let pathfd = resolve_with(
            self.fd.as_fd(),
            path.as_os_str(),
            // No O_NOFOLLOW: with it, RESOLVE_NO_SYMLINKS would hand back an O_PATH descriptor of a
            // final symlink instead of refusing it.
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            symlinks,
        )?;
        let st = rustix::fs::fstat(&pathfd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(not_regular(path));
        }
        Ok(reopen(pathfd.as_fd(), OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK)?.into())
    }

    /// Reads the whole regular file `path` (see [`Root::open_regular`]), which must hold at most
    /// `max` bytes: a larger one fails with `FileTooLarge` after reading `max + 1` bytes, however
    /// large it claims to be or grows while read.
    pub fn read_regular(&self, path: &Path, max: u64, symlinks: Symlinks) -> io::Result<Vec<u8>> {
        let file = self.open_regular(path, symlinks)?;
        let mut content = Vec::new();
        file.take(max.saturating_add(1)).read_to_end(&mut content)?;
        if content.len() as u64 > max {
            return Err(io::Error::new(
                io::ErrorKind::FileTooLarge,
                format!("{} holds more than {max} bytes", path.display()),
            ));
        }
        Ok(content)
    }

    /// Puts a new regular file holding `content` at `path`, with `owner` and exactly `mode`, in place
    /// of whatever the name is now (a file, symlink, fifo or socket is unlinked, a directory removed
    /// with everything below it, never followed); the parent is resolved inside the root. The file is
    /// created with `O_CREAT | O_EXCL`, so it is always a new inode, never one a sandbox holds open.
    pub fn replace_file(
        &self,
        path: &Path,
        content: &[u8],
        mode: u32,
        owner: Option<Owner>,
    ) -> io::Result<()> {
        // `remove_tree` unlinks anything but a directory, never following it; nothing there is fine.
        match self.remove_tree(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = self.create_new(path, mode, owner)?;
        file.write_all(content)
    }

    /// Opens the directory `path` as a root of its own, with no symlink on the way (`ELOOP`): for a
    /// subdirectory of a tree a sandbox wrote, such as a volume's `etc`.
    pub fn open_dir(&self, path: &Path) -> io::Result<Root> {
        let fd = resolve_with(
            self.fd.as_fd(),
            path.as_os_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            Symlinks::Refuse,
        )?;
        Ok(Root { fd })
    }

    /// The root's own descriptor (`O_PATH`).
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Opens the regular file `name` of the directory `dir` for reading, as [`Root::open_regular`] does
/// (`O_PATH` first, never following a symlink, a fifo or device refused by `fstat` before anything
/// else, then reopened `O_RDONLY | O_NONBLOCK`); for walks ([`super::walk_tree`]) that hold the
/// directory. Returns the file and its `fstat`.
pub fn open_regular_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<(File, rustix::fs::Stat)> {
    let pathfd = rustix::fs::openat(
        dir,
        name,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&pathfd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(not_regular(Path::new(name)));
    }
    let file = reopen(pathfd.as_fd(), OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK)?;
    Ok((file.into(), st))
}

/// Opens the file `fd` refers to (typically an `O_PATH` descriptor) anew with `flags` (`O_CLOEXEC`
/// added), through its `/proc/self/fd` entry: the same inode, with new access. Neither `O_CREAT`
/// nor `O_TRUNC` make sense here and are refused.
pub fn reopen(fd: BorrowedFd<'_>, flags: OFlags) -> io::Result<OwnedFd> {
    if flags.intersects(OFlags::CREATE | OFlags::TRUNC) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "reopen cannot create or truncate",
        ));
    }
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    Ok(rustix::fs::openat(
        rustix::fs::CWD,
        OsStr::new(&path),
        flags | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn not_regular(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{} is not a regular file", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn tree() -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("etc")).expect("mkdir");
        std::fs::write(dir.path().join("etc/hostname"), "inside\n").expect("write");
        let root = Root::open(dir.path()).expect("root");
        (dir, root)
    }

    #[test]
    fn reads_a_regular_file_within_its_bound() {
        let (_dir, root) = tree();
        let read = root
            .read_regular(Path::new("etc/hostname"), 7, Symlinks::Refuse)
            .expect("read");
        assert_eq!(read, b"inside\n");
        let err = root
            .read_regular(Path::new("/etc/hostname"), 6, Symlinks::Refuse)
            .expect_err("over the bound");
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
    }

    #[test]
    fn refuses_symlinks_anywhere_on_the_way() {
        let (dir, root) = tree();
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("secret"), "host\n").expect("write");
        symlink(outside.path().join("secret"), dir.path().join("etc/final")).expect("symlink");
        symlink("hostname", dir.path().join("etc/relative")).expect("symlink");
        symlink(outside.path(), dir.path().join("via")).expect("symlink");
        symlink("etc", dir.path().join("inside")).expect("symlink");
        for path in ["etc/final", "etc/relative", "via/secret", "inside/hostname"] {
            let err = root
                .read_regular(Path::new(path), 1 << 20, Symlinks::Refuse)
                .expect_err(path);
            assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{path}: {err}");
        }
        // Followed inside the root when asked: the link to the host file names a path of the root.
        let err = root
            .read_regular(Path::new("etc/final"), 1 << 20, Symlinks::FollowInRoot)
            .expect_err("no such path in the root");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let inside = root
            .read_regular(Path::new("inside/hostname"), 1 << 20, Symlinks::FollowInRoot)
            .expect("inside");
        assert_eq!(inside, b"inside\n");
    }

    #[test]
    fn never_opens_a_fifo_or_device_for_reading() {
        let (dir, root) = tree();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("etc/fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        // No writer: an open for reading without O_NONBLOCK would wait forever.
        let err = root
            .read_regular(Path::new("etc/fifo"), 16, Symlinks::Refuse)
            .expect_err("a fifo");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        std::fs::create_dir(dir.path().join("etc/dir")).expect("mkdir");
        let err = root
            .read_regular(Path::new("etc/dir"), 16, Symlinks::Refuse)
            .expect_err("a directory");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        // A device reached through a confined symlink: refused by type, never opened for reading.
        let dev = Root::open(Path::new("/")).expect("/");
        let err = dev
            .read_regular(Path::new("/dev/zero"), 16, Symlinks::FollowInRoot)
            .expect_err("a device");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    }

    #[test]
    fn replace_file_puts_a_new_file_in_place_of_anything() {
        let (dir, root) = tree();
        let outside = tempfile::tempdir().expect("outside");
        let target = outside.path().join("target");
        std::fs::write(&target, "host\n").expect("write");
        symlink(&target, dir.path().join("etc/link")).expect("symlink");
        std::fs::create_dir_all(dir.path().join("etc/dir/sub")).expect("mkdir");
        symlink(outside.path(), dir.path().join("etc/dir/sub/out")).expect("symlink");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("etc/fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        for name in ["etc/link", "etc/dir", "etc/fifo", "etc/hostname", "etc/new"] {
            root.replace_file(Path::new(name), b"fresh\n", 0o640, None)
                .expect(name);
            let st = std::fs::symlink_metadata(dir.path().join(name)).expect(name);
            assert!(st.is_file(), "{name}");
            assert_eq!(
                std::os::unix::fs::PermissionsExt::mode(&st.permissions()) & 0o7777,
                0o640
            );
            assert_eq!(std::fs::read(dir.path().join(name)).expect(name), b"fresh\n");
        }
        assert_eq!(
            std::fs::read(&target).expect("target"),
            b"host\n",
            "never written through"
        );
        assert!(outside.path().exists());
    }

    #[test]
    fn open_dir_refuses_a_symlinked_directory() {
        let (dir, root) = tree();
        let outside = tempfile::tempdir().expect("outside");
        symlink(outside.path(), dir.path().join("link")).expect("symlink");
        let err = root.open_dir(Path::new("link")).expect_err("a symlink");
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        let etc = root.open_dir(Path::new("etc")).expect("etc");
        assert_eq!(
            etc.read_regular(Path::new("hostname"), 64, Symlinks::Refuse)
                .expect("read"),
            b"inside\n"
        );
    }

    #[test]
    fn open_regular_at_refuses_symlinks_and_fifos() {
        let (dir, _root) = tree();
        symlink("hostname", dir.path().join("etc/link")).expect("symlink");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            dir.path().join("etc/fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .expect("mkfifo");
        let etc = rustix::fs::open(dir.path().join("etc"), OFlags::PATH, Mode::empty()).expect("etc");
        let (mut f, st) = open_regular_at(etc.as_fd(), OsStr::new("hostname")).expect("a file");
        assert_eq!(st.st_size, 7);
        let mut s = String::new();
        f.read_to_string(&mut s).expect("read");
        assert_eq!(s, "inside\n");
        for name in ["link", "fifo"] {
            let err = open_regular_at(etc.as_fd(), OsStr::new(name)).expect_err(name);
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name}: {err}");
        }
    }

    #[test]
    fn reopen_keeps_the_inode_and_refuses_creation() {
        let (dir, _root) = tree();
        let path =
            rustix::fs::open(dir.path().join("etc/hostname"), OFlags::PATH, Mode::empty()).expect("open");
        let mut f = File::from(reopen(path.as_fd(), OFlags::RDONLY).expect("reopen"));
        let mut s = String::new();
        f.read_to_string(&mut s).expect("read");
        assert_eq!(s, "inside\n");
        assert!(reopen(path.as_fd(), OFlags::WRONLY | OFlags::TRUNC).is_err());
    }
}
