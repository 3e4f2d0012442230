//! File operations confined to a directory tree, immune to symlink and `..` escapes.
//!
//! A [`Root`] holds an `O_PATH` descriptor of the confining directory. Every path is resolved by the
//! kernel with `openat2(2)` and `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` relative to that
//! descriptor: absolute paths, absolute symlink targets and `..` all stop at the root, and
//! `/proc/<pid>/root`-style magic links fail with `ELOOP`. Operations on a name (mkdir, unlink,
//! rename, lstat, readlink) resolve only the *parent* that way and then act on the final component
//! with an `*at` call that never follows it; final components `.`, `..` and the empty name are
//! refused (`InvalidInput`). Recursive removal walks directory descriptors opened with `O_NOFOLLOW`,
//! so a symlink inside the tree is removed, never followed.
//!
//! For the host's own code touching trees a sandbox wrote (its volume, snapshots, stopped copies,
//! imports): [`Root::read_regular`] reads a regular file, bounded, with no symlink anywhere on the
//! way, without ever opening a fifo or device for reading; [`Root::replace_file`] puts a new file in
//! place of whatever is there; [`open_regular_at`] does what `read_regular` does for one name of an
//! open directory. The primitives every walk of such a tree is built on are here too: the one
//! no-follow directory open ([`open_dir_at`]) and the listing ([`list_names`]). The walker itself
//! is `paddock-runtime`'s (`native/walk/`); [`Root::remove_tree`] walks on its own because the
//! agent uses it too (`remove.rs`).
//!
//! Everything goes through rustix's safe wrappers; this module has no `unsafe` of its own.
//!
//! What this module does not do: decide which user may touch what (the caller runs with the
//! privileges it has), translate paths relative to a home directory, or map errors to a protocol.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

mod dir;
mod regular;
mod remove;

pub use dir::{is_not_a_dir, list_names, open_dir_at, Names};
pub use regular::{open_regular_at, reopen, Symlinks};

/// Removes `name` in the open directory `parent` and, if it is a directory, everything below it, as
/// [`Root::remove_tree`] does (no symlink followed, one directory descriptor at a time, a loop rather
/// than a recursion); for code that already holds the directory, reached without following a symlink
/// (an image layer replacing or whiting out an entry). A missing `name` is an error (`ENOENT`).
pub fn remove_tree_at(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    remove::remove_entry_tree(parent, name)
}

/// How many times a resolution is retried when the kernel reports a concurrent rename (`EAGAIN`).
const RESOLVE_RETRIES: usize = 16;

/// A directory that confines path resolution (`openat2` with `RESOLVE_IN_ROOT`).
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
}

/// What kind of file system object an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (never followed).
    Symlink,
    /// Device, FIFO or socket.
    Other,
}

/// Metadata of one entry, `lstat`-style (a symlink is described, not followed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryStat {
    /// Final path component (`/` for the root itself).
    pub name: OsString,
    /// Kind of object.
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits including setuid, setgid and sticky.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time, milliseconds since the Unix epoch.
    pub mtime_ms: i64,
    /// Target of a symlink.
    pub symlink_target: Option<OsString>,
}

/// Owner given to newly created files and directories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

impl Root {
    /// Opens `dir` (`O_PATH | O_DIRECTORY`) as the confining root.
    pub fn open(dir: &Path) -> io::Result<Self> {
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self { fd })
    }

    /// Resolves `path` inside the root and opens it with `flags` (`O_CLOEXEC` is always added);
    /// `mode` applies when `O_CREAT` creates the file. The final component is followed (within the
    /// root) unless `flags` has `O_NOFOLLOW`.
    pub fn open_with(&self, path: &Path, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
        resolve(
            self.fd.as_fd(),
            path.as_os_str(),
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
    }

    /// Opens an existing file for reading (`O_RDONLY | O_NOCTTY | O_NONBLOCK`, so a FIFO cannot block
    /// the caller).
    pub fn open_read(&self, path: &Path) -> io::Result<File> {
        Ok(self
            .open_with(path, OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK, 0)?
            .into())
    }

    /// Opens an existing file for writing (`O_WRONLY | O_NOCTTY | O_NONBLOCK`).
    pub fn open_write(&self, path: &Path) -> io::Result<File> {
        Ok(self
            .open_with(path, OFlags::WRONLY | OFlags::NOCTTY | OFlags::NONBLOCK, 0)?
            .into())
    }

    /// Creates a new file for writing (`O_CREAT | O_EXCL`, so an existing name, even a dangling
    /// symlink, fails with `EEXIST`), then gives it `owner` and exactly `mode` (no umask).
    pub fn create_new(&self, path: &Path, mode: u32, owner: Option<Owner>) -> io::Result<File> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOCTTY;
        let fd = self.open_with(path, flags, mode & 0o777)?;
        set_owner_and_mode(fd.as_fd(), owner, mode)?;
        Ok(fd.into())
    }

    /// Describes `path` without following a final symlink (`fstatat(AT_SYMLINK_NOFOLLOW)` on the
    /// resolved parent, plus `readlinkat` for symlinks). The root itself is described as `/`.
    pub fn lstat(&self, path: &Path) -> io::Result<EntryStat> {
        if is_root_path(path.as_os_str()) {
            let st = rustix::fs::fstat(&self.fd)?;
            return Ok(entry_stat(OsString::from("/"), &st, None));
        }
        let (parent, name) = self.open_parent(path)?;
        stat_entry(parent.as_fd(), &name)
    }

    /// Lists a directory: every entry except `.` and `..`, described `lstat`-style, sorted by name.
    /// An entry that vanishes while listing is skipped.
    pub fn list_dir(&self, path: &Path) -> io::Result<Vec<EntryStat>> {
        let fd = self.open_with(path, OFlags::RDONLY | OFlags::DIRECTORY, 0)?;
        let mut entries = Vec::new();
        for name in list_names(fd.as_fd(), u64::MAX)?.names {
            let name = OsString::from_vec(name.into_bytes());
            match stat_entry(fd.as_fd(), &name) {
                Ok(stat) => entries.push(stat),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// Creates one directory (`mkdirat` in the resolved parent), then gives it `owner` and exactly
    /// `mode`.
    pub fn mkdir(&self, path: &Path, mode: u32, owner: Option<Owner>) -> io::Result<()> {
        let (parent, name) = self.open_parent(path)?;
        make_dir(parent.as_fd(), &name, mode, owner)
    }

    /// Creates a directory and its missing parents (each new one with `owner` and `mode`); succeeds
    /// when the directory exists already. Fails with `ENOTDIR` when a component is not a directory.
    pub fn mkdir_all(&self, path: &Path, mode: u32, owner: Option<Owner>) -> io::Result<()> {
        let bytes = path.as_os_str().as_bytes();
        let mut prefix: Vec<u8> = if bytes.starts_with(b"/") {
            b"/".to_vec()
        } else {
            Vec::new()
        };
        for component in bytes
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
        {
            if !prefix.is_empty() && !prefix.ends_with(b"/") {
                prefix.push(b'/');
            }
            prefix.extend_from_slice(component);
            if component == b".." {
                // Resolved by openat2 (clamped at the root); nothing to create.
                continue;
            }
            let current = Path::new(OsStr::from_bytes(&prefix));
            match self.open_with(current, OFlags::PATH | OFlags::DIRECTORY, 0) {
                Ok(_) => continue,
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
            match self.mkdir(current, mode, owner) {
                Ok(()) => {}
                // Created concurrently, or a dangling symlink: the next open tells which.
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    self.open_with(current, OFlags::PATH | OFlags::DIRECTORY, 0)?;
                }
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Removes a file, symlink or empty directory (`unlinkat` in the resolved parent; the final
    /// component is never followed).
    pub fn remove(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = self.open_parent(path)?;
        let st = rustix::fs::statat(&parent, name.as_os_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        let flags = if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
            AtFlags::REMOVEDIR
        } else {
            AtFlags::empty()
        };
        Ok(rustix::fs::unlinkat(&parent, name.as_os_str(), flags)?)
    }

    /// Removes `path` and, if it is a directory, everything below it. Descends through directory
    /// descriptors opened with `O_NOFOLLOW | O_DIRECTORY`, so symlinks are unlinked, never followed,
    /// even if an entry is swapped for a symlink during the walk; holds one directory descriptor at
    /// a time however deep the tree (back up through `..`, checked to be the directory it came
    /// from: a tree rearranged meanwhile fails the removal rather than lead it elsewhere). Entries
    /// that vanish concurrently are ignored.
    pub fn remove_tree(&self, path: &Path) -> io::Result<()> {
        let (parent, name) = self.open_parent(path)?;
        remove::remove_entry_tree(parent.as_fd(), &name)
    }

    /// Renames `from` to `to` (`renameat`, replacing an existing `to`); both parents are resolved
    /// inside the root and neither final component is followed.
    /// Creates the symbolic link `path` (its parent resolved inside the root) pointing at `target`,
    /// owned by `owner`. The target is stored as given and never followed here: it resolves when
    /// the link is used, inside the sandbox that uses it. Fails with `EEXIST` when `path` exists.
    pub fn symlink(&self, path: &Path, target: &OsStr, owner: Option<Owner>) -> io::Result<()> {
        let (parent, name) = self.open_parent(path)?;
        rustix::fs::symlinkat(target, &parent, name.as_os_str())?;
        if let Some(owner) = owner {
            rustix::fs::chownat(
                &parent,
                name.as_os_str(),
                Some(rustix::fs::Uid::from_raw(owner.uid)),
                Some(rustix::fs::Gid::from_raw(owner.gid)),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
            )?;
        }
        Ok(())
    }

    pub fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let (from_parent, from_name) = self.open_parent(from)?;
        let (to_parent, to_name) = self.open_parent(to)?;
        Ok(rustix::fs::renameat(
            &from_parent,
            from_name.as_os_str(),
            &to_parent,
            to_name.as_os_str(),
        )?)
    }

    /// Resolves the parent directory of `path` inside the root and returns it (opened `O_PATH`) with
    /// the final component. Trailing slashes are ignored; a final component of `.`, `..` or nothing
    /// (the root itself) is refused with `InvalidInput`.
    pub fn open_parent(&self, path: &Path) -> io::Result<(OwnedFd, OsString)> {
        let (parent, name) = split_parent(path.as_os_str())?;
        let fd = resolve(
            self.fd.as_fd(),
            parent,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok((fd, name.to_os_string()))
    }
}

/// `openat2(dirfd, path, flags, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`, retried on `EAGAIN`
/// (a concurrent rename or mount was detected during `..` resolution).
fn resolve(dirfd: BorrowedFd<'_>, path: &OsStr, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
    resolve_with(dirfd, path, flags, mode, Symlinks::FollowInRoot)
}

/// [`resolve`], refusing every symlink on the way (`RESOLVE_NO_SYMLINKS`, `ELOOP`) with
/// [`Symlinks::Refuse`].
fn resolve_with(
    dirfd: BorrowedFd<'_>,
    path: &OsStr,
    flags: OFlags,
    mode: Mode,
    symlinks: Symlinks,
) -> io::Result<OwnedFd> {
    let resolve = match symlinks {
        Symlinks::FollowInRoot => ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        Symlinks::Refuse => ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_SYMLINKS,
    };
    let path = if path.is_empty() { OsStr::new(".") } else { path };
    let mut attempt = 0;
    loop {
        match rustix::fs::openat2(dirfd, path, flags, mode, resolve) {
            Err(rustix::io::Errno::AGAIN) if attempt < RESOLVE_RETRIES => attempt += 1,
            other => return Ok(other?),
        }
    }
}

/// Whether `path` names the root itself (only slashes and `.` components).
fn is_root_path(path: &OsStr) -> bool {
    path.as_bytes()
        .split(|&b| b == b'/')
        .all(|c| c.is_empty() || c == b".")
}

/// Splits `path` into its parent (possibly empty, meaning the root) and final component.
fn split_parent(path: &OsStr) -> io::Result<(&OsStr, &OsStr)> {
    let bytes = path.as_bytes();
    let trimmed_len = bytes.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
    let trimmed = &bytes[..trimmed_len];
    let (parent, name) = match trimmed.iter().rposition(|&b| b == b'/') {
        Some(i) => (&trimmed[..=i], &trimmed[i + 1..]),
        None => (&b""[..], trimmed),
    };
    if name.is_empty() || name == b"." || name == b".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the final path component must be a name (not empty, `.` or `..`)",
        ));
    }
    Ok((OsStr::from_bytes(parent), OsStr::from_bytes(name)))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)` plus `readlinkat` for a symlink.
fn stat_entry(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<EntryStat> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)?;
    let target = if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
        let target = rustix::fs::readlinkat(dir, name, Vec::new())?;
        Some(OsString::from_vec(target.into_bytes()))
    } else {
        None
    };
    Ok(entry_stat(name.to_os_string(), &st, target))
}

fn entry_stat(name: OsString, st: &rustix::fs::Stat, symlink_target: Option<OsString>) -> EntryStat {
    let kind = match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Dir,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    EntryStat {
        name,
        kind,
        size: st.st_size.max(0) as u64,
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime_ms: st.st_mtime.saturating_mul(1000) + (st.st_mtime_nsec / 1_000_000) as i64,
        symlink_target,
    }
}

/// `fchown` (when an owner is given) then `fchmod`, in that order because `chown` clears setuid bits.
fn set_owner_and_mode(fd: BorrowedFd<'_>, owner: Option<Owner>, mode: u32) -> io::Result<()> {
    if let Some(owner) = owner {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(owner.uid)),
            Some(rustix::fs::Gid::from_raw(owner.gid)),
        )?;
    }
    Ok(rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & 0o7777))?)
}

/// `mkdirat(parent, name)`, then opens the new directory without following it and sets its owner and
/// exact mode.
fn make_dir(parent: BorrowedFd<'_>, name: &OsStr, mode: u32, owner: Option<Owner>) -> io::Result<()> {
    rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode & 0o777))?;
    let dir = open_dir_at(parent, name)?;
    set_owner_and_mode(dir.as_fd(), owner, mode)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::fs::symlink;

    use super::*;

    fn setup() -> (tempfile::TempDir, Root) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("etc")).expect("mkdir etc");
        std::fs::write(dir.path().join("etc/passwd"), b"inside\n").expect("write passwd");
        let root = Root::open(dir.path()).expect("open root");
        (dir, root)
    }

    fn read_all(root: &Root, path: &str) -> io::Result<String> {
        let mut s = String::new();
        root.open_read(Path::new(path))?.read_to_string(&mut s)?;
        Ok(s)
    }

    #[test]
    fn dotdot_and_absolute_symlinks_stay_inside() {
        let (dir, root) = setup();
        assert_eq!(read_all(&root, "../../etc/passwd").expect("read"), "inside\n");
        assert_eq!(read_all(&root, "/../etc/passwd").expect("read"), "inside\n");
        symlink("/etc", dir.path().join("x")).expect("symlink");
        assert_eq!(read_all(&root, "/x/passwd").expect("read"), "inside\n");
        std::fs::create_dir(dir.path().join("a")).expect("mkdir");
        symlink("../../../../../../etc", dir.path().join("a/up")).expect("symlink");
        assert_eq!(read_all(&root, "a/up/passwd").expect("read"), "inside\n");
    }

    #[test]
    fn symlinks_are_made_inside_with_their_target_as_given() {
        let (dir, root) = setup();
        // Through a parent that is itself a link out: it resolves inside the root.
        symlink("/etc", dir.path().join("out")).expect("symlink");
        root.symlink(Path::new("/out/link"), OsStr::new("/etc/passwd"), None)
            .expect("make a link");
        let made = dir.path().join("etc/link");
        assert_eq!(
            std::fs::read_link(&made).expect("read link"),
            Path::new("/etc/passwd")
        );
        assert_eq!(read_all(&root, "/etc/link").expect("read through"), "inside\n");
        let again = root.symlink(Path::new("/etc/link"), OsStr::new("x"), None);
        assert_eq!(again.expect_err("exists").kind(), io::ErrorKind::AlreadyExists);
    }

    #[test]
    fn magic_links_are_refused() {
        let root = Root::open(Path::new("/")).expect("open /");
        let err = root
            .open_read(Path::new("/proc/self/root/etc/hostname"))
            .expect_err("magic link");
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
    }

    #[test]
    fn create_write_and_stat() {
        let (dir, root) = setup();
        let mut f = root
            .create_new(Path::new("/new.txt"), 0o640, None)
            .expect("create");
        f.write_all(b"hello").expect("write");
        assert!(root.create_new(Path::new("/new.txt"), 0o640, None).is_err());
        let st = root.lstat(Path::new("new.txt")).expect("stat");
        assert_eq!((st.kind, st.size, st.mode), (EntryKind::File, 5, 0o640));
        symlink("/nowhere", dir.path().join("dangling")).expect("symlink");
        let st = root.lstat(Path::new("/dangling")).expect("lstat");
        assert_eq!(st.kind, EntryKind::Symlink);
        assert_eq!(st.symlink_target.as_deref(), Some(OsStr::new("/nowhere")));
        assert_eq!(root.lstat(Path::new("/")).expect("root").kind, EntryKind::Dir);
    }

    #[test]
    fn final_component_must_be_a_name() {
        let (_dir, root) = setup();
        for bad in ["/", "", ".", "a/..", "etc/."] {
            let err = root.remove(Path::new(bad)).expect_err(bad);
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn mkdir_all_list_and_rename() {
        let (_dir, root) = setup();
        root.mkdir_all(Path::new("/a/b/../c/d"), 0o750, None)
            .expect("mkdir -p");
        root.mkdir_all(Path::new("/a/c/d"), 0o750, None).expect("exists");
        let names: Vec<_> = root
            .list_dir(Path::new("/a"))
            .expect("list")
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, vec![OsString::from("b"), OsString::from("c")]);
        assert_eq!(root.lstat(Path::new("/a/c/d")).expect("stat").mode, 0o750);
        root.rename(Path::new("/a/c"), Path::new("/e")).expect("rename");
        assert_eq!(root.lstat(Path::new("/e/d")).expect("stat").kind, EntryKind::Dir);
        let err = root
            .mkdir_all(Path::new("/etc/passwd/x"), 0o755, None)
            .expect_err("not a dir");
        assert_eq!(err.raw_os_error(), Some(libc::ENOTDIR));
    }

    #[test]
    fn remove_tree_does_not_follow_symlinks() {
        let (dir, root) = setup();
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join("keep"), b"x").expect("write");
        std::fs::create_dir_all(dir.path().join("t/sub")).expect("mkdir");
        std::fs::write(dir.path().join("t/sub/f"), b"x").expect("write");
        symlink(outside.path(), dir.path().join("t/link")).expect("symlink");
        symlink(outside.path(), dir.path().join("t/sub/link2")).expect("symlink");
        root.remove_tree(Path::new("/t")).expect("remove tree");
        assert!(!dir.path().join("t").exists());
        assert!(outside.path().join("keep").exists());
        assert!(root.remove(Path::new("/etc")).is_err(), "non-empty dir");
    }
}
