//! Subvolumes nested inside a subvolume: finding them and deleting them, children first.
//!
//! A subvolume that holds another cannot be deleted (`ENOTEMPTY`). Sandboxes may not create
//! subvolumes (seccomp refuses every btrfs request but the reflink ones), but an older paddock let
//! them, and anything else may have: the pool must still delete whatever it holds.
//!
//! Nothing here resolves a path inside the subvolume, whose contents a sandbox wrote: the nested
//! subvolumes are found by id in the file system's root tree (`BTRFS_IOC_TREE_SEARCH` over
//! `ROOT_REF` items, which say which subvolume holds which), deleted by id
//! (`BTRFS_IOC_SNAP_DESTROY_V2` with `BTRFS_SUBVOL_SPEC_BY_ID`), and a read-only one that holds
//! others (whose entries could not be removed) is opened by file handle (`open_by_handle_at`) to
//! clear its read-only flag. So no symlink, rename or mount inside can redirect the work, and it
//! holds a bounded number of descriptors however deep the nesting.
//!
//! All of it needs `CAP_SYS_ADMIN` (tree search) and `CAP_DAC_READ_SEARCH` (file handles): host
//! root.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::{
    ioctls, set_subvolume_flags, subvolume_flags, VolArgsV2, BTRFS_SUBVOL_NAME_MAX, BTRFS_SUBVOL_RDONLY,
};

/// `BTRFS_ROOT_TREE_OBJECTID`: the tree that lists the subvolumes.
const ROOT_TREE: u64 = 1;
/// `BTRFS_ROOT_REF_KEY`: item `(parent, ROOT_REF, child)`: subvolume `child` sits in `parent`.
const ROOT_REF_KEY: u32 = 156;
/// `BTRFS_SUBVOL_SPEC_BY_ID`: `btrfs_ioctl_vol_args_v2` names the subvolume by id.
const SUBVOL_SPEC_BY_ID: u64 = 1 << 4;
/// `FILEID_BTRFS_WITHOUT_PARENT`: a btrfs file handle naming an inode by (objectid, root).
const FILEID_BTRFS_WITHOUT_PARENT: i32 = 0x4d;

/// `struct btrfs_ioctl_search_key`.
#[repr(C)]
pub(super) struct SearchKey {
    tree_id: u64,
    min_objectid: u64,
    max_objectid: u64,
    min_offset: u64,
    max_offset: u64,
    min_transid: u64,
    max_transid: u64,
    min_type: u32,
    max_type: u32,
    nr_items: u32,
    unused: u32,
    unused1: u64,
    unused2: u64,
    unused3: u64,
    unused4: u64,
}

/// `BTRFS_SEARCH_ARGS_BUFSIZE`.
const SEARCH_BUF: usize = 4096 - size_of::<SearchKey>();

/// `struct btrfs_ioctl_search_args`.
#[repr(C)]
pub(super) struct SearchArgs {
    key: SearchKey,
    buf: [u8; SEARCH_BUF],
}

/// `struct btrfs_ioctl_search_header`, as it sits (unaligned) in the result buffer.
const SEARCH_HEADER: usize = 32;

/// `struct file_handle` with room for a `struct btrfs_fid` without parent (5 words).
#[repr(C)]
struct BtrfsHandle {
    handle_bytes: u32,
    handle_type: i32,
    /// `objectid` (u64), `root_objectid` (u64), `gen` (u32): packed, native endian.
    f_handle: [u8; 20],
}

const _: () = assert!(size_of::<SearchKey>() == 104);
const _: () = assert!(size_of::<SearchArgs>() == 4096);
const _: () = assert!(size_of::<BtrfsHandle>() == 28);

/// The ids of the subvolumes directly inside subvolume `parent` (`BTRFS_IOC_TREE_SEARCH` over its
/// `ROOT_REF` items). `fs` is any descriptor on the file system.
fn child_subvolumes(fs: BorrowedFd<'_>, parent: u64) -> io::Result<Vec<u64>> {
    let mut children = Vec::new();
    let mut min_offset = 0;
    loop {
        let mut args = SearchArgs {
            key: SearchKey {
                tree_id: ROOT_TREE,
                min_objectid: parent,
                max_objectid: parent,
                min_offset,
                max_offset: u64::MAX,
                min_transid: 0,
                max_transid: u64::MAX,
                min_type: ROOT_REF_KEY,
                max_type: ROOT_REF_KEY,
                nr_items: u32::MAX,
                unused: 0,
                unused1: 0,
                unused2: 0,
                unused3: 0,
                unused4: 0,
            },
            buf: [0; SEARCH_BUF],
        };
        // SAFETY: `args` is a live, exclusively borrowed `btrfs_ioctl_search_args` (size checked
        // above); the kernel reads the key and writes back the key's `nr_items` and at most
        // `SEARCH_BUF` bytes of results into `buf`.
        unsafe { ioctls::tree_search(fs.as_raw_fd(), &mut args) }?;
        let found = args.key.nr_items as usize;
        if found == 0 {
            return Ok(children);
        }
        let mut at = 0;
        let mut last = min_offset;
        for _ in 0..found {
            let header = args
                .buf
                .get(at..at + SEARCH_HEADER)
                .ok_or_else(|| malformed("a search header past the buffer"))?;
            let word =
                |offset: usize| u64::from_ne_bytes(header[offset..offset + 8].try_into().unwrap_or_default());
            let (objectid, offset) = (word(8), word(16));
            let kind = u32::from_ne_bytes(header[24..28].try_into().unwrap_or_default());
            let len = u32::from_ne_bytes(header[28..32].try_into().unwrap_or_default()) as usize;
            if objectid == parent && kind == ROOT_REF_KEY {
                children.push(offset);
            }
            at += SEARCH_HEADER + len;
            last = offset;
        }
        match last.checked_add(1) {
            Some(next) => min_offset = next,
            None => return Ok(children),
        }
    }
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("btrfs tree search returned {what}"),
    )
}

/// Every subvolume below subvolume `top`, as `(child, parent)` pairs in breadth-first order (each
/// parent before its children). Bounded by what the file system holds; the tree of `ROOT_REF`s has
/// no cycles, but a repeated id is still refused rather than looped over.
pub(super) fn descendants(fs: BorrowedFd<'_>, top: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut found = Vec::new();
    let mut seen = HashSet::from([top]);
    let mut queue = VecDeque::from([top]);
    while let Some(parent) = queue.pop_front() {
        for child in child_subvolumes(fs, parent)? {
            if !seen.insert(child) {
                return Err(malformed(&format!("subvolume {child} twice")));
            }
            found.push((child, parent));
            queue.push_back(child);
        }
    }
    Ok(found)
}

/// Deletes subvolume `id` by id (`BTRFS_IOC_SNAP_DESTROY_V2`, `BTRFS_SUBVOL_SPEC_BY_ID`, Linux 5.7+),
/// wherever it sits. `fs` is any descriptor on the file system.
fn delete_by_id(fs: BorrowedFd<'_>, id: u64) -> io::Result<()> {
    let mut args = VolArgsV2 {
        fd: 0,
        transid: 0,
        flags: SUBVOL_SPEC_BY_ID,
        size: 0,
        qgroup_inherit: std::ptr::null(),
        unused: [0; 2],
        name: [0; BTRFS_SUBVOL_NAME_MAX + 1],
    };
    // The header's union puts `subvolid` where `name` starts.
    args.name[..8].copy_from_slice(&id.to_ne_bytes());
    // SAFETY: `args` is a live, initialised `btrfs_ioctl_vol_args_v2` (size checked in the parent
    // module) whose union holds the subvolume id; the kernel only reads it.
    unsafe { ioctls::snap_destroy_v2(fs.as_raw_fd(), &args) }?;
    Ok(())
}

/// Opens the root directory of subvolume `id` by file handle, without resolving any path.
fn open_subvolume_by_id(fs: BorrowedFd<'_>, id: u64) -> io::Result<OwnedFd> {
    let mut handle = BtrfsHandle {
        handle_bytes: 20,
        handle_type: FILEID_BTRFS_WITHOUT_PARENT,
        f_handle: [0; 20],
    };
    handle.f_handle[..8].copy_from_slice(&super::BTRFS_FIRST_FREE_OBJECTID.to_ne_bytes());
    handle.f_handle[8..16].copy_from_slice(&id.to_ne_bytes());
    // Generation 0: any generation (the kernel checks it only when it is not 0).
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: `handle` is a live `struct file_handle` whose `handle_bytes` (20) bytes of `f_handle`
    // follow its header, as the kernel reads them; it writes nothing back. `fs` is open.
    let fd = unsafe {
        libc::open_by_handle_at(
            fs.as_raw_fd(),
            std::ptr::from_mut(&mut handle).cast::<libc::file_handle>(),
            flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Clears the read-only flag of the subvolume whose root `subvol` is, if set.
fn make_writable(subvol: BorrowedFd<'_>) -> io::Result<()> {
    let flags = subvolume_flags(subvol)?;
    if flags & BTRFS_SUBVOL_RDONLY != 0 {
        set_subvolume_flags(subvol, flags & !BTRFS_SUBVOL_RDONLY)?;
    }
    Ok(())
}

/// Deletes every subvolume below subvolume `top_id` (whose root is open as `top`), deepest first,
/// so that `top` can then be deleted. A read-only subvolume whose children cannot be unlinked
/// (`EROFS`) is made writable first (it is about to go too). Stops at the first failure, returning
/// it; what was deleted stays deleted.
pub(super) fn delete_descendants(top: BorrowedFd<'_>, top_id: u64) -> io::Result<usize> {
    let below = descendants(top, top_id)?;
    for &(child, parent) in below.iter().rev() {
        match delete_by_id(top, child) {
            Ok(()) => {}
            // Deleted meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) if e.raw_os_error() == Some(libc::EROFS) => {
                if parent == top_id {
                    make_writable(top)?;
                } else {
                    make_writable(open_subvolume_by_id(top, parent)?.as_fd())?;
                }
                delete_by_id(top, child)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(below.len())
}
