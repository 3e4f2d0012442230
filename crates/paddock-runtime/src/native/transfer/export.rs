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
//! Memory stays bounded: file contents are copied through one 64 KiB buffer, and the walk holds one
//! directory's names per level plus the first name of every file with several links.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use paddock_sys::fs_in_root::{open_dir_at, open_regular_at};
use rustix::fs::{FileType, Stat};
use tar::{EntryType, Header};

use super::member_path::MAX_DEPTH;
use super::pax;
use super::{ExportOptions, TransferSummary};
use crate::native::walk::{walk_tree, WalkEntry, WalkError, WalkOptions, WalkStep};
use crate::native::IdRange;
use crate::RuntimeError;

const BLOCK: usize = 512;
const CHUNK: usize = 64 * 1024;
/// The owner given to files whose host owner is outside the sandbox id range.
const OVERFLOW_ID: u32 = 65534;
/// Largest mtime the ustar field holds (11 octal digits); later ones travel in pax.
const USTAR_MAX_TIME: i64 = 0o777_7777_7777;
/// Largest size the ustar field holds (11 octal digits); larger ones travel in pax.
const USTAR_MAX_SIZE: u64 = 0o777_7777_7777;

/// Set-id bits (setuid, setgid): cleared unless [`ExportOptions::keep_setid`].
const SET_ID_BITS: u32 = 0o6000;

/// Writes the tree at `root` to `out` as a tar stream, ending with the end-of-archive marker.
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
        out: Counted { inner: out, bytes: 0 },
        links: HashMap::new(),
        summary: TransferSummary::default(),
        buf: vec![0; CHUNK],
    };
    exporter.emit(b"./", &st, EntryType::Directory, None)?;
    let options = WalkOptions { max_depth: MAX_DEPTH };
    walk_tree(fd.as_fd(), &options, |entry| exporter.entry(entry))
        .map_err(|stopped| stopped.into_error(|e| walk_failed(root, e)))?;
    exporter.write(&[0; 2 * BLOCK])?;
    exporter.out.inner.flush().map_err(stream_error)?;
    exporter.summary.bytes = exporter.out.bytes;
    Ok(exporter.summary)
}

struct Exporter<'a> {
    root: PathBuf,
    ids: IdRange,
    keep_setid: bool,
    out: Counted<'a>,
    /// First archived name of every regular file with more than one link, by inode.
    links: HashMap<u64, Vec<u8>>,
    summary: TransferSummary,
    buf: Vec<u8>,
}

struct Counted<'a> {
    inner: &'a mut dyn Write,
    bytes: u64,
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

impl Exporter<'_> {
    fn error(&self, step: &str, path: &[u8], source: io::Error) -> RuntimeError {
        walk_error(&self.root, step, &String::from_utf8_lossy(path), source)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), RuntimeError> {
        self.out.inner.write_all(bytes).map_err(stream_error)?;
        self.out.bytes += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self, len: u64) -> Result<(), RuntimeError> {
        let rem = (len % BLOCK as u64) as usize;
        if rem != 0 {
            self.write(&[0; BLOCK][..BLOCK - rem])?;
        }
        Ok(())
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

    fn file(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &OsStr,
        path: &[u8],
        st: &Stat,
    ) -> Result<(), RuntimeError> {
        let (mut file, opened) =
            open_regular_at(dir, name).map_err(|e| self.error("open the file", path, e))?;
        if opened.st_ino != st.st_ino {
            return Err(self.error("open the file", path, io::Error::other("it changed")));
        }
        self.emit(path, &opened, EntryType::Regular, None)?;
        let size = opened.st_size.max(0) as u64;
        let mut left = size;
        while left > 0 {
            let want = left.min(CHUNK as u64) as usize;
            let mut buf = std::mem::take(&mut self.buf);
            let n = match file.read(&mut buf[..want]) {
                Ok(0) => {
                    self.buf = buf;
                    return Err(self.error("read the file", path, io::Error::other("it shrank while read")));
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    self.buf = buf;
                    continue;
                }
                Err(e) => {
                    self.buf = buf;
                    return Err(self.error("read the file", path, e));
                }
            };
            let written = self.write(&buf[..n]);
            self.buf = buf;
            written?;
            left -= n as u64;
        }
        self.pad(size)?;
        self.summary.data_bytes += size;
        Ok(())
    }

    /// Writes the header(s) of one member: a pax extended header when something does not fit the
    /// ustar one, then the ustar header.
    fn emit(
        &mut self,
        path: &[u8],
        st: &Stat,
        kind: EntryType,
        link: Option<&[u8]>,
    ) -> Result<(), RuntimeError> {
        let mut records = Vec::new();
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
            pax::push_record(&mut records, "size", size.to_string().as_bytes());
        }
        let (secs, nanos) = (st.st_mtime, st.st_mtime_nsec as u32);
        header.set_mtime(secs.clamp(0, USTAR_MAX_TIME) as u64);
        if nanos != 0 || !(0..=USTAR_MAX_TIME).contains(&secs) {
            pax::push_record(&mut records, "mtime", pax::format_time(secs, nanos).as_bytes());
        }
        let utf8 = std::str::from_utf8(path).is_ok() && link.is_none_or(|l| std::str::from_utf8(l).is_ok());
        if !utf8 {
            pax::push_record(&mut records, "hdrcharset", b"BINARY");
        }
        if !utf8 || !set_ustar_path(&mut header, path) {
            pax::push_record(&mut records, "path", path);
            set_ustar_path(&mut header, placeholder(path, 100).as_bytes());
        }
        if let Some(link) = link {
            if !utf8 || header.set_link_name_literal(link).is_err() {
                pax::push_record(&mut records, "linkpath", link);
                header
                    .set_link_name_literal(placeholder(link, 100))
                    .map_err(|e| self.error("archive", path, e))?;
            }
        }
        header.set_cksum();
        if !records.is_empty() {
            let mut pax_header = Header::new_ustar();
            pax_header.set_entry_type(EntryType::XHeader);
            pax_header.set_mode(0o644);
            pax_header.set_size(records.len() as u64);
            pax_header.set_mtime(secs.clamp(0, USTAR_MAX_TIME) as u64);
            set_ustar_path(
                &mut pax_header,
                format!("PaxHeaders/{}", placeholder(path, 88)).as_bytes(),
            );
            pax_header.set_cksum();
            self.write(pax_header.as_bytes())?;
            self.write(&records)?;
            self.pad(records.len() as u64)?;
        }
        self.write(header.as_bytes())?;
        self.summary.entries += 1;
        Ok(())
    }

    fn sandbox_id(&self, host: u32) -> u32 {
        host.checked_sub(self.ids.base)
            .filter(|id| *id < self.ids.count)
            .unwrap_or(OVERFLOW_ID)
    }
}

/// Puts `path` verbatim into the ustar `name` field, or split at a `/` into `prefix` (155 bytes) and
/// `name` (100 bytes); false if it fits neither way. (The tar crate's `set_path` normalises `.`
/// components and trailing slashes away; an archive member's name should be exactly what was meant.)
fn set_ustar_path(header: &mut Header, path: &[u8]) -> bool {
    let Some(ustar) = header.as_ustar_mut() else {
        return false;
    };
    let (prefix, name) = if path.len() <= ustar.name.len() {
        (&b""[..], path)
    } else {
        // The last usable slash: the name after it must be non-empty and fit, the prefix must fit.
        let split = path[..path.len() - 1]
            .iter()
            .enumerate()
            .rev()
            .filter(|&(_, &b)| b == b'/')
            .map(|(i, _)| i)
            .find(|&i| i <= ustar.prefix.len() && path.len() - i - 1 <= ustar.name.len());
        match split {
            Some(i) if i > 0 => (&path[..i], &path[i + 1..]),
            _ => return false,
        }
    };
    ustar.name.fill(0);
    ustar.prefix.fill(0);
    ustar.name[..name.len()].copy_from_slice(name);
    ustar.prefix[..prefix.len()].copy_from_slice(prefix);
    true
}

/// What the ustar name field holds when the real name is in a pax record: the name's last `max`
/// bytes of printable ASCII (readers that ignore pax see something recognisable).
fn placeholder(name: &[u8], max: usize) -> String {
    let printable: String = name
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() && b != b'\\' {
                b as char
            } else {
                '_'
            }
        })
        .collect();
    let trimmed = printable.trim_matches('/');
    let start = trimmed.len().saturating_sub(max);
    let tail = trimmed[start..].trim_start_matches(['/', '.']);
    if tail.is_empty() {
        "pax".to_owned()
    } else {
        tail.to_owned()
    }
}
