//! What changed between two in-memory trees (a snapshot and a live sandbox), with the native diff's
//! output and bounds (`native/diff.rs`): depth-first, siblings in byte order, a directory before its
//! children, a deleted or added directory listed with all its descendants, a type change followed by
//! the old side's descendants as deleted or the new side's as added; "modified" means mode, owner,
//! symlink target or content differ (a directory only by its mode or owner; mtimes never count).
//! `max_entries`, `max_scanned`, `max_depth`, `paths`, the comparison budgets and the text-diff
//! bounds are honoured.
//!
//! Unlike the native diff, contents are always compared byte for byte within the budgets (there are
//! no inode numbers or change times to trust), and text diffs have no time limit (the trees are
//! small and made by tests).

use paddock_types::diff::{Change, DiffEntry, DiffOptions, EntryKind, TreeDiff};
use similar::TextDiff;

use super::tree::{Node, NodeKind};

/// Why the subtrees asked for cannot be compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InvalidSubtree(pub(crate) String);

struct Walker<'a> {
    options: &'a DiffOptions,
    diff: TreeDiff,
    scanned: u64,
    compare_left: u64,
    text_left: u64,
    stopped: bool,
}

/// Compares `old` with `new`.
pub(crate) fn diff_trees(old: &Node, new: &Node, options: &DiffOptions) -> Result<TreeDiff, InvalidSubtree> {
    let mut walker = Walker {
        options,
        diff: TreeDiff {
            entries: Vec::new(),
            truncated: false,
            added: 0,
            modified: 0,
            deleted: 0,
            bytes_added: 0,
            bytes_deleted: 0,
        },
        scanned: 0,
        compare_left: options.max_total_compare_bytes,
        text_left: options.max_total_text_bytes,
        stopped: false,
    };
    let subtrees = subtrees(&options.paths)?;
    if subtrees.is_empty() {
        walker.children(&[], Some(old), Some(new), 0);
    } else {
        for path in subtrees {
            if walker.stopped {
                break;
            }
            let Some((name, parents)) = path.split_last() else {
                continue;
            };
            let side = |tree: &'_ Node| -> Option<Node> {
                let parent = tree.get(parents).filter(|p| p.is_dir())?;
                parent.children()?.get(name).cloned()
            };
            let (o, n) = (side(old), side(new));
            walker.entry(&path, o.as_ref(), n.as_ref(), parents.len() + 1);
        }
    }
    Ok(walker.diff)
}

/// The subtrees to limit the diff to: sorted, without those inside another (empty: everything).
fn subtrees(paths: &[String]) -> Result<Vec<Vec<String>>, InvalidSubtree> {
    let mut parsed = Vec::new();
    for path in paths {
        let mut components = Vec::new();
        for c in path.split('/').filter(|c| !c.is_empty()) {
            if c == "." || c == ".." || c.contains('\0') {
                return Err(InvalidSubtree(format!(
                    "invalid subtree path {path:?}: `.`, `..` and NUL bytes are not allowed"
                )));
            }
            components.push(c.to_owned());
        }
        if components.is_empty() {
            return Ok(Vec::new());
        }
        parsed.push(components);
    }
    parsed.sort();
    let mut kept: Vec<Vec<String>> = Vec::new();
    for p in parsed {
        if !kept.last().is_some_and(|k| p.starts_with(k)) {
            kept.push(p);
        }
    }
    Ok(kept)
}

fn kind(node: &Node) -> EntryKind {
    match node.kind {
        NodeKind::File(_) => EntryKind::File,
        NodeKind::Dir(_) => EntryKind::Dir,
        NodeKind::Symlink(_) => EntryKind::Symlink,
    }
}

fn reported_size(node: &Node) -> Option<u64> {
    (!node.is_dir()).then(|| node.size())
}

fn file_bytes(node: Option<&Node>) -> u64 {
    match node.map(|n| &n.kind) {
        Some(NodeKind::File(data)) => data.len() as u64,
        _ => 0,
    }
}

fn text(node: &Node) -> Option<&str> {
    match &node.kind {
        NodeKind::File(data) if !data.contains(&0) => std::str::from_utf8(data).ok(),
        _ => None,
    }
}

impl Walker<'_> {
    /// Walks the children of a directory at `path` (either side may be absent or not a directory).
    fn children(&mut self, path: &[String], old: Option<&Node>, new: Option<&Node>, depth: usize) {
        let mut names: Vec<&String> = Vec::new();
        for side in [old, new].into_iter().flatten() {
            if let Some(children) = side.children() {
                for name in children.keys() {
                    if self.scanned >= self.options.max_scanned {
                        self.stop();
                        return;
                    }
                    self.scanned += 1;
                    names.push(name);
                }
            }
        }
        names.sort_unstable();
        names.dedup();
        for name in names {
            if self.stopped {
                return;
            }
            let mut child = path.to_vec();
            child.push(name.clone());
            let o = old.and_then(Node::children).and_then(|c| c.get(name));
            let n = new.and_then(Node::children).and_then(|c| c.get(name));
            self.entry(&child, o, n, depth + 1);
        }
    }

    /// Compares one path, then walks into it where it is a directory.
    fn entry(&mut self, path: &[String], old: Option<&Node>, new: Option<&Node>, depth: usize) {
        if depth > self.options.max_depth {
            self.diff.truncated = true;
            return;
        }
        if let Some(found) = self.compare(path, old, new) {
            if !self.push(found) {
                return;
            }
        }
        let dirs = (old.filter(|n| n.is_dir()), new.filter(|n| n.is_dir()));
        if dirs == (None, None) {
            return;
        }
        if depth >= self.options.max_depth {
            self.diff.truncated = true;
            return;
        }
        self.children(path, dirs.0, dirs.1, depth);
    }

    fn stop(&mut self) {
        self.stopped = true;
        self.diff.truncated = true;
    }

    fn push(&mut self, found: (DiffEntry, u64, u64)) -> bool {
        if self.diff.entries.len() >= self.options.max_entries {
            self.stop();
            return false;
        }
        let (entry, added, deleted) = found;
        match entry.change {
            Change::Added => self.diff.added += 1,
            Change::Deleted => self.diff.deleted += 1,
            Change::Modified | Change::TypeChanged => self.diff.modified += 1,
        }
        self.diff.bytes_added += added;
        self.diff.bytes_deleted += deleted;
        self.diff.entries.push(entry);
        true
    }

    fn compare(
        &mut self,
        path: &[String],
        old: Option<&Node>,
        new: Option<&Node>,
    ) -> Option<(DiffEntry, u64, u64)> {
        let (change, mode_changed, owner_changed, unified) = match (old, new) {
            (None, None) => return None,
            (None, Some(n)) => {
                let text = self.side_text(n).map(str::to_owned);
                (
                    Change::Added,
                    false,
                    false,
                    text.and_then(|t| self.unified(path, None, Some(&t))),
                )
            }
            (Some(o), None) => {
                let text = self.side_text(o).map(str::to_owned);
                (
                    Change::Deleted,
                    false,
                    false,
                    text.and_then(|t| self.unified(path, Some(&t), None)),
                )
            }
            (Some(o), Some(n)) => {
                let mode_changed = o.mode != n.mode;
                let owner_changed = o.uid != n.uid || o.gid != n.gid;
                if kind(o) != kind(n) {
                    let (ot, nt) = (
                        self.side_text(o).map(str::to_owned),
                        self.side_text(n).map(str::to_owned),
                    );
                    let unified = match (ot, nt) {
                        (Some(t), None) => self.unified(path, Some(&t), None),
                        (None, Some(t)) => self.unified(path, None, Some(&t)),
                        _ => None,
                    };
                    (Change::TypeChanged, mode_changed, owner_changed, unified)
                } else {
                    let (differs, unified) = match (&o.kind, &n.kind) {
                        (NodeKind::File(a), NodeKind::File(b)) => self.compare_files(path, a, b),
                        (NodeKind::Symlink(a), NodeKind::Symlink(b)) => (a != b, None),
                        _ => (false, None),
                    };
                    if !(differs || mode_changed || owner_changed) {
                        return None;
                    }
                    (Change::Modified, mode_changed, owner_changed, unified)
                }
            }
        };
        let (added, deleted) = match change {
            Change::Modified => (0, 0),
            _ => (file_bytes(new), file_bytes(old)),
        };
        let entry = DiffEntry {
            path: format!("/{}", path.join("/")),
            change,
            kind: new.or(old).map_or(EntryKind::Other, kind),
            old_size: old.and_then(reported_size),
            new_size: new.and_then(reported_size),
            mode_changed,
            owner_changed,
            unified,
        };
        Some((entry, added, deleted))
    }

    fn wants_text(&self, size: u64) -> bool {
        self.options.text_diff && self.text_left > 0 && size <= self.options.max_text_bytes
    }

    /// A whole side's text for the diff of an added, deleted or retyped file.
    fn side_text<'n>(&mut self, node: &'n Node) -> Option<&'n str> {
        let size = node.size();
        if !matches!(node.kind, NodeKind::File(_))
            || !self.wants_text(size)
            || size > self.compare_left
            || size == 0
        {
            return None;
        }
        self.compare_left -= size;
        text(node)
    }

    fn compare_files(&mut self, path: &[String], a: &[u8], b: &[u8]) -> (bool, Option<String>) {
        let (sa, sb) = (a.len() as u64, b.len() as u64);
        if self.wants_text(sa) && self.wants_text(sb) && sa.saturating_add(sb) <= self.compare_left {
            self.compare_left -= sa + sb;
            if a == b {
                return (false, None);
            }
            let unified = match (std::str::from_utf8(a), std::str::from_utf8(b)) {
                (Ok(ta), Ok(tb)) if !a.contains(&0) && !b.contains(&0) => {
                    self.unified(path, Some(ta), Some(tb))
                }
                _ => None,
            };
            return (true, unified);
        }
        if sa != sb {
            return (true, None);
        }
        if sa > self.options.max_compare_bytes || sa.saturating_mul(2) > self.compare_left {
            return (true, None);
        }
        self.compare_left -= sa * 2;
        (a != b, None)
    }

    fn unified(&mut self, path: &[String], old: Option<&str>, new: Option<&str>) -> Option<String> {
        let (a, b) = (old.unwrap_or(""), new.unwrap_or(""));
        if a == b || self.text_left == 0 {
            return None;
        }
        let rel = path.join("/");
        let a_name = old.map_or_else(|| "/dev/null".to_owned(), |_| format!("a/{rel}"));
        let b_name = new.map_or_else(|| "/dev/null".to_owned(), |_| format!("b/{rel}"));
        let unified = TextDiff::from_lines(a, b)
            .unified_diff()
            .context_radius(3)
            .header(&a_name, &b_name)
            .to_string();
        if unified.len() as u64 > self.text_left {
            self.text_left = 0;
            return None;
        }
        self.text_left -= unified.len() as u64;
        Some(unified)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::tree::{components, template};

    fn put(tree: &mut Node, path: &str, node: Node) {
        let mut parts = components(path);
        let name = parts.pop().expect("name");
        tree.get_mut(&parts)
            .and_then(Node::children_mut)
            .expect("parent")
            .insert(name, node);
    }

    #[test]
    fn added_modified_deleted_in_order_with_text() {
        let mut old = template();
        put(
            &mut old,
            "home/user/f",
            Node::file(b"kept\n".to_vec(), 0o644, 1000, 1000),
        );
        put(
            &mut old,
            "home/user/same",
            Node::file(b"x".to_vec(), 0o644, 1000, 1000),
        );
        put(&mut old, "home/user/gone", Node::dir(0o755, 1000, 1000));
        put(
            &mut old,
            "home/user/gone/inner",
            Node::file(b"bye".to_vec(), 0o644, 1000, 1000),
        );
        let mut new = old.clone();
        put(
            &mut new,
            "home/user/f",
            Node::file(b"changed\n".to_vec(), 0o644, 1000, 1000),
        );
        put(
            &mut new,
            "home/user/added",
            Node::file(b"fresh\n".to_vec(), 0o644, 1000, 1000),
        );
        new.get_mut(&components("home/user"))
            .and_then(Node::children_mut)
            .expect("home")
            .remove("gone");
        let options = DiffOptions {
            text_diff: true,
            ..DiffOptions::default()
        };
        let diff = diff_trees(&old, &new, &options).expect("diff");
        let listed: Vec<(&str, Change)> = diff.entries.iter().map(|e| (e.path.as_str(), e.change)).collect();
        assert_eq!(
            listed,
            [
                ("/home/user/added", Change::Added),
                ("/home/user/f", Change::Modified),
                ("/home/user/gone", Change::Deleted),
                ("/home/user/gone/inner", Change::Deleted),
            ]
        );
        let unified = diff.entries[1].unified.as_deref().expect("text diff");
        assert!(
            unified.contains("-kept") && unified.contains("+changed"),
            "{unified}"
        );
        assert_eq!((diff.added, diff.modified, diff.deleted), (1, 1, 2));
        assert_eq!((diff.bytes_added, diff.bytes_deleted), (6, 3));
    }

    #[test]
    fn bounds_truncate() {
        let old = template();
        let mut new = old.clone();
        for i in 0..10 {
            put(&mut new, &format!("tmp/f{i}"), Node::file(vec![], 0o644, 0, 0));
        }
        let few = DiffOptions {
            max_entries: 3,
            ..DiffOptions::default()
        };
        let diff = diff_trees(&old, &new, &few).expect("diff");
        assert_eq!((diff.entries.len(), diff.truncated), (3, true));
        let shallow = DiffOptions {
            max_depth: 1,
            ..DiffOptions::default()
        };
        let diff = diff_trees(&old, &new, &shallow).expect("diff");
        assert!(diff.truncated && diff.entries.is_empty());
        let only = DiffOptions {
            paths: vec!["/tmp/f3".into()],
            ..DiffOptions::default()
        };
        let diff = diff_trees(&old, &new, &only).expect("diff");
        assert_eq!(diff.entries.len(), 1);
        assert!(diff_trees(
            &old,
            &new,
            &DiffOptions {
                paths: vec!["../x".into()],
                ..DiffOptions::default()
            }
        )
        .is_err());
    }
}
