//! Mount operations for building a sandbox's root inside its own mount namespace.
//!
//! Each function makes one `mount(2)`, `mount_setattr(2)`, `pivot_root(2)` or `umount2(2)` call and
//! returns an `io::Error` carrying the target path. Per-mount attributes are changed with
//! `mount_setattr(2)`, which (unlike a `MS_REMOUNT|MS_BIND` remount) only touches the attributes named,
//! so flags the kernel locked when the mount was copied into a user namespace are never cleared by
//! accident.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

fn with_path(path: &Path, what: &str, e: impl Into<io::Error>) -> io::Error {
    let e: io::Error = e.into();
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

/// Per-mount attributes to set with `mount_setattr(2)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MountAttrs {
    /// Read-only.
    pub readonly: bool,
    /// Ignore setuid/setgid bits and file capabilities.
    pub nosuid: bool,
    /// Ignore device nodes.
    pub nodev: bool,
    /// Forbid exec.
    pub noexec: bool,
}

impl MountAttrs {
    /// Read-only, nosuid, nodev: the attributes of every host directory shown in a sandbox.
    pub const READ_ONLY_SYSTEM: Self = Self {
        readonly: true,
        nosuid: true,
        nodev: true,
        noexec: false,
    };
    /// Writable, nosuid, nodev: the attributes of a sandbox's private writable directories.
    pub const WRITABLE: Self = Self {
        readonly: false,
        nosuid: true,
        nodev: true,
        noexec: false,
    };

    fn bits(self) -> u64 {
        let mut bits = 0u64;
        if self.readonly {
            bits |= libc::MOUNT_ATTR_RDONLY;
        }
        if self.nosuid {
            bits |= libc::MOUNT_ATTR_NOSUID;
        }
        if self.nodev {
            bits |= libc::MOUNT_ATTR_NODEV;
        }
        if self.noexec {
            bits |= libc::MOUNT_ATTR_NOEXEC;
        }
        bits
    }

    fn mount_flags(self) -> MountFlags {
        let mut flags = MountFlags::empty();
        if self.readonly {
            flags |= MountFlags::RDONLY;
        }
        if self.nosuid {
            flags |= MountFlags::NOSUID;
        }
        if self.nodev {
            flags |= MountFlags::NODEV;
        }
        if self.noexec {
            flags |= MountFlags::NOEXEC;
        }
        flags
    }
}

/// Makes every mount under `/` private (recursively), so nothing done in this mount namespace
/// propagates back to the host's.
pub fn make_private_recursive() -> io::Result<()> {
    rustix::mount::mount_change("/", MountPropagationFlags::PRIVATE | MountPropagationFlags::REC)
        .map_err(|e| with_path(Path::new("/"), "failed to make mounts private under", e))
}

/// Makes the mount at `target` (alone) private: mounts made under it propagate nowhere, and none
/// propagate into it.
pub fn make_private(target: &Path) -> io::Result<()> {
    rustix::mount::mount_change(target, MountPropagationFlags::PRIVATE)
        .map_err(|e| with_path(target, "failed to make private", e))
}

/// Bind-mounts `source` onto `target` (recursively when `recursive`).
pub fn bind(source: &Path, target: &Path, recursive: bool) -> io::Result<()> {
    let r = if recursive {
        rustix::mount::mount_bind_recursive(source, target)
    } else {
        rustix::mount::mount_bind(source, target)
    };
    r.map_err(|e| with_path(target, &format!("failed to bind {} onto", source.display()), e))
}

/// Sets `attrs` on the mount at `target` (and every mount beneath it when `recursive`), leaving other
/// attributes as they are. One `mount_setattr(2)` call.
pub fn set_attrs(target: &Path, attrs: MountAttrs, recursive: bool) -> io::Result<()> {
    let c_target = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))?;
    let mut flags = libc::AT_NO_AUTOMOUNT | libc::AT_SYMLINK_NOFOLLOW;
    if recursive {
        flags |= libc::AT_RECURSIVE;
    }
    mount_setattr(libc::AT_FDCWD, &c_target, flags, attrs)
        .map_err(|e| with_path(target, "failed to set mount attributes on", e))
}

/// `mount_setattr(dirfd, path, flags, {attr_set: attrs})`.
fn mount_setattr(
    dirfd: libc::c_int,
    path: &std::ffi::CStr,
    flags: libc::c_int,
    attrs: MountAttrs,
) -> io::Result<()> {
    #[repr(C)]
    struct MountAttr {
        attr_set: u64,
        attr_clr: u64,
        propagation: u64,
        userns_fd: u64,
    }
    let attr = MountAttr {
        attr_set: attrs.bits(),
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `path` is a NUL-terminated string and `attr` a properly laid out `struct mount_attr`,
    // both alive for the duration of the call; the size argument is the size of that struct; `dirfd`
    // is AT_FDCWD or a descriptor the caller borrows for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Binds the tree mounted at `source` (recursively) onto the directory `target`, an `O_PATH`
/// descriptor the caller resolved (for instance confined to a root with `openat2`): the tree is
/// cloned detached (`open_tree(OPEN_TREE_CLONE | AT_RECURSIVE)`), `attrs` are set on every mount of
/// the copy before anything can see it, and the copy is attached with `move_mount` onto the
/// descriptor, so the target is never looked up by path again (no symlink swapped in between can
/// redirect it).
pub fn bind_tree_onto(source: &Path, target: BorrowedFd<'_>, attrs: MountAttrs) -> io::Result<()> {
    use rustix::mount::{MoveMountFlags, OpenTreeFlags};
    let tree = rustix::mount::open_tree(
        rustix::fs::CWD,
        source,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_RECURSIVE,
    )
    .map_err(|e| with_path(source, "failed to clone the mount tree of", e))?;
    mount_setattr(
        tree.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
        attrs,
    )
    .map_err(|e| with_path(source, "failed to set mount attributes on a clone of", e))?;
    rustix::mount::move_mount(
        tree.as_fd(),
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| with_path(source, "failed to attach a clone of", e))
}

/// A new mount of the file (or directory) `file` alone, attached nowhere: `open_tree(file, "",
/// AT_EMPTY_PATH | OPEN_TREE_CLONE)`, which returns an `O_PATH` descriptor of the same inode as the
/// root of the clone. The kernel names a file on such a mount relative to the mount's root, so a
/// process holding it (its executable, an open descriptor, a mapping) shows `/` in
/// `/proc/<pid>/exe`, `fd/` and `maps` instead of the file's path on the host. The mount lives as
/// long as a descriptor or mapping refers to it; its attributes are the original mount's.
pub fn clone_detached(file: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    use rustix::mount::OpenTreeFlags;
    Ok(rustix::mount::open_tree(
        file,
        "",
        OpenTreeFlags::AT_EMPTY_PATH | OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
    )?)
}

/// Mounts a new file system of type `fstype` (tmpfs, proc, devpts, mqueue) at `target`.
pub fn mount_fs(fstype: &str, target: &Path, attrs: MountAttrs, options: &str) -> io::Result<()> {
    let data =
        CString::new(options).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in options"))?;
    rustix::mount::mount(fstype, target, fstype, attrs.mount_flags(), Some(data.as_c_str()))
        .map_err(|e| with_path(target, &format!("failed to mount {fstype} at"), e))
}

/// Makes `new_root` the root of this mount namespace and detaches the old root entirely, leaving the
/// working directory at the new `/`. Uses the `pivot_root(".", ".")` idiom, which needs no directory
/// for the old root.
pub fn pivot_into(new_root: &Path) -> io::Result<()> {
    rustix::process::chdir(new_root).map_err(|e| with_path(new_root, "failed to chdir to", e))?;
    rustix::process::pivot_root(".", ".").map_err(|e| with_path(new_root, "failed to pivot_root to", e))?;
    rustix::mount::unmount(".", UnmountFlags::DETACH)
        .map_err(|e| with_path(Path::new("/"), "failed to detach the old root at", e))?;
    rustix::process::chdir("/").map_err(|e| with_path(Path::new("/"), "failed to chdir to", e))
}

/// Lazily unmounts `target` (`umount2(MNT_DETACH)`).
pub fn unmount_detach(target: &Path) -> io::Result<()> {
    rustix::mount::unmount(target, UnmountFlags::DETACH)
        .map_err(|e| with_path(target, "failed to unmount", e))
}

/// The `statfs(2)` magic number of the file system holding `path`.
pub fn fs_magic(path: &Path) -> io::Result<u64> {
    let st = rustix::fs::statfs(path).map_err(|e| with_path(path, "failed to statfs", e))?;
    Ok(st.f_type as u64)
}

/// `statfs` magic of cgroup2.
pub const CGROUP2_SUPER_MAGIC: u64 = 0x6367_7270;
/// `statfs` magic of tmpfs (`TMPFS_MAGIC`).
pub const TMPFS_MAGIC: u64 = 0x0102_1994;
