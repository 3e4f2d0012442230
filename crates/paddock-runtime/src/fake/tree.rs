//! An in-memory file tree: directories, regular files and symlinks with modes, owners and mtimes.
//!
//! A tree is a plain owned value: a snapshot is a deep copy, a rollback replaces one tree with a
//! copy of another. Nothing here resolves symlinks or knows about mounts (`fs.rs` does), and nothing
//! here is shared between sandboxes: sharing (named volumes) is a mount of another tree.
//!
//! What a tree does not hold: hard links (a second name is a copy), fifos, sockets and devices,
//! extended attributes, access times.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// Uid and gid of the sandbox's `root`.
pub(crate) const ROOT_ID: u32 = 0;
/// Uid and gid of the sandbox's default user, `user`.
pub(crate) const USER_ID: u32 = 1000;

/// The sandbox's `/etc/passwd`, as the native backend's template writes it.
const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000:user:/home/user:/bin/bash\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
/// The sandbox's `/etc/group`, as the native backend's template writes it.
const GROUP: &str = "root:x:0:\ntty:x:5:\nusers:x:100:user\nuser:x:1000:\nnogroup:x:65534:\n";

/// One entry of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) kind: NodeKind,
    /// Permission bits (setuid, setgid and sticky included).
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// Modification time, milliseconds since the Unix epoch.
    pub(crate) mtime_ms: i64,
}

/// What an entry is, with its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NodeKind {
    File(Vec<u8>),
    /// Children by name, in byte order.
    Dir(BTreeMap<String, Node>),
    /// The target, verbatim.
    Symlink(String),
}

/// The current time as a tree records it.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Node {
    /// An empty directory.
    pub(crate) fn dir(mode: u32, uid: u32, gid: u32) -> Self {
        Self {
            kind: NodeKind::Dir(BTreeMap::new()),
            mode,
            uid,
            gid,
            mtime_ms: now_ms(),
        }
    }

    /// A regular file.
    pub(crate) fn file(data: Vec<u8>, mode: u32, uid: u32, gid: u32) -> Self {
        Self {
            kind: NodeKind::File(data),
            mode,
            uid,
            gid,
            mtime_ms: now_ms(),
        }
    }

    /// A symlink (mode 0777, as Linux reports them).
    pub(crate) fn symlink(target: String, uid: u32, gid: u32) -> Self {
        Self {
            kind: NodeKind::Symlink(target),
            mode: 0o777,
            uid,
            gid,
            mtime_ms: now_ms(),
        }
    }

    pub(crate) fn is_dir(&self) -> bool {
        matches!(self.kind, NodeKind::Dir(_))
    }

    /// The size `stat` reports: a file's length, a symlink target's length, 0 for a directory.
    pub(crate) fn size(&self) -> u64 {
        match &self.kind {
            NodeKind::File(data) => data.len() as u64,
            NodeKind::Symlink(target) => target.len() as u64,
            NodeKind::Dir(_) => 0,
        }
    }

    /// Bytes of regular files' contents in this subtree (what the fake counts as disk use).
    pub(crate) fn data_bytes(&self) -> u64 {
        match &self.kind {
            NodeKind::File(data) => data.len() as u64,
            NodeKind::Symlink(_) => 0,
            NodeKind::Dir(children) => children.values().map(Node::data_bytes).sum(),
        }
    }

    pub(crate) fn children(&self) -> Option<&BTreeMap<String, Node>> {
        match &self.kind {
            NodeKind::Dir(children) => Some(children),
            _ => None,
        }
    }

    pub(crate) fn children_mut(&mut self) -> Option<&mut BTreeMap<String, Node>> {
        match &mut self.kind {
            NodeKind::Dir(children) => Some(children),
            _ => None,
        }
    }

    /// The entry at `path` (components below this node), without following symlinks.
    pub(crate) fn get(&self, path: &[String]) -> Option<&Node> {
        let mut node = self;
        for name in path {
            node = node.children()?.get(name)?;
        }
        Some(node)
    }

    /// [`Node::get`], mutable.
    pub(crate) fn get_mut(&mut self, path: &[String]) -> Option<&mut Node> {
        let mut node = self;
        for name in path {
            node = node.children_mut()?.get_mut(name)?;
        }
        Some(node)
    }

    /// Calls `f` with the path (components) and node of every entry below this one, parents before
    /// children, siblings in byte order.
    pub(crate) fn walk(&self, f: &mut dyn FnMut(&[String], &Node)) {
        fn go(node: &Node, path: &mut Vec<String>, f: &mut dyn FnMut(&[String], &Node)) {
            if let Some(children) = node.children() {
                for (name, child) in children {
                    path.push(name.clone());
                    f(path, child);
                    go(child, path, f);
                    path.pop();
                }
            }
        }
        go(self, &mut Vec::new(), f);
    }
}

/// What a new sandbox's file system starts as: the native template's layout (`/etc` with `passwd`,
/// `group` and `resolv.conf`; `/home/user` owned by `user`; `/root`; `/tmp`). There is no `/usr`
/// or `/bin`: the agent double's commands are built in.
pub(crate) fn template() -> Node {
    let mut root = Node::dir(0o755, ROOT_ID, ROOT_ID);
    let mut etc = Node::dir(0o755, ROOT_ID, ROOT_ID);
    let files = [
        ("passwd", PASSWD),
        ("group", GROUP),
        ("resolv.conf", "# paddock: this sandbox has no network access\n"),
    ];
    for (name, content) in files {
        insert(
            &mut etc,
            name,
            Node::file(content.as_bytes().to_vec(), 0o644, ROOT_ID, ROOT_ID),
        );
    }
    let mut home = Node::dir(0o755, ROOT_ID, ROOT_ID);
    insert(&mut home, "user", Node::dir(0o750, USER_ID, USER_ID));
    insert(&mut root, "etc", etc);
    insert(&mut root, "home", home);
    insert(&mut root, "root", Node::dir(0o700, ROOT_ID, ROOT_ID));
    insert(&mut root, "tmp", Node::dir(0o1777, ROOT_ID, ROOT_ID));
    root
}

/// An empty named volume: a directory writable by the sandbox's default user.
pub(crate) fn empty_volume() -> Node {
    Node::dir(0o755, USER_ID, USER_ID)
}

fn insert(dir: &mut Node, name: &str, node: Node) {
    if let Some(children) = dir.children_mut() {
        children.insert(name.to_owned(), node);
    }
}

/// Splits an absolute or relative path into its components (empty ones and `.` dropped; `..`
/// kept, for the resolver to interpret).
pub(crate) fn components(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
        .collect()
}

/// The absolute path of `components`.
pub(crate) fn display(components: &[String]) -> String {
    format!("/{}", components.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_has_the_native_layout() {
        let t = template();
        for dir in ["etc", "home", "home/user", "root", "tmp"] {
            assert!(t.get(&components(dir)).is_some_and(Node::is_dir), "{dir}");
        }
        let home = t.get(&components("home/user")).expect("home");
        assert_eq!((home.uid, home.mode), (USER_ID, 0o750));
        assert!(t.data_bytes() > 0);
        let mut seen = Vec::new();
        t.walk(&mut |path, _| seen.push(display(path)));
        assert_eq!(seen[0], "/etc");
        assert!(seen.iter().position(|p| p == "/home") < seen.iter().position(|p| p == "/home/user"));
    }

    #[test]
    fn components_and_display() {
        assert_eq!(components("/a//b/./c/"), ["a", "b", "c"]);
        assert_eq!(components("a/../b"), ["a", "..", "b"]);
        assert_eq!(display(&components("/a/b")), "/a/b");
        assert_eq!(display(&[]), "/");
    }
}
