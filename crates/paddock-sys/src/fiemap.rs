//! Where a file's data lies on disk, and whether anything else shares it (`FS_IOC_FIEMAP`).
//!
//! On btrfs an extent is reported `shared` when another file, or the same file in another subvolume
//! (a snapshot), still refers to it. That is what tells how much of a snapshot only the snapshot
//! holds: btrfs's simple quotas charge every extent to the subvolume that wrote it, so a snapshot's own
//! quota group counts almost nothing however much it pins.
//!
//! The argument structures are transcribed from `linux/fiemap.h`; their sizes are checked at compile
//! time. What this module does not do: map files it is not given (callers walk directories themselves).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `FIEMAP_EXTENT_LAST`: the last extent of the file.
const FIEMAP_EXTENT_LAST: u32 = 0x1;
/// `FIEMAP_EXTENT_DELALLOC`: data not allocated on disk yet (physical is 0).
const FIEMAP_EXTENT_DELALLOC: u32 = 0x4;
/// `FIEMAP_EXTENT_DATA_INLINE`: the data lives in the file system's metadata (physical is 0).
const FIEMAP_EXTENT_DATA_INLINE: u32 = 0x200;
/// `FIEMAP_EXTENT_SHARED`: other files or snapshots refer to this extent too.
const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

/// Extents fetched per ioctl call.
const BATCH: usize = 64;

/// `struct fiemap` without its flexible array member.
#[repr(C)]
struct FiemapHeader {
    fm_start: u64,
    fm_length: u64,
    fm_flags: u32,
    fm_mapped_extents: u32,
    fm_extent_count: u32,
    fm_reserved: u32,
}

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Clone, Copy)]
struct FiemapExtent {
    fe_logical: u64,
    fe_physical: u64,
    fe_length: u64,
    fe_reserved64: [u64; 2],
    fe_flags: u32,
    fe_reserved: [u32; 3],
}

/// A header followed by room for [`BATCH`] extents, as the kernel expects the flexible array.
#[repr(C)]
struct FiemapBuffer {
    header: FiemapHeader,
    extents: [FiemapExtent; BATCH],
}

const _: () = assert!(size_of::<FiemapHeader>() == 32);
const _: () = assert!(size_of::<FiemapExtent>() == 56);
const _: () = assert!(std::mem::offset_of!(FiemapBuffer, extents) == 32);

mod ioctls {
    // `FS_IOC_FIEMAP` is `_IOWR('f', 11, struct fiemap)`, the size being that of the header.
    nix::ioctl_readwrite!(fiemap, b'f', 11, super::FiemapHeader);
}

/// One extent of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Offset in the file, bytes.
    pub logical: u64,
    /// Address on the device, bytes (0 for inline and delayed-allocation data).
    pub physical: u64,
    /// Length, bytes (of the file's data; compressed extents take less on disk).
    pub length: u64,
    flags: u32,
}

impl Extent {
    /// Other files or snapshots refer to this extent too.
    pub fn shared(&self) -> bool {
        self.flags & FIEMAP_EXTENT_SHARED != 0
    }

    /// Stored inside the file system's metadata, not in an extent of its own.
    pub fn inline(&self) -> bool {
        self.flags & FIEMAP_EXTENT_DATA_INLINE != 0
    }

    /// Not allocated on disk yet (written, not yet flushed).
    pub fn delayed(&self) -> bool {
        self.flags & FIEMAP_EXTENT_DELALLOC != 0
    }
}

/// Calls `each` for every extent of the open file `file`, in file order (`FS_IOC_FIEMAP`, without
/// `FIEMAP_FLAG_SYNC`: data not yet written back shows as [`Extent::delayed`]). Holes have no extent.
/// `EOPNOTSUPP` on file systems without FIEMAP (tmpfs).
pub fn for_each_extent(file: BorrowedFd<'_>, mut each: impl FnMut(Extent)) -> io::Result<()> {
    let empty = FiemapExtent {
        fe_logical: 0,
        fe_physical: 0,
        fe_length: 0,
        fe_reserved64: [0; 2],
        fe_flags: 0,
        fe_reserved: [0; 3],
    };
    let mut buf = FiemapBuffer {
        header: FiemapHeader {
            fm_start: 0,
            fm_length: 0,
            fm_flags: 0,
            fm_mapped_extents: 0,
            fm_extent_count: BATCH as u32,
            fm_reserved: 0,
        },
        extents: [empty; BATCH],
    };
    let mut start = 0u64;
    loop {
        buf.header.fm_start = start;
        buf.header.fm_length = u64::MAX - start;
        buf.header.fm_mapped_extents = 0;
        // SAFETY: `buf` is a live, exclusively borrowed `struct fiemap` header followed (repr(C), offset
        // checked above) by room for `fm_extent_count` = BATCH extents; the kernel reads the header and
        // writes at most that many extents after it, during the call only.
        unsafe {
            ioctls::fiemap(
                file.as_raw_fd(),
                std::ptr::from_mut(&mut buf).cast::<FiemapHeader>(),
            )
        }?;
        let mapped = (buf.header.fm_mapped_extents as usize).min(BATCH);
        if mapped == 0 {
            return Ok(());
        }
        for e in &buf.extents[..mapped] {
            each(Extent {
                logical: e.fe_logical,
                physical: e.fe_physical,
                length: e.fe_length,
                flags: e.fe_flags,
            });
        }
        let last = &buf.extents[mapped - 1];
        let next = last.fe_logical.saturating_add(last.fe_length);
        if last.fe_flags & FIEMAP_EXTENT_LAST != 0 || next <= start {
            return Ok(());
        }
        start = next;
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom, Write};

    use super::*;

    #[test]
    fn maps_every_extent_of_a_fragmented_file() {
        // /var/tmp is on a disk file system (tmpfs has no FIEMAP).
        let dir = tempfile::tempdir_in("/var/tmp").expect("tempdir");
        let path = dir.path().join("sparse");
        let mut file = std::fs::File::create(&path).expect("create");
        // 200 separate 4 KiB pieces with holes between them: more extents than one batch holds.
        for i in 0..200u64 {
            file.seek(SeekFrom::Start(i * 64 * 1024)).expect("seek");
            file.write_all(&[0xa5; 4096]).expect("write");
        }
        file.sync_all().expect("sync");
        let mut extents = Vec::new();
        match for_each_extent(std::os::fd::AsFd::as_fd(&file), |e| extents.push(e)) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                eprintln!("SKIPPED: /var/tmp has no FIEMAP");
                return;
            }
            Err(e) => panic!("fiemap: {e}"),
        }
        let total: u64 = extents.iter().map(|e| e.length).sum();
        assert_eq!(total, 200 * 4096, "{extents:?}");
        assert_eq!(extents.len(), 200);
        assert!(extents.windows(2).all(|w| w[0].logical < w[1].logical));
        assert!(extents
            .iter()
            .all(|e| !e.shared() && !e.inline() && !e.delayed() && e.physical > 0));

        let empty = std::fs::File::create(dir.path().join("empty")).expect("create");
        let mut count = 0;
        for_each_extent(std::os::fd::AsFd::as_fd(&empty), |_| count += 1).expect("fiemap");
        assert_eq!(count, 0);
    }
}
