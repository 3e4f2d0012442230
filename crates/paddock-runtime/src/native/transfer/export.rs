//! Writing a snapshot's tree as a POSIX tar (pax) stream.
//!
//! The tree is a read-only btrfs snapshot of a sandbox's volume, whose content the sandbox wrote, so
//! export is a visitor of the host side's walker ([`walk_tree`], `native/walk/`): one component at a
//! time relative to an open directory (`openat(O_NOFOLLOW)`, `fstatat(AT_SYMLINK_NOFOLLOW)`,
//! `readlinkat`), one directory descriptor at a time however deep the tree, never following a
//! symlink and never entering another file system, mount or subvolume (such a directory is archived
//! empty). Every opened file and directory is checked with `fstat` to be the inode that was listed,
//! and a file is opened for reading only once it is known to be a regular one ([`open_regular_at`]).
//! A tree nesting deeper than an import accepts ([`MAX_DEPTH`] levels) is refused, and the stream
//! then ends without an end-of-archive marker.
//!
//! What the archive holds, in depth-first order with siblings in byte order, the root first as `./`:
//! directories (empty ones included), regular files with their contents, symlinks (their targets
//! verbatim), and hard links (a file's second and later names, as links to its first name). Each
//! member has its permission bits, its owner as the sandbox sees it (host ids minus the range's
//! base; ids outside the range, which only the host can make, become 65534 `nobody` as inside a
//! sandbox), and its modification time to the nanosecond. Setuid and setgid bits are cleared from
//! every member and counted ([`TransferSummary::setid_cleared`]) unless
//! [`ExportOptions::keep_setid`] asks for them: files the sandbox's root made are owned by uid 0 in
//! the archive, and a host root unpacking it with `tar -p` would otherwise get setuid-root programs
//! a sandbox chose (the sticky bit, which grants nothing, is kept). Names and
//! link targets that do not fit the ustar header, or are not UTF-8, travel in pax `path` /
//! `linkpath` records (with `hdrcharset=BINARY` for non-UTF-8 bytes). Fifos, sockets and device
//! nodes are skipped and counted; extended attributes, ACLs and access times are not exported.
//!
//! The archive is written with the tar crate's `Builder` (members, pax extended headers, padding,
//! the end-of-archive marker); `pax.rs` has the two things it cannot do. A failed export writes
//! nothing more, so the stream ends without an end-of-archive marker and reads as truncated.
//!
//! Memory stays bounded: file contents are copied through a buffer of at most 64 KiB, and the walk
//! holds one directory's names per level plus the first name of every file with several links.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{self, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use paddock_sys::fs_in_root::{open_dir_at, open_regular_at};
use rustix::fs::{FileType, Stat};
use tar::{Builder, EntryType, Header};

use super::pax::{self, placeholder, set_ustar_path};
use super::{ExportOptions, TransferSummary};
use crate::native::untar::member_path::MAX_DEPTH;
use crate::native::walk::{walk_tree, WalkEntry, WalkError, WalkOptions, WalkStep};
use crate::native::IdRange;
use crate::RuntimeError;

const CHUNK: usize = 64 * 1024;
/// The owner given to files whose host owner is outside the sandbox id range.
const OVERFLOW_ID: u32 = 65534;
/// Largest mtime the ustar field holds (11 octal digits); later ones travel in pax.
const USTAR_MAX_TIME: i64 = 0o777_7777_7777;
/// Largest size the ustar field holds (11 octal digits); larger ones travel in pax.
const USTAR_MAX_SIZE: u64 = 0o777_7777_7777;

/// Set-id bits (setuid, setgid): cleared unless [`ExportOptions::keep_setid`].
const SET_ID_BITS: u32 = 0o6000;

/// Writes the tree at `root` to `out` as a tar stream, ending with the end-of-archive marker. On an
/// error nothing more is written: the stream ends without the marker.
pub(crate) fn export_tree(
    root: &Path,
    ids: IdRange,
    options: &ExportOptions,
    out: &mut dyn Write,
) -> Result<TransferSummary, RuntimeError> {
    let fd = open_dir_at(rustix::fs::CWD, root).map_err(|e| walk_error(root, "open", "", e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| walk_error(root, "stat", "", e.into()))?;
    let mut exporter = Exporter {
        root: root.to_owned(),
        ids,
        keep_setid: options.keep_setid,
        archive: Builder::new(Counted {
            inner: out,
            bytes: 0,
            failed: false,
        }),
        links: HashMap::new(),
        summary: TransferSummary::default(),
    };
    let options = WalkOptions { max_depth: MAX_DEPTH };
    let written = exporter
        .emit(b"./", &st, EntryType::Directory, None)
        .and_then(|()| {
            walk_tree(fd.as_fd(), &options, |entry| exporter.entry(entry))
                .map_err(|stopped| stopped.into_error(|e| walk_failed(root, e)))
        });
    if let Err(e) = written {
        // The builder ends the archive when it is dropped: nothing more may reach the stream.
        exporter.archive.get_mut().failed = true;
        return Err(e);
    }
    let counted = exporter.archive.into_inner().map_err(stream_error)?;
    counted.inner.flush().map_err(stream_error)?;
    Ok(TransferSummary {
        bytes: counted.bytes,
        ..exporter.summary
    })
}

struct Exporter<'a> {
    root: PathBuf,
    ids: IdRange,
    keep_setid: bool,
    archive: Builder<Counted<'a>>,
    /// First archived name of every regular file with more than one link, by inode.
    links: HashMap<u64, Vec<u8>>,
    summary: TransferSummary,
}

/// The output, counted; refusing every write once the export has failed.
struct Counted<'a> {
    inner: &'a mut dyn Write,
    bytes: u64,
    failed: bool,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.failed {
            return Err(io::Error::other("the export failed"));
        }
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A regular file's contents as the archive takes them: exactly `left` more bytes, or an error
/// (kept in `failure`, to tell it from the stream's) if the file ends sooner. Bytes it gains while
/// read are not archived.
struct Contents {
    file: std::fs::File,
    left: u64,
    failure: Option<io::Error>,
}

impl Read for Contents {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min(usize::try_from(self.left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        match self.file.read(&mut buf[..want]) {
            Ok(0) => {
                let shrank = io::Error::other("it shrank while read");
                let reported = io::Error::other(shrank.to_string());
                self.failure = Some(shrank);
                Err(reported)
            }
            Ok(n) => {
                self.left -= n as u64;
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                let reported = io::Error::new(e.kind(), e.to_string());
                self.failure = Some(e);
                Err(reported)
            }
        }
    }
}

fn walk_error(root: &Path, step: &str, path: &str, source: io::Error) -> RuntimeError {
    RuntimeError::Pool {
        what: "export",
        path: root.join(path),
        source: io::Error::new(source.kind(), format!("{step}: {source}")),
    }
}

fn walk_failed(root: &Path, e: WalkError) -> RuntimeError {
    walk_error(root, e.step, &String::from_utf8_lossy(&e.path), e.source)
}

fn stream_error(source: io::Error) -> RuntimeError {
    RuntimeError::Stream {
        what: "write",
        source,
    }
}

/// Pax records of one member, in the order they are written.
type Records = Vec<(&'static str, Vec<u8>)>;

impl Exporter<'_> {
    fn error(&self, step: &str, path: &[u8], source: io::Error) -> RuntimeError {
        walk_error(&self.root, step, &String::from_utf8_lossy(path), source)
    }

    /// Archives one entry of the walk; directories are entered (the walk skips those on another file
    /// system, mount or subvolume, archived empty, and refuses to go deeper than [`MAX_DEPTH`]).
    fn entry(&mut self, e: &WalkEntry<'_>) -> Result<WalkStep, RuntimeError> {
        let mut path = e.path.to_vec();
        let st = e.stat;
        match e.file_type() {
            FileType::Directory => {
                path.push(b'/');
                self.emit(&path, st, EntryType::Directory, None)?;
                return Ok(WalkStep::Descend);
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(e.dir, e.name, Vec::new())
                    .map_err(|err| self.error("read the symlink", &path, err.into()))?;
                self.emit(&path, st, EntryType::Symlink, Some(target.as_bytes()))?;
            }
            FileType::RegularFile => {
                if st.st_nlink > 1 {
                    if let Some(first) = self.links.get(&st.st_ino).cloned() {
                        self.emit(&path, st, EntryType::Link, Some(&first))?;
                        return Ok(WalkStep::Continue);
                    }
                    self.links.insert(st.st_ino, path.clone());
                }
                self.file(e.dir, e.name, &path, st)?;
            }
            _ => {
                tracing::debug!(path = %String::from_utf8_lossy(&path), "export skips a fifo, socket or device");
                self.summary.skipped += 1;
            }
        }
        Ok(WalkStep::Continue)
    }

    /// Archives a regular file: its header(s), then exactly the size it had when opened.
    fn file(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        path: &[u8],
        st: &Stat,
    ) -> Result<(), RuntimeError> {
        let (file, opened) = open_regular_at(dir, name).map_err(|e| self.error("open the file", path, e))?;
        if opened.st_ino != st.st_ino {
            return Err(self.error("open the file", path, io::Error::other("it changed")));
        }
        let (header, records) = self.header(path, &opened, EntryType::Regular, None)?;
        let size = opened.st_size.max(0) as u64;
        let mut contents = Contents {
            file,
            left: size,
            failure: None,
        };
        self.append_pax(&records)?;
        let capacity = usize::try_from(size).map_or(CHUNK, |size| size.min(CHUNK));
        let appended = self
            .archive
            .append(&header, BufReader::with_capacity(capacity, &mut contents));
        if let Some(e) = contents.failure.take() {
            return Err(self.error("read the file", path, e));
        }
        appended.map_err(stream_error)?;
        self.summary.entries += 1;
        self.summary.data_bytes += size;
        Ok(())
    }

    /// Writes the header(s) of one member without contents: a pax extended header when something
    /// does not fit the ustar one, then the ustar header.
    fn emit(
        &mut self,
        path: &[u8],
        st: &Stat,
        kind: EntryType,
        link: Option<&[u8]>,
    ) -> Result<(), RuntimeError> {
        let (header, records) = self.header(path, st, kind, link)?;
        self.append_pax(&records)?;
        self.archive.append(&header, io::empty()).map_err(stream_error)?;
        self.summary.entries += 1;
        Ok(())
    }

    /// The pax extended header of a member, when it has records.
    fn append_pax(&mut self, records: &Records) -> Result<(), RuntimeError> {
        if records.is_empty() {
            return Ok(());
        }
        let records = records.iter().map(|(key, value)| (*key, value.as_slice()));
        self.archive.append_pax_extensions(records).map_err(stream_error)
    }

    /// The ustar header of one member and the pax records for what does not fit it.
    fn header(
        &mut self,
        path: &[u8],
        st: &Stat,
        kind: EntryType,
        link: Option<&[u8]>,
    ) -> Result<(Header, Records), RuntimeError> {
        let mut records = Records::new();
        let mut header = Header::new_ustar();
        header.set_entry_type(kind);
        let mut mode = st.st_mode & 0o7777;
        if mode & SET_ID_BITS != 0 && !self.keep_setid {
            mode &= !SET_ID_BITS;
            self.summary.setid_cleared += 1;
        }
        header.set_mode(mode);
        header.set_uid(u64::from(self.sandbox_id(st.st_uid)));
        header.set_gid(u64::from(self.sandbox_id(st.st_gid)));
        let size = if kind == EntryType::Regular {
            st.st_size.max(0) as u64
        } else {
            0
        };
        header.set_size(size);
        if size > USTAR_MAX_SIZE {
            records.push(("size", size.to_string().into_bytes()));
        }
        let (secs, nanos) = (st.st_mtime, st.st_mtime_nsec as u32);
        header.set_mtime(secs.clamp(0, USTAR_MAX_TIME) as u64);
        if nanos != 0 || !(0..=USTAR_MAX_TIME).contains(&secs) {
            records.push(("mtime", pax::format_time(secs, nanos).into_bytes()));
        }
        let utf8 = std::str::from_utf8(path).is_ok() && link.is_none_or(|l| std::str::from_utf8(l).is_ok());
        if !utf8 {
            records.push(("hdrcharset", b"BINARY".to_vec()));
        }
        if !utf8 || !set_ustar_path(&mut header, path) {
            records.push(("path", path.to_vec()));
            set_ustar_path(&mut header, placeholder(path, 100).as_bytes());
        }
        if let Some(link) = link {
            if !utf8 || header.set_link_name_literal(link).is_err() {
                records.push(("linkpath", link.to_vec()));
                header
                    .set_link_name_literal(placeholder(link, 100))
                    .map_err(|e| self.error("archive", path, e))?;
            }
        }
        header.set_cksum();
        Ok((header, records))
    }

    fn sandbox_id(&self, host: u32) -> u32 {
        host.checked_sub(self.ids.base)
            .filter(|id| *id < self.ids.count)
            .unwrap_or(OVERFLOW_ID)
    }
}
