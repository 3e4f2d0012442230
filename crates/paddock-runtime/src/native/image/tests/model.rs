//! Layers of files, directories, whiteouts and opaque markers applied to a real tree, compared after
//! every layer with a model of the OCI changeset rules as paddock applies them:
//! - a file replaces what was at its name (a whole directory tree included); a directory over a
//!   file replaces it, over a directory keeps its content; missing parents are made (by this layer);
//! - `.wh.NAME` removes what earlier layers made at NAME: nothing when this layer made NAME, only
//!   the earlier content inside it when this layer wrote into it, and nothing at all when NAME's
//!   directory does not exist;
//! - `.wh..wh..opq` in a directory removes everything in it that this layer did not make, keeping
//!   the directories this layer wrote into (whose earlier content goes the same way).
//!
//! Only layers the rules accept are generated (no member under a file, each name at most once per
//! layer); refusals have tests of their own in `layer.rs`.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::layer::{Craft, Tree};

/// The names a layer may use.
const PATHS: [&str; 7] = ["a", "b", "a/x", "a/y", "b/x", "a/x/z", "a/x/w"];

#[derive(Debug, Clone, Copy)]
enum Op {
    File(usize),
    Dir(usize),
    Whiteout(usize),
    Opaque(usize),
}

fn op() -> impl Strategy<Value = Op> {
    (0..4u8, 0..PATHS.len()).prop_map(|(k, p)| match k {
        0 => Op::File(p),
        1 => Op::Dir(p),
        2 => Op::Whiteout(p),
        _ => Op::Opaque(p),
    })
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Dir,
    File(String),
}

fn parent(p: &str) -> Option<&str> {
    p.rsplit_once('/').map(|(d, _)| d)
}

fn ancestors(p: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut cur = p;
    while let Some(d) = parent(cur) {
        out.push(d);
        cur = d;
    }
    out.reverse();
    out
}

fn under(p: &str, dir: &str) -> bool {
    p.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// The model's tree and the names the current layer made.
#[derive(Debug, Default)]
struct Model {
    tree: BTreeMap<String, Node>,
    made: BTreeSet<String>,
}

impl Model {
    /// Removes what lies under `dir` that this layer neither made nor wrote into.
    fn clear_earlier(&mut self, dir: &str) {
        let made = &self.made;
        let keep = |q: &str| made.contains(q) || made.iter().any(|m| under(m, q));
        let gone: Vec<String> = self
            .tree
            .keys()
            .filter(|q| under(q, dir) && !keep(q))
            .cloned()
            .collect();
        for q in gone {
            self.tree.remove(&q);
        }
    }

    fn remove_tree(&mut self, p: &str) {
        self.tree.retain(|q, _| q != p && !under(q, p));
    }

    /// Whether the rules accept `op` now (no member under a file; no name twice in a layer).
    fn accepts(&self, op: Op, named: &BTreeSet<usize>) -> bool {
        let p = match op {
            Op::File(p) | Op::Dir(p) | Op::Whiteout(p) | Op::Opaque(p) => PATHS[p],
        };
        let under_file = ancestors(p)
            .iter()
            .any(|a| matches!(self.tree.get(*a), Some(Node::File(_))));
        match op {
            Op::File(i) | Op::Dir(i) => !under_file && !named.contains(&i),
            // A marker is a member named `<dir>/.wh.<name>` or `<p>/.wh..wh..opq`: its directory
            // must not be a file either.
            Op::Whiteout(_) => !under_file,
            Op::Opaque(i) => !under_file && !matches!(self.tree.get(PATHS[i]), Some(Node::File(_))),
        }
    }

    fn apply(&mut self, op: Op, content: &str) {
        match op {
            Op::File(i) | Op::Dir(i) => {
                let p = PATHS[i];
                for a in ancestors(p) {
                    if !self.tree.contains_key(a) {
                        self.tree.insert(a.to_owned(), Node::Dir);
                        self.made.insert(a.to_owned());
                    }
                }
                let node = if matches!(op, Op::File(_)) {
                    Node::File(content.to_owned())
                } else {
                    Node::Dir
                };
                match (self.tree.get(p), &node) {
                    (Some(Node::Dir), Node::Dir) => {}
                    (Some(_), _) => {
                        self.remove_tree(p);
                        self.tree.insert(p.to_owned(), node);
                    }
                    (None, _) => {
                        self.tree.insert(p.to_owned(), node);
                    }
                }
                self.made.insert(p.to_owned());
            }
            Op::Whiteout(i) => {
                let p = PATHS[i];
                let dir_exists = parent(p).is_none_or(|d| matches!(self.tree.get(d), Some(Node::Dir)));
                if !dir_exists || self.made.contains(p) || !self.tree.contains_key(p) {
                    return;
                }
                if self.made.iter().any(|m| under(m, p)) {
                    self.clear_earlier(p);
                } else {
                    self.remove_tree(p);
                }
            }
            Op::Opaque(i) => {
                // Markers never make directories: in a missing one, nothing happens.
                let p = PATHS[i];
                if matches!(self.tree.get(p), Some(Node::Dir)) {
                    self.clear_earlier(p);
                }
            }
        }
    }

    fn listing(&self) -> BTreeMap<String, String> {
        self.tree
            .iter()
            .map(|(p, n)| {
                let v = match n {
                    Node::Dir => "dir".to_owned(),
                    Node::File(c) => format!("file:{c}"),
                };
                (p.clone(), v)
            })
            .collect()
    }
}

fn layers() -> impl Strategy<Value = Vec<Vec<Op>>> {
    prop::collection::vec(prop::collection::vec(op(), 1..7), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn layers_apply_as_the_changeset_rules_say(layers in layers()) {
        super::layer::require_root();
        let tree = Tree::new();
        let mut model = Model::default();
        for (l, ops) in layers.iter().enumerate() {
            model.made.clear();
            let mut named = BTreeSet::new();
            let mut craft = Craft::new();
            for (n, op) in ops.iter().enumerate() {
                if !model.accepts(*op, &named) {
                    continue;
                }
                let content = format!("{l}.{n}");
                craft = match *op {
                    Op::File(i) => {
                        named.insert(i);
                        craft.file(PATHS[i], content.as_bytes())
                    }
                    Op::Dir(i) => {
                        named.insert(i);
                        craft.dir(PATHS[i])
                    }
                    Op::Whiteout(i) => {
                        let p = PATHS[i];
                        let marker = match parent(p) {
                            Some(d) => format!("{d}/.wh.{}", &p[d.len() + 1..]),
                            None => format!(".wh.{p}"),
                        };
                        craft.file(&marker, b"")
                    }
                    Op::Opaque(i) => craft.file(&format!("{}/.wh..wh..opq", PATHS[i]), b""),
                };
                model.apply(*op, &content);
            }
            let layer = craft.done();
            tree.apply(&layer).unwrap_or_else(|e| panic!("layer {l} ({ops:?}) refused: {e:?}"));
            prop_assert_eq!(tree.listing(), model.listing(), "after layer {} ({:?})", l, ops);
        }
    }
}
