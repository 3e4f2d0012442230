//! btrfs subvolumes, snapshots and quota groups through the kernel's ioctls.
//!
//! The storage pool keeps one btrfs subvolume per sandbox root file system: a template is a read-only
//! snapshot, a sandbox is a writable snapshot of it (copy-on-write, constant time), and a quota group
//! caps how much a sandbox may write.
//!
//! No maintained crate wraps these ioctls without linking the C `libbtrfsutil`, so the argument
//! structures below are transcribed from `linux/btrfs.h` and the request numbers are built by nix's
//! `ioctl_*!` macros from the same `_IOW`/`_IOR`/`_IOWR` definitions the header uses. Every structure's
//! size is checked at compile time against the header.
//!
//! Errors are the kernel's `errno` unchanged (so callers can match `EEXIST`, `ENOENT`, `EDQUOT`...);
//! callers add the path and the operation to their own error type. Most operations need
//! `CAP_SYS_ADMIN`.
//!
//! Deleting a subvolume deletes the subvolumes nested in it too (`nested.rs`), found and deleted by
//! id, never by a path inside it.
//!
//! What this module does not do: create or mount the file system, scan devices, or send/receive.

mod nested;

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};

/// `BTRFS_IOCTL_MAGIC` from `linux/btrfs.h`.
const BTRFS_IOCTL_MAGIC: u8 = 0x94;
/// `BTRFS_PATH_NAME_MAX`: the name field of `btrfs_ioctl_vol_args` holds this many bytes plus a NUL.
const BTRFS_PATH_NAME_MAX: usize = 4087;
/// `BTRFS_SUBVOL_NAME_MAX`: the name field of `btrfs_ioctl_vol_args_v2` holds this many bytes plus a NUL.
const BTRFS_SUBVOL_NAME_MAX: usize = 4039;
/// `BTRFS_INO_LOOKUP_PATH_MAX`.
const BTRFS_INO_LOOKUP_PATH_MAX: usize = 4080;
/// `BTRFS_FIRST_FREE_OBJECTID`: the inode number of every subvolume's root directory.
const BTRFS_FIRST_FREE_OBJECTID: u64 = 256;
/// `BTRFS_SUBVOL_RDONLY`: snapshot flag and subvolume flag meaning "read-only".
const BTRFS_SUBVOL_RDONLY: u64 = 1 << 1;
/// `BTRFS_QUOTA_CTL_ENABLE`: full qgroup accounting (tracks shared extents, costly on large trees).
const BTRFS_QUOTA_CTL_ENABLE: u64 = 1;
/// `BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA` (Linux 6.7+): simple quotas, charging each extent to the
/// subvolume that wrote it. Not in Debian 12's kernel headers, hence the literal.
const BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA: u64 = 4;
/// `BTRFS_SUBVOL_QGROUP_INHERIT`: a snapshot's arguments carry a `struct btrfs_qgroup_inherit`.
const BTRFS_SUBVOL_QGROUP_INHERIT: u64 = 1 << 2;
/// `BTRFS_QGROUP_INHERIT_SET_LIMITS`: the inherit's `lim` becomes the new quota group's limits.
const BTRFS_QGROUP_INHERIT_SET_LIMITS: u64 = 1 << 0;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER`.
const BTRFS_QGROUP_LIMIT_MAX_RFER: u64 = 1 << 0;
/// `BTRFS_QGROUP_LIMIT_MAX_EXCL`.
const BTRFS_QGROUP_LIMIT_MAX_EXCL: u64 = 1 << 1;
/// `CLEAR_VALUE` in the kernel's qgroup code: a limit of `(u64)-1` removes that limit.
const QGROUP_LIMIT_CLEAR: u64 = u64::MAX;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; BTRFS_PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_vol_args_v2`. The kernel's first union (`size` + `qgroup_inherit`, or
/// `unused[4]`) is spelled as its first member and the rest, the second (`name`, `devid` or
/// `subvolid`) as `name`: we only ever pass a name.
#[repr(C)]
struct VolArgsV2 {
    fd: i64,
    transid: u64,
    flags: u64,
    /// Bytes at `qgroup_inherit` (with `BTRFS_SUBVOL_QGROUP_INHERIT`).
    size: u64,
    qgroup_inherit: *const QgroupInherit,
    unused: [u64; 2],
    name: [u8; BTRFS_SUBVOL_NAME_MAX + 1],
}

/// `struct btrfs_qgroup_inherit` with no `qgroups[]` after it (no higher-level group is joined).
#[repr(C)]
struct QgroupInherit {
    flags: u64,
    num_qgroups: u64,
    num_ref_copies: u64,
    num_excl_copies: u64,
    lim: QgroupLimitRaw,
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; BTRFS_INO_LOOKUP_PATH_MAX],
}

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimitRaw {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimitRaw,
}

/// `struct btrfs_ioctl_qgroup_create_args`.
#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

/// `BTRFS_FSID_SIZE`.
const BTRFS_FSID_SIZE: usize = 16;

/// `struct btrfs_ioctl_fs_info_args` (1 KiB; `flags` 0 asks for the base fields only).
#[repr(C)]
struct FsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; BTRFS_FSID_SIZE],
    nodesize: u32,
    sectorsize: u32,
    clone_alignment: u32,
    csum_type: u16,
    csum_size: u16,
    flags: u64,
    generation: u64,
    metadata_uuid: [u8; BTRFS_FSID_SIZE],
    reserved: [u8; 944],
}

// The request numbers encode the structure size, so a wrong layout is a wrong ioctl: check it.
const _: () = assert!(size_of::<VolArgs>() == 4096);
const _: () = assert!(size_of::<VolArgsV2>() == 4096);
const _: () = assert!(size_of::<InoLookupArgs>() == 4096);
const _: () = assert!(size_of::<QuotaCtlArgs>() == 16);
const _: () = assert!(size_of::<QgroupLimitRaw>() == 40);
const _: () = assert!(size_of::<QgroupInherit>() == 32 + 40);
const _: () = assert!(size_of::<QgroupLimitArgs>() == 8 + 40);
const _: () = assert!(size_of::<QgroupCreateArgs>() == 16);
const _: () = assert!(size_of::<FsInfoArgs>() == 1024);

/// The ioctl entry points, generated by nix from the header's definitions (magic, number, direction
/// and argument type). They are `unsafe fn`s: each call site says why its pointer is valid.
mod ioctls {
    use super::nested::SearchArgs;
    use super::BTRFS_IOCTL_MAGIC as MAGIC;
    use super::{
        FsInfoArgs, InoLookupArgs, QgroupCreateArgs, QgroupLimitArgs, QuotaCtlArgs, VolArgs, VolArgsV2,
    };

    nix::ioctl_none!(sync, MAGIC, 8);
    nix::ioctl_write_ptr!(subvol_create, MAGIC, 14, VolArgs);
    nix::ioctl_write_ptr!(snap_destroy, MAGIC, 15, VolArgs);
    nix::ioctl_readwrite!(tree_search, MAGIC, 17, SearchArgs);
    nix::ioctl_readwrite!(ino_lookup, MAGIC, 18, InoLookupArgs);
    nix::ioctl_write_ptr!(snap_create_v2, MAGIC, 23, VolArgsV2);
    nix::ioctl_read!(subvol_getflags, MAGIC, 25, u64);
    nix::ioctl_write_ptr!(subvol_setflags, MAGIC, 26, u64);
    nix::ioctl_readwrite!(quota_ctl, MAGIC, 40, QuotaCtlArgs);
    nix::ioctl_write_ptr!(qgroup_create, MAGIC, 42, QgroupCreateArgs);
    // The header really declares QGROUP_LIMIT as `_IOR` although userspace writes the argument.
    nix::ioctl_read!(qgroup_limit, MAGIC, 43, QgroupLimitArgs);
    nix::ioctl_read!(fs_info, MAGIC, 31, FsInfoArgs);
    nix::ioctl_write_ptr!(snap_destroy_v2, MAGIC, 63, VolArgsV2);
}

/// Limits for a subvolume's own level-0 quota group. `None` means "no limit" (an existing limit of
/// that kind is removed).
///
/// Under simple quotas (see [`enable_quota`]) referenced and exclusive usage are the same number:
/// each extent is charged to the subvolume that first wrote it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QgroupLimit {
    /// Maximum bytes exclusively owned by the subvolume (`max_excl`).
    pub max_exclusive: Option<u64>,
    /// Maximum bytes referenced by the subvolume, shared or not (`max_rfer`).
    pub max_referenced: Option<u64>,
}

/// Whether `path` lies on a btrfs file system (`statfs(2)`, `f_type == BTRFS_SUPER_MAGIC`).
pub fn is_btrfs(path: &Path) -> io::Result<bool> {
    Ok(rustix::fs::statfs(path)?.f_type == libc::BTRFS_SUPER_MAGIC)
}

/// Creates an empty subvolume `parent/name` (`BTRFS_IOC_SUBVOL_CREATE`).
///
/// `name` is a single path component. Fails with `EEXIST` if the name is taken.
pub fn create_subvolume(parent: &Path, name: &str) -> io::Result<()> {
    let mut args = VolArgs {
        fd: 0,
        name: [0; BTRFS_PATH_NAME_MAX + 1],
    };
    copy_name(&mut args.name, name)?;
    let dir = open_dir(parent)?;
    // SAFETY: `args` is a live, initialised `btrfs_ioctl_vol_args` (size checked above) whose name is
    // NUL-terminated by `copy_name`; the kernel only reads it during the call, and `dir` is open.
    unsafe { ioctls::subvol_create(dir.as_raw_fd(), &args) }?;
    Ok(())
}

/// Snapshots the subvolume `source` as `dest_parent/name` (`BTRFS_IOC_SNAP_CREATE_V2`), read-only when
/// `readonly` (`BTRFS_SUBVOL_RDONLY`).
///
/// `source` must be the root of a subvolume (`EINVAL` otherwise) on the same file system as
/// `dest_parent` (`EXDEV`). Snapshots are not recursive: nested subvolumes appear as empty directories.
pub fn snapshot_subvolume(source: &Path, dest_parent: &Path, name: &str, readonly: bool) -> io::Result<()> {
    let flags = if readonly { BTRFS_SUBVOL_RDONLY } else { 0 };
    snapshot(source, dest_parent, name, flags, None)
}

/// [`snapshot_subvolume`] (writable) whose new quota group gets `limit` in the snapshot's own
/// transaction (`BTRFS_SUBVOL_QGROUP_INHERIT` with `BTRFS_QGROUP_INHERIT_SET_LIMITS`): the snapshot
/// never exists without it, and no second call is needed. [`set_qgroup_limit`] right after a
/// snapshot joins the file system's running transaction, so while another commit is under way (other
/// snapshots being made) it waits for that commit too. A `None` in `limit` sets no limit of that kind.
/// Quotas must be enabled ([`enable_quota`]).
pub fn snapshot_subvolume_limited(
    source: &Path,
    dest_parent: &Path,
    name: &str,
    limit: QgroupLimit,
) -> io::Result<()> {
    let mut lim = QgroupLimitRaw {
        flags: 0,
        max_rfer: 0,
        max_excl: 0,
        rsv_rfer: 0,
        rsv_excl: 0,
    };
    if let Some(max) = limit.max_referenced {
        lim.flags |= BTRFS_QGROUP_LIMIT_MAX_RFER;
        lim.max_rfer = max;
    }
    if let Some(max) = limit.max_exclusive {
        lim.flags |= BTRFS_QGROUP_LIMIT_MAX_EXCL;
        lim.max_excl = max;
    }
    let inherit = QgroupInherit {
        flags: BTRFS_QGROUP_INHERIT_SET_LIMITS,
        num_qgroups: 0,
        num_ref_copies: 0,
        num_excl_copies: 0,
        lim,
    };
    snapshot(
        source,
        dest_parent,
        name,
        BTRFS_SUBVOL_QGROUP_INHERIT,
        Some(&inherit),
    )
}

fn snapshot(
    source: &Path,
    dest_parent: &Path,
    name: &str,
    flags: u64,
    inherit: Option<&QgroupInherit>,
) -> io::Result<()> {
    let src = open_dir(source)?;
    let mut args = VolArgsV2 {
        fd: i64::from(src.as_raw_fd()),
        transid: 0,
        flags,
        size: inherit.map_or(0, |_| size_of::<QgroupInherit>() as u64),
        qgroup_inherit: inherit.map_or(std::ptr::null(), std::ptr::from_ref),
        unused: [0; 2],
        name: [0; BTRFS_SUBVOL_NAME_MAX + 1],
    };
    copy_name(&mut args.name, name)?;
    let dest = open_dir(dest_parent)?;
    // SAFETY: `args` is a live, initialised `btrfs_ioctl_vol_args_v2` (size checked above) with a
    // NUL-terminated name and `fd` naming `src`, which stays open for the call. Its qgroup-inherit
    // pointer is null (and `BTRFS_SUBVOL_QGROUP_INHERIT` unset) or points to `inherit`, a live
    // `btrfs_qgroup_inherit` of exactly `size` bytes (no `qgroups[]`: `num_qgroups` is 0) borrowed for
    // the whole call. The kernel only reads both during the call.
    unsafe { ioctls::snap_create_v2(dest.as_raw_fd(), &args) }?;
    Ok(())
}

/// Deletes the subvolume or snapshot `parent/name` and everything in it (`BTRFS_IOC_SNAP_DESTROY`),
/// the subvolumes nested in it included.
///
/// If the kernel refuses with `EPERM` and the subvolume is read-only, its `BTRFS_SUBVOL_RDONLY` flag is
/// cleared (`BTRFS_IOC_SUBVOL_SETFLAGS`) and the deletion retried; if that still fails the flag is put
/// back. If it holds other subvolumes (`ENOTEMPTY`), they are found in the file system's root tree
/// and deleted by id, deepest first (read-only ones that hold others made writable), then it is;
/// nothing inside is reached by path, so nothing the subvolume contains (symlinks, renames) can
/// redirect the deletion. `name` itself is looked up without following a symlink. The space is
/// reclaimed later by the file system's cleaner thread.
pub fn delete_subvolume(parent: &Path, name: &str) -> io::Result<()> {
    let mut args = VolArgs {
        fd: 0,
        name: [0; BTRFS_PATH_NAME_MAX + 1],
    };
    copy_name(&mut args.name, name)?;
    let dir = open_dir(parent)?;
    let destroy = || -> io::Result<()> {
        // SAFETY: `args` is a live, initialised `btrfs_ioctl_vol_args` (size checked above) with a
        // NUL-terminated name; the kernel only reads it, and `dir` is open for the call.
        unsafe { ioctls::snap_destroy(dir.as_raw_fd(), &args) }?;
        Ok(())
    };
    let first = match destroy() {
        Ok(()) => return Ok(()),
        Err(err) if matches!(err.raw_os_error(), Some(libc::EPERM | libc::ENOTEMPTY)) => err,
        Err(err) => return Err(err),
    };
    let subvol = crate::fs_in_root::open_dir_at(dir.as_fd(), name)?;
    if first.raw_os_error() == Some(libc::ENOTEMPTY) {
        let id = subvolume_id_of(subvol.as_fd())?;
        nested::delete_descendants(subvol.as_fd(), id)?;
        return destroy();
    }
    let flags = subvolume_flags(subvol.as_fd())?;
    if flags & BTRFS_SUBVOL_RDONLY == 0 {
        return Err(first);
    }
    set_subvolume_flags(subvol.as_fd(), flags & !BTRFS_SUBVOL_RDONLY)?;
    let retried = match destroy() {
        Err(err) if err.raw_os_error() == Some(libc::ENOTEMPTY) => subvolume_id_of(subvol.as_fd())
            .and_then(|id| nested::delete_descendants(subvol.as_fd(), id))
            .and_then(|_| destroy()),
        other => other,
    };
    retried.inspect_err(|_| {
        // Best effort: leave the snapshot as read-only as we found it.
        let _ = set_subvolume_flags(subvol.as_fd(), flags);
    })
}

/// The ids of every subvolume nested below the subvolume whose root is `path` (children,
/// grandchildren...), from the file system's root tree (`BTRFS_IOC_TREE_SEARCH`, which needs
/// `CAP_SYS_ADMIN`); nothing inside is reached by path. Empty for a subvolume that holds none.
pub fn nested_subvolumes(path: &Path) -> io::Result<Vec<u64>> {
    let fd = open_dir(path)?;
    let id = subvolume_id_of(fd.as_fd())?;
    Ok(nested::descendants(fd.as_fd(), id)?
        .into_iter()
        .map(|(child, _)| child)
        .collect())
}

/// Makes the subvolume at `path` read-only, or writable again (`BTRFS_IOC_SUBVOL_SETFLAGS` with
/// `BTRFS_SUBVOL_RDONLY` set or cleared, other flags kept). `path` must be a subvolume's root
/// (`EINVAL` otherwise). Making a subvolume read-only commits nothing by itself: writes already made
/// stay, later ones fail with `EROFS`.
pub fn set_subvolume_readonly(path: &Path, readonly: bool) -> io::Result<()> {
    let subvol = open_dir(path)?;
    let flags = subvolume_flags(subvol.as_fd())?;
    let wanted = if readonly {
        flags | BTRFS_SUBVOL_RDONLY
    } else {
        flags & !BTRFS_SUBVOL_RDONLY
    };
    if wanted != flags {
        set_subvolume_flags(subvol.as_fd(), wanted)?;
    }
    Ok(())
}

/// Whether the subvolume at `path` is read-only (`BTRFS_IOC_SUBVOL_GETFLAGS`).
pub fn subvolume_is_readonly(path: &Path) -> io::Result<bool> {
    let subvol = open_dir(path)?;
    Ok(subvolume_flags(subvol.as_fd())? & BTRFS_SUBVOL_RDONLY != 0)
}

/// The id of the subvolume that contains `path` (`BTRFS_IOC_INO_LOOKUP` with `treeid` 0, which the
/// kernel answers with the tree of the inode the fd refers to). This is also the `<id>` of the
/// subvolume's level-0 quota group `0/<id>`. The top-level subvolume is 5.
pub fn subvolume_id(path: &Path) -> io::Result<u64> {
    subvolume_id_of(open_dir(path)?.as_fd())
}

/// [`subvolume_id`] of an open directory.
fn subvolume_id_of(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut args = InoLookupArgs {
        treeid: 0,
        objectid: BTRFS_FIRST_FREE_OBJECTID,
        name: [0; BTRFS_INO_LOOKUP_PATH_MAX],
    };
    // SAFETY: `args` is a live, exclusively borrowed `btrfs_ioctl_ino_lookup_args` (size checked above);
    // the kernel reads the ids and writes back `treeid` and a NUL-terminated `name` within the struct.
    unsafe { ioctls::ino_lookup(fd.as_raw_fd(), &mut args) }?;
    Ok(args.treeid)
}

/// Enables quota groups on the file system mounted at `mount_root` (`BTRFS_IOC_QUOTA_CTL`).
///
/// With `simple`, enables simple quotas (`BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA`, Linux 6.7+): every
/// extent is charged to the subvolume that wrote it, without the back-reference walks full qgroups do
/// on every transaction commit; usage written before enabling is not counted. Otherwise enables full
/// qgroup accounting, which starts a rescan. Enabling when quotas are already on (in either mode)
/// succeeds without changing the mode.
pub fn enable_quota(mount_root: &Path, simple: bool) -> io::Result<()> {
    let fd = open_dir(mount_root)?;
    let cmd = if simple {
        BTRFS_QUOTA_CTL_ENABLE_SIMPLE_QUOTA
    } else {
        BTRFS_QUOTA_CTL_ENABLE
    };
    let mut args = QuotaCtlArgs { cmd, status: 0 };
    // SAFETY: `args` is a live, exclusively borrowed `btrfs_ioctl_quota_ctl_args` (size checked above);
    // the kernel reads `cmd` and may write `status`.
    match unsafe { ioctls::quota_ctl(fd.as_raw_fd(), &mut args) } {
        Ok(_) | Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Sets the limits of the level-0 quota group of the subvolume at `subvolume` (`BTRFS_IOC_QGROUP_LIMIT`
/// with `qgroupid` 0, meaning "the subvolume this fd is in"). Quotas must be enabled
/// ([`enable_quota`]); `ENOTCONN` otherwise.
///
/// Both kinds are always sent: a `None` removes that kind of limit.
pub fn set_qgroup_limit(subvolume: &Path, max_referenced_or_exclusive: QgroupLimit) -> io::Result<()> {
    let limit = max_referenced_or_exclusive;
    let fd = open_dir(subvolume)?;
    let mut args = QgroupLimitArgs {
        qgroupid: 0,
        lim: QgroupLimitRaw {
            flags: BTRFS_QGROUP_LIMIT_MAX_RFER | BTRFS_QGROUP_LIMIT_MAX_EXCL,
            max_rfer: limit.max_referenced.unwrap_or(QGROUP_LIMIT_CLEAR),
            max_excl: limit.max_exclusive.unwrap_or(QGROUP_LIMIT_CLEAR),
            rsv_rfer: 0,
            rsv_excl: 0,
        },
    };
    // SAFETY: `args` is a live, exclusively borrowed `btrfs_ioctl_qgroup_limit_args` (size checked above);
    // the kernel copies it in (and may copy it back out) during the call only.
    unsafe { ioctls::qgroup_limit(fd.as_raw_fd(), &mut args) }?;
    Ok(())
}

/// Removes the level-0 quota group `0/<subvolume_id>` (`BTRFS_IOC_QGROUP_CREATE` with `create` 0), for
/// after its subvolume was deleted. Succeeds if the group does not exist (the kernel may already have
/// removed it). `EBUSY` means the group still accounts bytes: the deleted subvolume's extents have not
/// been cleaned yet (or, under simple quotas, are still shared with snapshots); retry later.
pub fn remove_qgroup(mount_root: &Path, subvolume_id: u64) -> io::Result<()> {
    let fd = open_dir(mount_root)?;
    let args = QgroupCreateArgs {
        create: 0,
        qgroupid: subvolume_id,
    };
    // SAFETY: `args` is a live, initialised `btrfs_ioctl_qgroup_create_args` (size checked above); the
    // kernel only reads it.
    match unsafe { ioctls::qgroup_create(fd.as_raw_fd(), &args) } {
        Ok(_) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// Usage and limits of a subvolume's level-0 quota group, as the kernel accounts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QgroupUsage {
    /// Bytes referenced by the subvolume (under simple quotas: bytes it wrote that still exist).
    pub referenced: u64,
    /// Bytes exclusively owned by the subvolume.
    pub exclusive: u64,
    /// Its referenced-bytes limit, if any.
    pub max_referenced: Option<u64>,
    /// Its exclusive-bytes limit, if any.
    pub max_exclusive: Option<u64>,
}

/// The UUID (`fsid`) of the btrfs file system containing `path` (`BTRFS_IOC_FS_INFO`), in the
/// hyphenated form the kernel names `/sys/fs/btrfs/<fsid>/` by.
pub fn filesystem_uuid(path: &Path) -> io::Result<String> {
    let fd = open_dir(path)?;
    // SAFETY: all-zero bytes are a valid `btrfs_ioctl_fs_info_args` (integers and byte arrays only).
    let mut args: FsInfoArgs = unsafe { std::mem::zeroed() };
    // SAFETY: `args` is a live, exclusively borrowed `btrfs_ioctl_fs_info_args` (size checked above);
    // with `flags` 0 the kernel reads nothing and fills in the base fields within the struct.
    unsafe { ioctls::fs_info(fd.as_raw_fd(), &mut args) }?;
    Ok(format_uuid(&args.fsid))
}

fn format_uuid(bytes: &[u8; BTRFS_FSID_SIZE]) -> String {
    let mut out = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            out.push('-');
        }
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The usage and limits of the level-0 quota group `0/<subvolume_id>` of the file system whose UUID
/// is `fs_uuid` ([`filesystem_uuid`]), read from `/sys/fs/btrfs/<fs_uuid>/qgroups/0_<id>/` (Linux
/// 5.9+). Quotas must be enabled. The numbers are as of the last transaction commit: writes since
/// then show after the next one (at most the `commit=` interval, 30 s by default, or a [`sync`]).
pub fn qgroup_usage(fs_uuid: &str, subvolume_id: u64) -> io::Result<QgroupUsage> {
    let dir = Path::new("/sys/fs/btrfs")
        .join(fs_uuid)
        .join("qgroups")
        .join(format!("0_{subvolume_id}"));
    let read = |name: &str| -> io::Result<u64> {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path)?;
        text.trim().parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected content in {}: {text:?}", path.display()),
            )
        })
    };
    let flags = read("limit_flags")?;
    let limit = |flag: u64, name: &str| -> io::Result<Option<u64>> {
        if flags & flag == 0 {
            Ok(None)
        } else {
            read(name).map(Some)
        }
    };
    Ok(QgroupUsage {
        referenced: read("referenced")?,
        exclusive: read("exclusive")?,
        max_referenced: limit(BTRFS_QGROUP_LIMIT_MAX_RFER, "max_referenced")?,
        max_exclusive: limit(BTRFS_QGROUP_LIMIT_MAX_EXCL, "max_exclusive")?,
    })
}

/// Commits the current transaction of the file system containing `path` and waits for it
/// (`BTRFS_IOC_SYNC`): data written so far is on disk and quota accounting is up to date.
pub fn sync(path: &Path) -> io::Result<()> {
    let fd = open_dir(path)?;
    // SAFETY: this ioctl takes no argument; `fd` is open for the call.
    unsafe { ioctls::sync(fd.as_raw_fd()) }?;
    Ok(())
}

/// Opens a directory for use as an ioctl target.
fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Copies a single path component into a fixed, zeroed name buffer, leaving at least one NUL.
fn copy_name(buf: &mut [u8], name: &str) -> io::Result<()> {
    let valid = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.bytes().any(|b| b == b'/' || b == 0)
        && name.len() < buf.len();
    if !valid {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{name:?} is not a valid subvolume name (one path component, at most {} bytes)",
                buf.len() - 1
            ),
        ));
    }
    buf[..name.len()].copy_from_slice(name.as_bytes());
    debug_assert!(CStr::from_bytes_until_nul(buf).is_ok());
    Ok(())
}

/// Reads a subvolume's flags (`BTRFS_IOC_SUBVOL_GETFLAGS`).
fn subvolume_flags(subvol: BorrowedFd<'_>) -> io::Result<u64> {
    let mut flags = 0u64;
    // SAFETY: `flags` is a live, exclusively borrowed u64, the argument type the header declares; the
    // kernel writes it during the call only.
    unsafe { ioctls::subvol_getflags(subvol.as_raw_fd(), &mut flags) }?;
    Ok(flags)
}

/// Writes a subvolume's flags (`BTRFS_IOC_SUBVOL_SETFLAGS`).
fn set_subvolume_flags(subvol: BorrowedFd<'_>, flags: u64) -> io::Result<()> {
    // SAFETY: `flags` is a live u64, the argument type the header declares; the kernel only reads it.
    unsafe { ioctls::subvol_setflags(subvol.as_raw_fd(), &flags) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::io::Write;
    use std::path::PathBuf;
    use std::process::Command;

    use super::*;

    /// A 256 MiB btrfs image in a temporary directory, loop-mounted; unmounted and deleted on drop, also
    /// when the test panics.
    struct ScratchBtrfs {
        mnt: PathBuf,
        // Dropped after the unmount in `Drop::drop`, which deletes the image and the mount point.
        _dir: tempfile::TempDir,
    }

    impl ScratchBtrfs {
        /// Returns `None` (after saying why, loudly) where the test cannot run: not root, no
        /// mkfs.btrfs, or no loop devices.
        fn new() -> Option<Self> {
            if !rustix::process::geteuid().is_root() {
                eprintln!("SKIPPED: btrfs tests need root (loop mount, subvolume ioctls)");
                return None;
            }
            let dir = tempfile::tempdir().expect("tempdir");
            let image = dir.path().join("fs.img");
            let mnt = dir.path().join("mnt");
            fs::create_dir(&mnt).expect("mkdir mnt");
            fs::File::create(&image)
                .and_then(|f| f.set_len(256 << 20))
                .expect("sparse image");
            match Command::new("mkfs.btrfs").arg("-q").arg(&image).output() {
                Ok(out) if out.status.success() => {}
                other => {
                    eprintln!("SKIPPED: mkfs.btrfs unavailable or failed: {other:?}");
                    return None;
                }
            }
            let mounted = Command::new("mount")
                .args(["-t", "btrfs", "-o", "loop"])
                .arg(&image)
                .arg(&mnt)
                .output();
            match mounted {
                Ok(out) if out.status.success() => Some(Self { mnt, _dir: dir }),
                other => {
                    eprintln!("SKIPPED: cannot loop-mount a btrfs image: {other:?}");
                    None
                }
            }
        }
    }

    impl Drop for ScratchBtrfs {
        fn drop(&mut self) {
            // The loop device was set up with autoclear by mount(8), so it goes away with the mount.
            if rustix::mount::unmount(&self.mnt, rustix::mount::UnmountFlags::empty()).is_err() {
                let _ = rustix::mount::unmount(&self.mnt, rustix::mount::UnmountFlags::DETACH);
            }
        }
    }

    fn errno(err: &io::Error) -> i32 {
        err.raw_os_error().unwrap_or_default()
    }

    #[test]
    fn names_must_be_one_path_component() {
        let mut buf = [0u8; 8];
        for bad in ["", ".", "..", "a/b", "nul\0", "eight888"] {
            let err = copy_name(&mut buf, bad).expect_err(bad);
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        copy_name(&mut buf, "seven77").expect("fits with its NUL");
        assert_eq!(&buf, b"seven77\0");
    }

    #[test]
    fn proc_is_not_btrfs() {
        assert!(!is_btrfs(Path::new("/proc")).expect("statfs /proc"));
    }

    #[test]
    fn subvolume_lifecycle() {
        let Some(scratch) = ScratchBtrfs::new() else {
            return;
        };
        let mnt = &scratch.mnt;
        assert!(is_btrfs(mnt).expect("statfs"));
        assert_eq!(subvolume_id(mnt).expect("top-level id"), 5);

        create_subvolume(mnt, "base").expect("create base");
        let err = create_subvolume(mnt, "base").expect_err("name taken");
        assert_eq!(errno(&err), libc::EEXIST);
        fs::write(mnt.join("base/hello"), b"hello").expect("write into base");

        let started = std::time::Instant::now();
        snapshot_subvolume(&mnt.join("base"), mnt, "rw", false).expect("writable snapshot");
        eprintln!(
            "writable snapshot of a small subvolume took {:?}",
            started.elapsed()
        );
        let started = std::time::Instant::now();
        snapshot_subvolume(&mnt.join("base"), mnt, "ro", true).expect("read-only snapshot");
        eprintln!(
            "read-only snapshot of a small subvolume took {:?}",
            started.elapsed()
        );

        for snap in ["rw", "ro"] {
            assert_eq!(
                fs::read(mnt.join(snap).join("hello")).expect("read snapshot"),
                b"hello"
            );
        }
        fs::write(mnt.join("rw/new"), b"x").expect("writable snapshot accepts writes");
        assert!(
            !mnt.join("base/new").exists(),
            "snapshot writes must not reach the source"
        );
        let err = fs::write(mnt.join("ro/new"), b"x").expect_err("read-only snapshot");
        assert_eq!(errno(&err), libc::EROFS);

        let ids: Vec<u64> = ["base", "rw", "ro"]
            .iter()
            .map(|name| subvolume_id(&mnt.join(name)).expect("subvolume id"))
            .collect();
        assert!(ids.iter().all(|&id| id >= BTRFS_FIRST_FREE_OBJECTID), "{ids:?}");
        assert!(
            ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
            "{ids:?}"
        );

        let err = snapshot_subvolume(&mnt.join("base"), mnt, "a/b", false).expect_err("bad name");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);

        assert!(subvolume_is_readonly(&mnt.join("ro")).expect("flags"));
        assert!(!subvolume_is_readonly(&mnt.join("rw")).expect("flags"));
        set_subvolume_readonly(&mnt.join("rw"), true).expect("make read-only");
        let err = fs::write(mnt.join("rw/later"), b"x").expect_err("now read-only");
        assert_eq!(errno(&err), libc::EROFS);
        fs::rename(mnt.join("rw"), mnt.join("rw-moved")).expect("a read-only subvolume can be renamed");
        fs::rename(mnt.join("rw-moved"), mnt.join("rw")).expect("and back");
        // ... but not moved to another directory: its `..` entry would change.
        fs::create_dir(mnt.join("elsewhere")).expect("mkdir");
        let err = fs::rename(mnt.join("rw"), mnt.join("elsewhere/rw")).expect_err("cross-directory move");
        assert_eq!(errno(&err), libc::EROFS);
        fs::remove_dir(mnt.join("elsewhere")).expect("rmdir");
        set_subvolume_readonly(&mnt.join("rw"), false).expect("writable again");
        fs::write(mnt.join("rw/later"), b"x").expect("writable again");
        delete_subvolume(mnt, "ro").expect("delete read-only snapshot");
        delete_subvolume(mnt, "rw").expect("delete writable snapshot");
        assert!(!mnt.join("ro").exists() && !mnt.join("rw").exists());
        let err = delete_subvolume(mnt, "rw").expect_err("already gone");
        assert_eq!(errno(&err), libc::ENOENT);
        sync(mnt).expect("sync");
    }

    /// What an older paddock let a sandbox leave in its volume: subvolumes and snapshots nested at
    /// any depth, read-only ones holding others, symlinks pointing out. Deleting the volume deletes
    /// all of it and nothing else.
    #[test]
    fn nested_subvolumes_are_deleted_with_their_parent() {
        let Some(scratch) = ScratchBtrfs::new() else {
            return;
        };
        let mnt = &scratch.mnt;
        create_subvolume(mnt, "keep").expect("create keep");
        fs::write(mnt.join("keep/data"), b"keep").expect("write keep");
        create_subvolume(mnt, "top").expect("create top");
        let top = mnt.join("top");
        std::os::unix::fs::symlink("../keep", top.join("to-keep")).expect("symlink");
        std::os::unix::fs::symlink("/", top.join("to-root")).expect("symlink");
        create_subvolume(&top, "a").expect("create a");
        fs::create_dir(top.join("a/dir")).expect("mkdir");
        create_subvolume(&top.join("a/dir"), "b").expect("create b");
        create_subvolume(&top.join("a/dir/b"), "c").expect("create c");
        fs::write(top.join("a/dir/b/c/file"), b"x").expect("write c");
        snapshot_subvolume(&top.join("a"), &top, "snap", true).expect("read-only snapshot of a");
        snapshot_subvolume(&mnt.join("keep"), &top.join("a/dir"), "keep-copy", false)
            .expect("snapshot of keep");
        set_subvolume_readonly(&top.join("a/dir/b"), true).expect("b read-only");
        set_subvolume_readonly(&top.join("a"), true).expect("a read-only");
        let mut deep = top.clone();
        for _ in 0..40 {
            create_subvolume(&deep, "n").expect("create a deeper level");
            deep.push("n");
        }
        let nested = nested_subvolumes(&top).expect("nested subvolumes");
        assert_eq!(nested.len(), 5 + 40, "{nested:?}"); // a, b, c, snap, keep-copy and the chain
        assert_eq!(
            nested_subvolumes(&top.join("a/dir/b/c")).expect("leaf"),
            Vec::<u64>::new()
        );

        delete_subvolume(mnt, "top").expect("delete top and everything in it");
        assert!(!top.exists());
        assert_eq!(fs::read(mnt.join("keep/data")).expect("keep survives"), b"keep");
        let keep_id = subvolume_id(&mnt.join("keep")).expect("keep id");
        assert_eq!(nested_subvolumes(mnt).expect("top level"), [keep_id]);

        // A read-only subvolume holding a read-only one.
        create_subvolume(mnt, "ro").expect("create ro");
        create_subvolume(&mnt.join("ro"), "inner").expect("create inner");
        set_subvolume_readonly(&mnt.join("ro/inner"), true).expect("inner read-only");
        set_subvolume_readonly(&mnt.join("ro"), true).expect("ro read-only");
        delete_subvolume(mnt, "ro").expect("delete ro");
        assert_eq!(nested_subvolumes(mnt).expect("top level"), [keep_id]);

        // A symlink is not a subvolume: never followed.
        std::os::unix::fs::symlink("keep", mnt.join("link")).expect("symlink");
        let err = delete_subvolume(mnt, "link").expect_err("a symlink");
        assert!(
            matches!(errno(&err), libc::ENOTDIR | libc::EINVAL | libc::ELOOP),
            "{err}"
        );
        assert!(mnt.join("keep/data").exists());
    }

    /// Creates `path` and writes it 1 MiB at a time (each chunk synced), at most `most_mib` MiB;
    /// the MiB count and error of the first write refused, if any.
    fn write_until_refused(path: &Path, most_mib: u32) -> Option<(u32, io::Error)> {
        let mut file = fs::File::create(path).expect("create file");
        let chunk = vec![0xa5u8; 1 << 20];
        (0..most_mib).find_map(|mib| {
            file.write_all(&chunk)
                .and_then(|()| file.sync_data())
                .err()
                .map(|e| (mib, e))
        })
    }

    /// A snapshot made with its limit has it from the start (the same figures as a limit set after),
    /// and writes past it are refused; the source keeps its own (none).
    #[test]
    fn a_snapshot_made_with_a_limit_has_it() {
        let Some(scratch) = ScratchBtrfs::new() else {
            return;
        };
        let mnt = &scratch.mnt;
        enable_quota(mnt, true).expect("enable simple quotas");
        create_subvolume(mnt, "src").expect("create");
        fs::write(mnt.join("src/kept"), b"kept").expect("write");
        let limit = QgroupLimit {
            max_exclusive: None,
            max_referenced: Some(8 << 20),
        };
        snapshot_subvolume_limited(&mnt.join("src"), mnt, "copy", limit).expect("snapshot with a limit");
        let copy = mnt.join("copy");
        assert_eq!(fs::read(copy.join("kept")).expect("read"), b"kept");
        let uuid = filesystem_uuid(mnt).expect("fs uuid");
        let usage = qgroup_usage(&uuid, subvolume_id(&copy).expect("id")).expect("usage");
        assert_eq!((usage.max_referenced, usage.max_exclusive), (Some(8 << 20), None));
        let source = qgroup_usage(&uuid, subvolume_id(&mnt.join("src")).expect("id")).expect("usage");
        assert_eq!((source.max_referenced, source.max_exclusive), (None, None));
        create_subvolume(mnt, "set_after").expect("create");
        set_qgroup_limit(&mnt.join("set_after"), limit).expect("set limit");
        let after = qgroup_usage(&uuid, subvolume_id(&mnt.join("set_after")).expect("id")).expect("usage");
        assert_eq!(
            (after.max_referenced, after.max_exclusive),
            (usage.max_referenced, usage.max_exclusive)
        );
        let (mib, err) =
            write_until_refused(&copy.join("big"), 32).expect("32 MiB written despite an 8 MiB limit");
        assert!(matches!(errno(&err), libc::EDQUOT | libc::ENOSPC), "{err}");
        assert!(mib <= 8, "refused only after {mib} MiB");
    }

    #[test]
    fn simple_quota_limit_refuses_writes() {
        let Some(scratch) = ScratchBtrfs::new() else {
            return;
        };
        let mnt = &scratch.mnt;
        enable_quota(mnt, true).expect("enable simple quotas");
        enable_quota(mnt, true).expect("enabling twice is fine");
        create_subvolume(mnt, "q").expect("create");
        let q = mnt.join("q");
        let id = subvolume_id(&q).expect("id");
        let limit = QgroupLimit {
            max_exclusive: None,
            max_referenced: Some(16 << 20),
        };
        set_qgroup_limit(&q, limit).expect("set limit");
        let uuid = filesystem_uuid(mnt).expect("fs uuid");
        assert_eq!(uuid.len(), 36, "{uuid}");
        assert_eq!(filesystem_uuid(&q).expect("same fs"), uuid);
        let before = qgroup_usage(&uuid, id).expect("qgroup usage");
        assert_eq!(before.max_referenced, Some(16 << 20));
        assert_eq!(before.max_exclusive, None);
        fs::write(q.join("small"), vec![1u8; 1 << 20]).expect("write 1 MiB");
        sync(mnt).expect("sync");
        let after = qgroup_usage(&uuid, id).expect("qgroup usage");
        assert!(
            after.referenced >= before.referenced + (1 << 20),
            "{before:?} -> {after:?}"
        );
        fs::remove_file(q.join("small")).expect("remove");

        // On Linux 6.18 the limit is checked when write(2) reserves data space, for both simple and
        // full qgroups: the write that would pass 16 MiB fails with EDQUOT, no fsync or sync needed.
        // fsync is still called between chunks so the test does not depend on that.
        let (mib, err) =
            write_until_refused(&q.join("big"), 64).expect("64 MiB written despite a 16 MiB limit");
        assert!(matches!(errno(&err), libc::EDQUOT | libc::ENOSPC), "{err}");
        assert!(mib <= 16, "refused only after {mib} MiB");
        let chunk = vec![0xa5u8; 1 << 20];

        // Lifting the limit lets writes through again.
        set_qgroup_limit(&q, QgroupLimit::default()).expect("clear limit");
        assert_eq!(qgroup_usage(&uuid, id).expect("usage").max_referenced, None);
        fs::OpenOptions::new()
            .append(true)
            .open(q.join("big"))
            .and_then(|mut f| f.write_all(&chunk))
            .expect("write after the limit was removed");

        delete_subvolume(mnt, "q").expect("delete");
        // The qgroup keeps accounting the deleted subvolume's extents (EBUSY) until the cleaner has
        // dropped them; BTRFS_IOC_SYNC wakes the cleaner. Linux 6.18 then removes the qgroup itself,
        // which remove_qgroup reports as success.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            sync(mnt).expect("sync");
            match remove_qgroup(mnt, id) {
                Ok(()) => break,
                Err(err) if errno(&err) == libc::EBUSY && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(err) => panic!("remove qgroup 0/{id}: {err}"),
            }
        }
        remove_qgroup(mnt, id).expect("removing again is fine");
    }
}
