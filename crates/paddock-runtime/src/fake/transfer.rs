//! In-memory trees as real tar streams (the `tar` crate): [`write_tree`] for snapshot exports and
//! the interpreter's `tar -c`, [`read_tree`] for imports and `tar -x`.
//!
//! An export holds the root as `./`, then every entry depth-first with siblings in byte order:
//! directories, regular files, symlinks, each with its mode (set-id bits cleared and counted unless
//! kept), owner and mtime. Long names travel as GNU long-name members (the native writes pax
//! records); both are read back by the `tar` crate.
//!
//! An import refuses, with [`RuntimeError::InvalidArchive`], absolute names, `..`, NUL bytes,
//! devices, fifos, hard links to anything but an earlier regular file, duplicate members, members
//! "through" a symlink or file, and owners outside the sandbox id range; with
//! [`RuntimeError::ArchiveTooLarge`], more bytes or members than its [`ImportLimits`]. Nothing of a
//! refused archive is kept (it is built in memory and only returned whole); data after the
//! end-of-archive marker must be zero padding. Not checked, unlike the native import: a stream that
//! ends between members without the end-of-archive marker is taken as complete, and pax records are
//! not interpreted beyond what the `tar` crate applies.

use std::io::{self, Read, Write};

use tar::{EntryType, Header};

use super::tree::{Node, NodeKind, ROOT_ID};
use crate::{ExportOptions, ImportLimits, RuntimeError, TransferSummary};

/// Set-id bits, cleared from exports unless kept.
const SET_ID_BITS: u32 = 0o6000;
/// Sandbox ids an archive's owners must lie in.
const ID_COUNT: u64 = 65_536;
/// The top-level directories a sandbox's storage must have (an imported snapshot gets the missing
/// ones, as the native import does).
const VOLUME_DIRS: [(&str, u32); 4] = [("etc", 0o755), ("home", 0o755), ("root", 0o700), ("tmp", 0o1777)];

/// Counts what goes through, and remembers whether the other side failed.
struct CountingWriter<'a> {
    inner: &'a mut dyn Write,
    written: u64,
    failed: Option<io::Error>,
}

impl Write for CountingWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.inner.write(buf) {
            Ok(n) => {
                self.written += n as u64;
                Ok(n)
            }
            Err(e) => {
                let copy = io::Error::new(e.kind(), e.to_string());
                self.failed = Some(e);
                Err(copy)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Writes `tree` to `out` as a tar stream ending with the end-of-archive marker.
pub(crate) fn write_tree(
    tree: &Node,
    options: &ExportOptions,
    out: &mut dyn Write,
) -> Result<TransferSummary, RuntimeError> {
    let mut counting = CountingWriter {
        inner: out,
        written: 0,
        failed: None,
    };
    let mut summary = TransferSummary::default();
    let result = (|| -> io::Result<()> {
        let mut builder = tar::Builder::new(&mut counting);
        append(&mut builder, "./", tree, options, &mut summary)?;
        let mut members = Vec::new();
        tree.walk(&mut |path, node| members.push((path.join("/"), node.clone())));
        for (path, node) in &members {
            append(&mut builder, path, node, options, &mut summary)?;
        }
        builder.into_inner()?.flush()
    })();
    let written = counting.written;
    match (result, counting.failed) {
        (Ok(()), _) => {
            summary.bytes = written;
            Ok(summary)
        }
        (Err(_), Some(source)) | (Err(source), None) => Err(RuntimeError::Stream {
            what: "write",
            source,
        }),
    }
}

fn append<W: Write>(
    builder: &mut tar::Builder<W>,
    path: &str,
    node: &Node,
    options: &ExportOptions,
    summary: &mut TransferSummary,
) -> io::Result<()> {
    let mut header = Header::new_gnu();
    let mut mode = node.mode & 0o7777;
    if !options.keep_setid && mode & SET_ID_BITS != 0 {
        mode &= !SET_ID_BITS;
        summary.setid_cleared += 1;
    }
    header.set_mode(mode);
    header.set_uid(u64::from(node.uid));
    header.set_gid(u64::from(node.gid));
    header.set_mtime(u64::try_from(node.mtime_ms / 1000).unwrap_or(0));
    summary.entries += 1;
    match &node.kind {
        NodeKind::Dir(_) => {
            header.set_entry_type(EntryType::Directory);
            header.set_size(0);
            let name = if path.ends_with('/') {
                path.to_owned()
            } else {
                format!("{path}/")
            };
            builder.append_data(&mut header, name, io::empty())
        }
        NodeKind::File(data) => {
            header.set_entry_type(EntryType::Regular);
            header.set_size(data.len() as u64);
            summary.data_bytes += data.len() as u64;
            builder.append_data(&mut header, path, data.as_slice())
        }
        NodeKind::Symlink(target) => {
            header.set_entry_type(EntryType::Symlink);
            header.set_size(0);
            builder.append_link(&mut header, path, target)
        }
    }
}

/// Reads at most `max` bytes from `inner`, remembering whether it went past or failed.
struct LimitedReader<'a> {
    inner: &'a mut dyn Read,
    read: u64,
    max: u64,
    over: bool,
    failed: Option<io::Error>,
}

impl Read for LimitedReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = (self.max + 1).saturating_sub(self.read);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        match self.inner.read(&mut buf[..want]) {
            Ok(n) => {
                self.read += n as u64;
                if self.read > self.max {
                    self.over = true;
                    return Err(io::Error::other("the archive is too large"));
                }
                Ok(n)
            }
            Err(e) => {
                let copy = io::Error::new(e.kind(), e.to_string());
                self.failed = Some(e);
                Err(copy)
            }
        }
    }
}

/// Why an import failed (before it is told apart from the reader's state).
enum Refusal {
    Invalid(String),
    TooLarge(String),
    Io(io::Error),
}

impl From<io::Error> for Refusal {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Unpacks the tar stream `input` into a new tree. A `snapshot` import is strict about owners and
/// gets the top-level directories a sandbox needs when they are missing; otherwise (`tar -x` in a
/// sandbox, which takes the files as its own user) unreadable owners and times count as 0.
pub(crate) fn read_tree(
    input: &mut dyn Read,
    limits: &ImportLimits,
    snapshot: bool,
) -> Result<(Node, TransferSummary), RuntimeError> {
    let mut reader = LimitedReader {
        inner: input,
        read: 0,
        max: limits.max_bytes,
        over: false,
        failed: None,
    };
    let mut summary = TransferSummary::default();
    let mut root = Node::dir(0o755, ROOT_ID, ROOT_ID);
    let result = unpack(&mut reader, limits, snapshot, &mut root, &mut summary);
    let result = match result {
        Ok(()) if snapshot => add_volume_dirs(&mut root),
        other => other,
    };
    if reader.over {
        return Err(RuntimeError::ArchiveTooLarge(format!(
            "the archive is larger than {} bytes",
            limits.max_bytes
        )));
    }
    if let Some(source) = reader.failed.take() {
        return Err(RuntimeError::Stream { what: "read", source });
    }
    match result {
        Ok(()) => {
            summary.bytes = reader.read;
            Ok((root, summary))
        }
        Err(Refusal::Invalid(message)) => Err(RuntimeError::InvalidArchive(message)),
        Err(Refusal::TooLarge(message)) => Err(RuntimeError::ArchiveTooLarge(message)),
        Err(Refusal::Io(e)) => Err(RuntimeError::InvalidArchive(format!(
            "the archive is malformed or truncated ({e})"
        ))),
    }
}

fn unpack(
    reader: &mut LimitedReader<'_>,
    limits: &ImportLimits,
    strict: bool,
    root: &mut Node,
    summary: &mut TransferSummary,
) -> Result<(), Refusal> {
    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries()? {
        let mut entry = entry?;
        summary.entries += 1;
        if summary.entries > limits.max_entries {
            return Err(Refusal::TooLarge(format!(
                "the archive has more than {} members",
                limits.max_entries
            )));
        }
        let kind = entry.header().entry_type();
        if kind == EntryType::XGlobalHeader {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let path = member_path(&name)?;
        let header = entry.header();
        let bad = |what: &str, e: io::Error| Refusal::Invalid(format!("member {name}: bad {what}: {e}"));
        let field = |what: &str, value: io::Result<u64>| match value {
            Ok(v) => Ok(v),
            Err(_) if !strict => Ok(0),
            Err(e) => Err(bad(what, e)),
        };
        let mode = header.mode().map_err(|e| bad("mode", e))? & 0o7777;
        let uid = field("uid", header.uid())?;
        let gid = field("gid", header.gid())?;
        let mtime = field("mtime", header.mtime())?;
        for id in [uid, gid] {
            if id >= ID_COUNT {
                return Err(Refusal::Invalid(format!(
                    "member {name} is owned by id {id}, outside the sandbox id range 0..{ID_COUNT}"
                )));
            }
        }
        let make = |kind: NodeKind| Node {
            kind,
            mode,
            uid: uid as u32,
            gid: gid as u32,
            mtime_ms: i64::try_from(mtime).unwrap_or(0).saturating_mul(1000),
        };
        let node = match kind {
            EntryType::Directory => make(NodeKind::Dir(Default::default())),
            EntryType::Regular | EntryType::Continuous => {
                let mut data = Vec::new();
                entry.read_to_end(&mut data)?;
                summary.data_bytes += data.len() as u64;
                make(NodeKind::File(data))
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| Refusal::Invalid(format!("symlink {name} has no target")))?;
                make(NodeKind::Symlink(String::from_utf8_lossy(&target).into_owned()))
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| Refusal::Invalid(format!("hard link {name} has no target")))?;
                let target = member_path(&String::from_utf8_lossy(&target))?;
                match root.get(&target) {
                    Some(
                        file @ Node {
                            kind: NodeKind::File(_),
                            ..
                        },
                    ) => file.clone(),
                    _ => {
                        return Err(Refusal::Invalid(format!(
                            "hard link {name} does not point to an earlier regular file of the archive"
                        )))
                    }
                }
            }
            EntryType::Char | EntryType::Block => {
                return Err(Refusal::Invalid(format!(
                    "member {name} is a device node; snapshots cannot hold devices"
                )))
            }
            EntryType::Fifo => {
                return Err(Refusal::Invalid(format!(
                    "member {name} is a fifo; snapshots cannot hold fifos"
                )))
            }
            other => {
                return Err(Refusal::Invalid(format!(
                    "member {name} has an unsupported type ({:?})",
                    other.as_byte() as char
                )))
            }
        };
        place(root, &path, node, &name)?;
    }
    // What follows the end-of-archive marker may only be zero padding (read under the byte cap).
    let rest = archive.into_inner();
    let mut buf = [0u8; 8192];
    loop {
        let n = rest.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        if buf[..n].iter().any(|&b| b != 0) {
            return Err(Refusal::Invalid(
                "the archive has data after its end-of-archive marker".into(),
            ));
        }
    }
}

/// A member name as components: relative plain names only.
fn member_path(name: &str) -> Result<Vec<String>, Refusal> {
    if name.is_empty() || name.contains('\0') {
        return Err(Refusal::Invalid(format!("member {name:?} has an invalid name")));
    }
    if name.starts_with('/') {
        return Err(Refusal::Invalid(format!(
            "member {name:?} has an absolute path (archives hold paths relative to the snapshot's root)"
        )));
    }
    let mut components = Vec::new();
    for c in name.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(Refusal::Invalid(format!("member {name:?} has a `..` component"))),
            c => components.push(c.to_owned()),
        }
    }
    Ok(components)
}

/// Puts `node` at `path` under `root`, creating missing parents as root's 0755 directories.
fn place(root: &mut Node, path: &[String], node: Node, name: &str) -> Result<(), Refusal> {
    let Some((last, parents)) = path.split_last() else {
        // The root itself: only its metadata.
        if !node.is_dir() {
            return Err(Refusal::Invalid(
                "the archive's root member `.` must be a directory".into(),
            ));
        }
        root.mode = node.mode;
        root.uid = node.uid;
        root.gid = node.gid;
        return Ok(());
    };
    let mut dir = root;
    for parent in parents {
        let children = dir
            .children_mut()
            .ok_or_else(|| Refusal::Invalid(format!("member {name} lies through a file or symlink")))?;
        dir = children
            .entry(parent.clone())
            .or_insert_with(|| Node::dir(0o755, ROOT_ID, ROOT_ID));
    }
    let children = dir
        .children_mut()
        .ok_or_else(|| Refusal::Invalid(format!("member {name} lies through a file or symlink")))?;
    match children.get_mut(last) {
        Some(existing) if existing.is_dir() && node.is_dir() => {
            existing.mode = node.mode;
            existing.uid = node.uid;
            existing.gid = node.gid;
            Ok(())
        }
        Some(_) => Err(Refusal::Invalid(format!(
            "member {name} appears twice (or over a directory of that name)"
        ))),
        None => {
            children.insert(last.clone(), node);
            Ok(())
        }
    }
}

fn add_volume_dirs(root: &mut Node) -> Result<(), Refusal> {
    let Some(children) = root.children_mut() else {
        return Ok(());
    };
    for (name, mode) in VOLUME_DIRS {
        match children.get(name) {
            Some(node) if node.is_dir() => {}
            Some(_) => {
                return Err(Refusal::Invalid(format!(
                    "member {name} must be a directory: a sandbox's /{name} is mounted from it"
                )))
            }
            None => {
                children.insert(name.to_owned(), Node::dir(mode, ROOT_ID, ROOT_ID));
            }
        }
    }
    Ok(())
}

/// `tree` with every entry owned by `uid`:`gid` (`tar --no-same-owner`).
pub(crate) fn owned_by(mut tree: Node, uid: u32, gid: u32) -> Node {
    fn set(node: &mut Node, uid: u32, gid: u32) {
        node.uid = uid;
        node.gid = gid;
        if let Some(children) = node.children_mut() {
            for child in children.values_mut() {
                set(child, uid, gid);
            }
        }
    }
    set(&mut tree, uid, gid);
    tree
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::tree::{components, template};

    #[test]
    fn a_tree_round_trips() {
        let mut tree = template();
        let home = tree.get_mut(&components("home/user")).expect("home");
        let children = home.children_mut().expect("dir");
        children.insert("f".into(), Node::file(b"one\n".to_vec(), 0o4755, 1000, 1000));
        children.insert("link".into(), Node::symlink("f".into(), 1000, 1000));
        let long = "x".repeat(150);
        children.insert(long.clone(), Node::file(b"long".to_vec(), 0o600, 1000, 1000));
        let mut archive = Vec::new();
        let summary = write_tree(&tree, &ExportOptions::default(), &mut archive).expect("export");
        assert_eq!(summary.bytes, archive.len() as u64);
        assert_eq!(summary.setid_cleared, 1);
        let (back, read) =
            read_tree(&mut archive.as_slice(), &ImportLimits::default(), true).expect("import");
        assert_eq!(read.entries, summary.entries);
        let f = back.get(&components("home/user/f")).expect("f");
        assert_eq!(
            (f.mode, f.kind.clone()),
            (0o755, NodeKind::File(b"one\n".to_vec()))
        );
        assert!(back.get(&components(&format!("home/user/{long}"))).is_some());
        assert_eq!(
            back.get(&components("home/user/link")).map(|n| n.kind.clone()),
            Some(NodeKind::Symlink("f".into()))
        );
    }

    #[test]
    fn hostile_and_oversized_archives_are_refused() {
        let archive_of = |name: &str, kind: EntryType| {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = Header::new_gnu();
            h.set_entry_type(kind);
            h.set_size(1);
            h.set_mode(0o644);
            // Bypass the crate's own path checks for hostile names.
            let bytes = name.as_bytes();
            h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            h.set_cksum();
            b.append(&h, &b"x"[..]).expect("append");
            b.into_inner().expect("archive")
        };
        for (name, kind) in [
            ("../escape", EntryType::Regular),
            ("/abs", EntryType::Regular),
            ("dev", EntryType::Char),
            ("fifo", EntryType::Fifo),
        ] {
            let archive = archive_of(name, kind);
            let e = read_tree(&mut archive.as_slice(), &ImportLimits::default(), true).expect_err(name);
            assert!(matches!(e, RuntimeError::InvalidArchive(_)), "{name}: {e:?}");
        }
        let archive = archive_of("ok", EntryType::Regular);
        let small = ImportLimits {
            max_bytes: 100,
            max_entries: 10,
        };
        let e = read_tree(&mut archive.as_slice(), &small, true).expect_err("too large");
        assert!(matches!(e, RuntimeError::ArchiveTooLarge(_)), "{e:?}");
        let truncated = &archive[..700];
        let e = read_tree(&mut &truncated[..], &ImportLimits::default(), true).expect_err("truncated");
        assert!(matches!(e, RuntimeError::InvalidArchive(_)), "{e:?}");
    }
}
