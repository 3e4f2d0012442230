//! A sandbox's view of its files: its own tree at `/`, named volumes mounted at their paths, path
//! resolution with symlinks kept inside the view, and the file operations the agent double and its
//! commands perform, each failing with the errno the real agent's system calls would give and
//! reporting the change events a watch sees.
//!
//! What it does not do: check permissions (every operation succeeds as if made by root, whatever the
//! user; only read-only mounts refuse writes), keep hard links, or let a rename cross a mount point
//! (refused, as the kernel does with `EXDEV`).

use std::io;

use paddock_protocol::{ErrorCode, FsEvent, FsEventKind};
use paddock_types::{SandboxId, VolumeId};

use super::state::{Disk, State};
use super::tree::{components, display, now_ms, Node, NodeKind};

/// Symlinks followed in one resolution before it fails with `ELOOP`, as Linux does.
const MAX_SYMLINKS: u32 = 40;

/// A failed file operation: the errno the kernel would have returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FsError(pub(crate) i32);

impl FsError {
    /// The protocol's code for it (the real agent's `io_error_code`).
    pub(crate) fn code(self) -> ErrorCode {
        match self.0 {
            libc::ENOENT => ErrorCode::NotFound,
            libc::EEXIST => ErrorCode::AlreadyExists,
            libc::EACCES | libc::EPERM | libc::EROFS => ErrorCode::PermissionDenied,
            libc::ENOTDIR => ErrorCode::NotADirectory,
            libc::EISDIR => ErrorCode::IsADirectory,
            libc::ENOTEMPTY => ErrorCode::DirectoryNotEmpty,
            libc::EXDEV | libc::ELOOP | libc::EINVAL | libc::ENAMETOOLONG => ErrorCode::InvalidPath,
            libc::ENOSPC | libc::EDQUOT => ErrorCode::NoSpace,
            _ => ErrorCode::Io,
        }
    }

    /// The system's text for it ("No such file or directory (os error 2)").
    pub(crate) fn io(self) -> io::Error {
        io::Error::from_raw_os_error(self.0)
    }
}

/// Where a sandbox's view mounts a named volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountPoint {
    /// The mount point's components.
    pub(crate) at: Vec<String>,
    pub(crate) volume: VolumeId,
    pub(crate) read_only: bool,
}

/// Whose tree a sandbox sees at `/` and which volumes where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Namespace {
    pub(crate) sandbox: SandboxId,
    pub(crate) mounts: Vec<MountPoint>,
}

/// Metadata of one entry as `stat` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) name: String,
    pub(crate) node: Node,
}

/// The file operations of one sandbox's view, on the locked state.
pub(crate) struct Fs<'a> {
    state: &'a mut State,
    ns: &'a Namespace,
}

/// Which tree of the view a path lies in: the sandbox's own (`None`) or a mount's.
type Place = (Option<usize>, usize);

impl<'a> Fs<'a> {
    pub(crate) fn new(state: &'a mut State, ns: &'a Namespace) -> Self {
        Self { state, ns }
    }

    /// The mount a path lies in (the longest mount point that is a prefix of it) and how many of
    /// its components lead to that tree's root.
    fn place(&self, abs: &[String]) -> Place {
        self.ns
            .mounts
            .iter()
            .enumerate()
            .filter(|(_, m)| abs.starts_with(&m.at))
            .max_by_key(|(_, m)| m.at.len())
            .map_or((None, 0), |(i, m)| (Some(i), m.at.len()))
    }

    fn disk(&self, mount: Option<usize>) -> Result<&Disk, FsError> {
        let disk = match mount {
            None => self.state.sandboxes.get(&self.ns.sandbox).map(|l| &l.disk),
            Some(i) => self.state.volumes.get(&self.ns.mounts[i].volume),
        };
        disk.ok_or(FsError(libc::EIO))
    }

    fn disk_mut(&mut self, mount: Option<usize>) -> Result<&mut Disk, FsError> {
        let disk = match mount {
            None => self
                .state
                .sandboxes
                .get_mut(&self.ns.sandbox)
                .map(|l| &mut l.disk),
            Some(i) => self.state.volumes.get_mut(&self.ns.mounts[i].volume),
        };
        disk.ok_or(FsError(libc::EIO))
    }

    /// The entry at the absolute components `abs`, without following a final symlink.
    pub(crate) fn node(&self, abs: &[String]) -> Option<&Node> {
        let (mount, skip) = self.place(abs);
        self.disk(mount).ok()?.tree.get(&abs[skip..])
    }

    fn node_mut(&mut self, abs: &[String]) -> Result<&mut Node, FsError> {
        let (mount, skip) = self.place(abs);
        self.disk_mut(mount)?
            .tree
            .get_mut(&abs[skip..])
            .ok_or(FsError(libc::ENOENT))
    }

    fn writable(&self, abs: &[String]) -> Result<(), FsError> {
        match self.place(abs).0 {
            Some(i) if self.ns.mounts[i].read_only => Err(FsError(libc::EROFS)),
            _ => Ok(()),
        }
    }

    fn is_mount_point(&self, abs: &[String]) -> bool {
        self.ns.mounts.iter().any(|m| m.at.starts_with(abs))
    }

    /// Resolves an absolute path (a relative one is taken from `/`) to the absolute components of
    /// what it names, following symlinks inside the view (`..` never climbs above `/`). The final
    /// component may be missing (for a create); a missing or non-directory parent fails.
    pub(crate) fn resolve(&self, path: &str, follow_final: bool) -> Result<Vec<String>, FsError> {
        if path.contains('\0') {
            return Err(FsError(libc::EINVAL));
        }
        let mut pending: Vec<String> = components(path).into_iter().rev().collect();
        let mut current: Vec<String> = Vec::new();
        let mut links = 0;
        while let Some(name) = pending.pop() {
            if name == ".." {
                current.pop();
                continue;
            }
            if name.len() > 255 {
                return Err(FsError(libc::ENAMETOOLONG));
            }
            let last = pending.is_empty();
            let mut next = current.clone();
            next.push(name);
            match self.node(&next).map(|n| &n.kind) {
                None if last => return Ok(next),
                None => return Err(FsError(libc::ENOENT)),
                Some(NodeKind::Symlink(target)) if !last || follow_final => {
                    links += 1;
                    if links > MAX_SYMLINKS {
                        return Err(FsError(libc::ELOOP));
                    }
                    if target.starts_with('/') {
                        current.clear();
                    }
                    pending.extend(components(target).into_iter().rev());
                }
                Some(NodeKind::Dir(_)) => current = next,
                Some(_) if last => return Ok(next),
                Some(_) => return Err(FsError(libc::ENOTDIR)),
            }
        }
        Ok(current)
    }

    /// `lstat`.
    pub(crate) fn stat(&self, path: &str) -> Result<Entry, FsError> {
        let abs = self.resolve(path, false)?;
        let node = self.node(&abs).ok_or(FsError(libc::ENOENT))?;
        Ok(Entry {
            name: abs.last().cloned().unwrap_or_else(|| "/".to_owned()),
            node: shallow(node),
        })
    }

    /// Up to `max` bytes of a file from `offset`: the bytes and the file's size.
    pub(crate) fn read(&self, path: &str, offset: u64, max: usize) -> Result<(Vec<u8>, u64), FsError> {
        let abs = self.resolve(path, true)?;
        match self.node(&abs).map(|n| &n.kind) {
            None => Err(FsError(libc::ENOENT)),
            Some(NodeKind::Dir(_)) => Err(FsError(libc::EISDIR)),
            Some(NodeKind::Symlink(_)) => Err(FsError(libc::ELOOP)),
            Some(NodeKind::File(data)) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
                let end = start.saturating_add(max).min(data.len());
                Ok((data[start..end].to_vec(), data.len() as u64))
            }
        }
    }

    /// The entries of a directory, by name.
    pub(crate) fn list(&self, path: &str) -> Result<Vec<Entry>, FsError> {
        let abs = self.resolve(path, true)?;
        let node = self.node(&abs).ok_or(FsError(libc::ENOENT))?;
        let children = node.children().ok_or(FsError(libc::ENOTDIR))?;
        let mut entries: Vec<Entry> = children
            .iter()
            .map(|(name, child)| Entry {
                name: name.clone(),
                node: shallow(child),
            })
            .collect();
        // A mount point shows its volume's root (the directory under it is hidden).
        for entry in &mut entries {
            let mut at = abs.clone();
            at.push(entry.name.clone());
            if let Some(mounted) = self.node(&at) {
                entry.node = shallow(mounted);
            }
        }
        Ok(entries)
    }

    /// Writes `data` at `offset` (cutting the file at `offset` first with `truncate`), creating the
    /// file with `mode` and `owner` if it is missing. Returns the events of the change.
    pub(crate) fn write(
        &mut self,
        path: &str,
        offset: u64,
        truncate: bool,
        data: &[u8],
        create: (u32, u32, u32),
    ) -> Result<Vec<FsEvent>, FsError> {
        let abs = self.resolve(path, true)?;
        self.writable(&abs)?;
        let offset = usize::try_from(offset).map_err(|_| FsError(libc::EFBIG))?;
        let (mount, skip) = self.place(&abs);
        let (existing, old_len) = match self.node(&abs).map(|n| &n.kind) {
            Some(NodeKind::Dir(_)) => return Err(FsError(libc::EISDIR)),
            Some(NodeKind::Symlink(_)) => return Err(FsError(libc::ELOOP)),
            Some(NodeKind::File(old)) => (true, old.len()),
            None if abs.is_empty() => return Err(FsError(libc::EISDIR)),
            None => (false, 0),
        };
        let kept = if truncate { old_len.min(offset) } else { old_len };
        let new_len = if data.is_empty() {
            kept.max(if truncate { offset } else { 0 })
        } else {
            kept.max(offset + data.len())
        };
        let disk = self.disk_mut(mount)?;
        if let Some(limit) = disk.limit {
            let used = disk.tree.data_bytes();
            if (used - old_len as u64) + new_len as u64 > limit && new_len > old_len {
                return Err(FsError(libc::EDQUOT));
            }
        }
        let rel = &abs[skip..];
        let mut events = Vec::new();
        if !existing {
            let (mode, uid, gid) = create;
            let (name, parent) = rel.split_last().ok_or(FsError(libc::EISDIR))?;
            let dir = disk
                .tree
                .get_mut(parent)
                .and_then(Node::children_mut)
                .ok_or(FsError(libc::ENOENT))?;
            dir.insert(name.clone(), Node::file(Vec::new(), mode & 0o7777, uid, gid));
            events.push(event(&abs, FsEventKind::Create, false));
        }
        let node = disk.tree.get_mut(rel).ok_or(FsError(libc::ENOENT))?;
        if let NodeKind::File(content) = &mut node.kind {
            content.truncate(kept);
            if content.len() < new_len {
                content.resize(new_len, 0);
            }
            content[offset.min(new_len)..(offset + data.len()).min(new_len)].copy_from_slice(data);
        }
        node.mtime_ms = now_ms();
        if !data.is_empty() || new_len != old_len {
            events.push(event(&abs, FsEventKind::Modify, false));
        }
        Ok(events)
    }

    /// Creates a directory (with `parents`, every missing one on the way, and an existing
    /// directory is fine).
    pub(crate) fn mkdir(
        &mut self,
        path: &str,
        parents: bool,
        create: (u32, u32, u32),
    ) -> Result<Vec<FsEvent>, FsError> {
        let (mode, uid, gid) = create;
        let mut events = Vec::new();
        let wanted = components(path);
        let prefixes: Vec<usize> = if parents {
            (1..=wanted.len()).collect()
        } else {
            vec![wanted.len()]
        };
        for (i, n) in prefixes.iter().enumerate() {
            let last = i + 1 == prefixes.len();
            let prefix = format!("/{}", wanted[..*n].join("/"));
            let abs = self.resolve(&prefix, !last || parents)?;
            match self.node(&abs) {
                Some(node) if node.is_dir() && parents => continue,
                Some(_) if last => return Err(FsError(libc::EEXIST)),
                Some(_) => return Err(FsError(libc::ENOTDIR)),
                None => {}
            }
            self.writable(&abs)?;
            let (name, parent) = abs.split_last().ok_or(FsError(libc::EEXIST))?;
            let (parent, name) = (parent.to_vec(), name.clone());
            let dir = self
                .node_mut(&parent)?
                .children_mut()
                .ok_or(FsError(libc::ENOTDIR))?;
            dir.insert(name, Node::dir(mode & 0o7777, uid, gid));
            events.push(event(&abs, FsEventKind::Create, true));
        }
        Ok(events)
    }

    /// Removes a file, symlink or (empty, or with `recursive` any) directory.
    pub(crate) fn remove(&mut self, path: &str, recursive: bool) -> Result<Vec<FsEvent>, FsError> {
        let abs = self.resolve(path, false)?;
        if abs.is_empty() || self.is_mount_point(&abs) {
            return Err(FsError(libc::EBUSY));
        }
        self.writable(&abs)?;
        let node = self.node(&abs).ok_or(FsError(libc::ENOENT))?;
        if node.children().is_some_and(|c| !c.is_empty()) && !recursive {
            return Err(FsError(libc::ENOTEMPTY));
        }
        let mut events = Vec::new();
        let mut inner = Vec::new();
        node.walk(&mut |rel, child| {
            let mut p = abs.clone();
            p.extend_from_slice(rel);
            inner.push(event(&p, FsEventKind::Remove, child.is_dir()));
        });
        // Deepest first, as a recursive removal deletes them.
        inner.sort_by_key(|e| std::cmp::Reverse(e.path.matches('/').count()));
        events.extend(inner);
        events.push(event(&abs, FsEventKind::Remove, node.is_dir()));
        let (name, parent) = abs.split_last().ok_or(FsError(libc::EBUSY))?;
        let (parent, name) = (parent.to_vec(), name.clone());
        if let Some(dir) = self.node_mut(&parent)?.children_mut() {
            dir.remove(&name);
        }
        Ok(events)
    }

    /// Renames `from` to `to`, replacing `to` as `rename(2)` does.
    pub(crate) fn rename(&mut self, from: &str, to: &str) -> Result<Vec<FsEvent>, FsError> {
        let src = self.resolve(from, false)?;
        let dst = self.resolve(to, false)?;
        if src.is_empty() || dst.is_empty() || self.is_mount_point(&src) || self.is_mount_point(&dst) {
            return Err(FsError(libc::EBUSY));
        }
        if self.place(&src).0 != self.place(&dst).0 {
            return Err(FsError(libc::EXDEV));
        }
        self.writable(&src)?;
        let moving = self.node(&src).ok_or(FsError(libc::ENOENT))?;
        if src == dst {
            return Ok(Vec::new());
        }
        if dst.starts_with(&src) {
            return Err(FsError(libc::EINVAL));
        }
        let is_dir = moving.is_dir();
        match self.node(&dst) {
            Some(target) if target.is_dir() && !is_dir => return Err(FsError(libc::EISDIR)),
            Some(target) if !target.is_dir() && is_dir => return Err(FsError(libc::ENOTDIR)),
            Some(target) if target.children().is_some_and(|c| !c.is_empty()) => {
                return Err(FsError(libc::ENOTEMPTY))
            }
            _ => {}
        }
        let (dst_name, dst_parent) = dst.split_last().ok_or(FsError(libc::EBUSY))?;
        if !self.node(dst_parent).is_some_and(Node::is_dir) {
            return Err(FsError(libc::ENOENT));
        }
        let (src_name, src_parent) = src.split_last().ok_or(FsError(libc::EBUSY))?;
        let node = self
            .node_mut(src_parent)?
            .children_mut()
            .and_then(|c| c.remove(src_name))
            .ok_or(FsError(libc::ENOENT))?;
        self.node_mut(dst_parent)?
            .children_mut()
            .ok_or(FsError(libc::ENOTDIR))?
            .insert(dst_name.clone(), node);
        Ok(vec![
            event(&src, FsEventKind::RenameFrom, is_dir),
            event(&dst, FsEventKind::RenameTo, is_dir),
        ])
    }

    /// Creates a symlink at `path` (refused if something is there).
    pub(crate) fn symlink(
        &mut self,
        path: &str,
        target: &str,
        owner: (u32, u32),
    ) -> Result<Vec<FsEvent>, FsError> {
        let abs = self.resolve(path, false)?;
        self.writable(&abs)?;
        if self.node(&abs).is_some() {
            return Err(FsError(libc::EEXIST));
        }
        let (name, parent) = abs.split_last().ok_or(FsError(libc::EEXIST))?;
        let (parent, name) = (parent.to_vec(), name.clone());
        self.node_mut(&parent)?
            .children_mut()
            .ok_or(FsError(libc::ENOTDIR))?
            .insert(name, Node::symlink(target.to_owned(), owner.0, owner.1));
        Ok(vec![event(&abs, FsEventKind::Create, false)])
    }

    /// Sets the permission bits of what `path` names (symlinks followed).
    pub(crate) fn chmod(&mut self, path: &str, mode: u32) -> Result<Vec<FsEvent>, FsError> {
        let abs = self.resolve(path, true)?;
        self.writable(&abs)?;
        let node = self.node_mut(&abs)?;
        node.mode = mode & 0o7777;
        let is_dir = node.is_dir();
        Ok(vec![event(&abs, FsEventKind::Attrib, is_dir)])
    }

    /// Puts `node` (a whole subtree) at `path`, merging into an existing directory and replacing
    /// files (an unpacked archive).
    pub(crate) fn merge(&mut self, path: &str, node: Node) -> Result<Vec<FsEvent>, FsError> {
        let abs = self.resolve(path, true)?;
        self.writable(&abs)?;
        let mut events = Vec::new();
        let mut items = Vec::new();
        node.walk(&mut |rel, child| items.push((rel.to_vec(), child.clone())));
        for (rel, child) in items {
            let mut at = abs.clone();
            at.extend(rel);
            let exists = self.node(&at).is_some();
            let (name, parent) = at.split_last().ok_or(FsError(libc::EEXIST))?;
            let (parent, name) = (parent.to_vec(), name.clone());
            let dir = self
                .node_mut(&parent)?
                .children_mut()
                .ok_or(FsError(libc::ENOTDIR))?;
            let is_dir = child.is_dir();
            match dir.get_mut(&name) {
                Some(existing) if existing.is_dir() && is_dir => {
                    existing.mode = child.mode;
                    continue;
                }
                _ => {
                    let mut fresh = child;
                    if let Some(c) = fresh.children_mut() {
                        c.clear();
                    }
                    dir.insert(name, fresh);
                }
            }
            let kind = if exists {
                FsEventKind::Modify
            } else {
                FsEventKind::Create
            };
            events.push(event(&at, kind, is_dir));
        }
        Ok(events)
    }

    /// The subtree at `path` (symlinks followed), as a copy.
    pub(crate) fn subtree(&self, path: &str) -> Result<Node, FsError> {
        let abs = self.resolve(path, true)?;
        self.node(&abs).cloned().ok_or(FsError(libc::ENOENT))
    }

    /// `name`'s entry in the view's `/etc/passwd`: uid, gid and home.
    pub(crate) fn user(&self, name: &str) -> Option<(u32, u32, String)> {
        let (passwd, _) = self.read("/etc/passwd", 0, 8 << 20).ok()?;
        String::from_utf8_lossy(&passwd).lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 7 || fields[0] != name {
                return None;
            }
            Some((
                fields[2].parse().ok()?,
                fields[3].parse().ok()?,
                fields[5].to_owned(),
            ))
        })
    }
}

/// A change event at `abs`.
pub(crate) fn event(abs: &[String], kind: FsEventKind, is_dir: bool) -> FsEvent {
    FsEvent {
        path: display(abs),
        kind,
        is_dir,
    }
}

/// A copy of a node's metadata (a directory without its children).
fn shallow(node: &Node) -> Node {
    match &node.kind {
        NodeKind::Dir(_) => Node {
            kind: NodeKind::Dir(Default::default()),
            ..node.clone()
        },
        _ => node.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::state::Live;
    use crate::fake::tree::template;

    fn state_with(id: &SandboxId) -> State {
        let mut state = State::default();
        state.sandboxes.insert(id.clone(), Live::for_tests(template()));
        state
    }

    #[test]
    fn symlinks_resolve_inside_the_view() {
        let id: SandboxId = "sb-test".parse().expect("id");
        let mut state = state_with(&id);
        let ns = Namespace {
            sandbox: id,
            mounts: Vec::new(),
        };
        let mut fs = Fs::new(&mut state, &ns);
        fs.symlink("/home/user/up", "../../..", (0, 0)).expect("link");
        fs.symlink("/home/user/etc", "/etc", (0, 0)).expect("link");
        assert_eq!(fs.resolve("/home/user/up/etc", true), Ok(vec!["etc".to_owned()]));
        let (passwd, _) = fs.read("/home/user/etc/passwd", 0, 100).expect("read");
        assert!(passwd.starts_with(b"root:"));
        fs.symlink("/tmp/loop", "/tmp/loop", (0, 0)).expect("link");
        assert_eq!(fs.read("/tmp/loop", 0, 1), Err(FsError(libc::ELOOP)));
        assert_eq!(fs.read("/nope/x", 0, 1), Err(FsError(libc::ENOENT)));
        assert_eq!(fs.read("/etc/passwd/x", 0, 1), Err(FsError(libc::ENOTDIR)));
        assert_eq!(
            fs.stat("/home/user/up").expect("lstat").node.kind,
            NodeKind::Symlink("../../..".into())
        );
    }

    #[test]
    fn writes_mkdirs_renames_and_removes_report_events() {
        let id: SandboxId = "sb-test".parse().expect("id");
        let mut state = state_with(&id);
        let ns = Namespace {
            sandbox: id,
            mounts: Vec::new(),
        };
        let mut fs = Fs::new(&mut state, &ns);
        let e = fs
            .write("/tmp/a", 0, true, b"hello", (0o644, 1000, 1000))
            .expect("write");
        assert_eq!(
            e.iter().map(|e| e.kind).collect::<Vec<_>>(),
            [FsEventKind::Create, FsEventKind::Modify]
        );
        fs.write("/tmp/a", 5, false, b"!", (0o644, 0, 0)).expect("append");
        assert_eq!(fs.read("/tmp/a", 0, 100).expect("read").0, b"hello!");
        fs.write("/tmp/a", 2, true, b"", (0o644, 0, 0)).expect("truncate");
        assert_eq!(fs.read("/tmp/a", 0, 100).expect("read").0, b"he");
        fs.mkdir("/tmp/d/e/f", true, (0o755, 0, 0)).expect("mkdir -p");
        assert_eq!(
            fs.mkdir("/tmp/d", false, (0o755, 0, 0)),
            Err(FsError(libc::EEXIST))
        );
        assert_eq!(
            fs.mkdir("/tmp/x/y", false, (0o755, 0, 0)),
            Err(FsError(libc::ENOENT))
        );
        assert_eq!(fs.remove("/tmp/d", false), Err(FsError(libc::ENOTEMPTY)));
        fs.rename("/tmp/a", "/tmp/d/e/b").expect("rename");
        assert_eq!(fs.rename("/tmp/d", "/tmp/d/e/g"), Err(FsError(libc::EINVAL)));
        let removed = fs.remove("/tmp/d", true).expect("rm -r");
        assert_eq!(removed.first().map(|e| e.path.as_str()), Some("/tmp/d/e/b"));
        assert_eq!(removed.last().map(|e| e.path.as_str()), Some("/tmp/d"));
        assert_eq!(fs.list("/tmp").expect("ls").len(), 0);
    }
}
