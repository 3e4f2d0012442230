//! Layers applied to a tree in a temporary directory: the root is `<tmp>/root`, and `<tmp>/outside`
//! is checked untouched after every refusal. Needs root (files are chowned to sandbox ids).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::super::{apply_layer, Digest, ImageError, LayerLimits, LayerSummary, VerifiedReader};
use crate::native::IdRange;

const IDS: IdRange = IdRange {
    base: 1_000_000_000,
    count: 65_536,
};

pub(super) fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "image layer tests need root (files are owned by sandbox ids); CI runs as root"
    );
}

/// A tar layer built member by member (GNU headers, raw names: nothing normalised).
pub(super) struct Craft(tar::Builder<Vec<u8>>);

impl Craft {
    pub(super) fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    fn raw(mut self, kind: tar::EntryType, name: &[u8], link: Option<&[u8]>, data: &[u8], uid: u64) -> Self {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        h.set_uid(uid);
        h.set_gid(uid);
        let gnu = h.as_gnu_mut().expect("gnu");
        gnu.name[..name.len()].copy_from_slice(name);
        if let Some(link) = link {
            gnu.linkname[..link.len()].copy_from_slice(link);
        }
        h.set_cksum();
        self.0.append(&h, data).expect("append");
        self
    }

    pub(super) fn file(self, name: &str, data: &[u8]) -> Self {
        self.raw(tar::EntryType::Regular, name.as_bytes(), None, data, 1000)
    }

    pub(super) fn dir(self, name: &str) -> Self {
        self.raw(tar::EntryType::Directory, name.as_bytes(), None, b"", 0)
    }

    fn symlink(self, name: &str, target: &str) -> Self {
        self.raw(
            tar::EntryType::Symlink,
            name.as_bytes(),
            Some(target.as_bytes()),
            b"",
            0,
        )
    }

    fn link(self, name: &str, target: &str) -> Self {
        self.raw(
            tar::EntryType::Link,
            name.as_bytes(),
            Some(target.as_bytes()),
            b"",
            0,
        )
    }

    pub(super) fn done(self) -> Vec<u8> {
        self.0.into_inner().expect("finish")
    }
}

pub(super) struct Tree {
    _tmp: tempfile::TempDir,
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
}

impl Tree {
    pub(super) fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        fs::create_dir(&root).expect("root");
        fs::create_dir(&outside).expect("outside");
        fs::write(outside.join("secret"), b"keep").expect("secret");
        Self {
            _tmp: tmp,
            root,
            outside,
        }
    }

    fn apply_with(&self, layer: &[u8], limits: LayerLimits) -> Result<LayerSummary, ImageError> {
        let dir = fs::File::open(&self.root).expect("open root");
        apply_layer(std::os::fd::AsFd::as_fd(&dir), layer, &IDS, limits)
    }

    pub(super) fn apply(&self, layer: &[u8]) -> Result<LayerSummary, ImageError> {
        self.apply_with(layer, LayerLimits::default())
    }

    /// Every name under the tree's root: `path -> kind[:content or target]`.
    pub(super) fn listing(&self) -> BTreeMap<String, String> {
        list(&self.root)
    }

    fn assert_outside_untouched(&self) {
        let parent = self.root.parent().expect("parent");
        let names: Vec<_> = fs::read_dir(parent)
            .expect("list")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        let mut names = names;
        names.sort();
        assert_eq!(names, ["outside", "root"]);
        assert_eq!(
            list(&self.outside),
            BTreeMap::from([("secret".to_string(), "file:keep".to_string())])
        );
    }
}

fn list(dir: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in fs::read_dir(dir).expect("list") {
            let e = e.expect("entry");
            let path = e.path();
            let rel = path
                .strip_prefix(base)
                .expect("under")
                .to_string_lossy()
                .into_owned();
            let t = e.file_type().expect("type");
            if t.is_symlink() {
                let target = fs::read_link(&path).expect("readlink");
                out.insert(rel, format!("symlink:{}", target.display()));
            } else if t.is_dir() {
                out.insert(rel, "dir".into());
                walk(base, &path, out);
            } else if t.is_file() {
                let data = fs::read(&path).expect("read");
                out.insert(rel, format!("file:{}", String::from_utf8_lossy(&data)));
            } else {
                out.insert(rel, "other".into());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn expect_invalid(tree: &Tree, layer: &[u8], what: &str) -> String {
    let e = tree.apply(layer).expect_err(what);
    assert!(matches!(e, ImageError::InvalidLayer { .. }), "{what}: {e:?}");
    tree.assert_outside_untouched();
    e.to_string()
}

fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn two_layers_apply_on_top_of_each_other() {
    require_root();
    let tree = Tree::new();
    let first = Craft::new()
        .dir("./")
        .dir("etc/")
        .file("etc/a", b"one")
        .symlink("etc/l", "a")
        .link("etc/h", "etc/a")
        .dir("d/")
        .file("d/x", b"x")
        .file("f", b"f")
        .file("deep/er/file", b"implied parents")
        .done();
    let summary = tree.apply(&first).expect("first layer");
    assert_eq!(summary.entries, 9);
    assert_eq!(summary.data_bytes, 3 + 1 + 1 + 15);
    let second = Craft::new()
        .file("etc/a", b"two")
        .dir("f/")
        .file("f/y", b"y")
        .file("d", b"now a file")
        .symlink("etc/h", "/etc/a")
        .link("etc/h2", "etc/a")
        .done();
    tree.apply(&second).expect("second layer");
    assert_eq!(
        tree.listing(),
        map(&[
            ("d", "file:now a file"),
            ("deep", "dir"),
            ("deep/er", "dir"),
            ("deep/er/file", "file:implied parents"),
            ("etc", "dir"),
            ("etc/a", "file:two"),
            ("etc/h", "symlink:/etc/a"),
            ("etc/h2", "file:two"),
            ("etc/l", "symlink:a"),
            ("f", "dir"),
            ("f/y", "file:y"),
        ])
    );
    let a = fs::metadata(tree.root.join("etc/a")).expect("a");
    assert_eq!(a.ino(), fs::metadata(tree.root.join("etc/h2")).expect("h2").ino());
    assert_eq!((a.uid(), a.gid()), (IDS.base + 1000, IDS.base + 1000));
    let implied = fs::symlink_metadata(tree.root.join("deep")).expect("deep");
    assert_eq!(implied.uid(), IDS.base);
    assert_eq!(implied.permissions().mode() & 0o7777, 0o755);
    tree.assert_outside_untouched();
}

#[test]
fn whiteouts_remove_what_earlier_layers_made() {
    require_root();
    let tree = Tree::new();
    let first = Craft::new()
        .file("gone", b"1")
        .file("kept", b"1")
        .dir("tree/")
        .file("tree/sub/deep", b"1")
        .symlink("tree/link", "/etc")
        .file("dir/old", b"1")
        .file("kept2/old", b"1")
        .done();
    tree.apply(&first).expect("first");
    let second = Craft::new()
        .file("fresh", b"2")
        .file(".wh.fresh", b"")
        .file("kept2/new", b"2")
        .file(".wh.kept2", b"")
        .file(".wh.gone", b"")
        .file(".wh.tree", b"")
        .file("dir/.wh.old", b"")
        .file("dir/.wh.never-was", b"")
        .file("missing/.wh.x", b"")
        .done();
    let summary = tree.apply(&second).expect("second");
    assert_eq!(summary.whiteouts, 7);
    assert_eq!(
        tree.listing(),
        map(&[
            ("dir", "dir"),
            ("fresh", "file:2"),
            ("kept", "file:1"),
            ("kept2", "dir"),
            ("kept2/new", "file:2"),
        ])
    );
    tree.assert_outside_untouched();
}

#[test]
fn an_opaque_directory_hides_earlier_layers_only() {
    require_root();
    let tree = Tree::new();
    let first = Craft::new()
        .file("o/old", b"1")
        .file("o/sub/deep", b"1")
        .file("o/sub/also", b"1")
        .file("other/x", b"1")
        .done();
    tree.apply(&first).expect("first");
    let second = Craft::new()
        .file("o/before", b"2")
        .file("o/sub/new", b"2")
        .file("o/.wh..wh..opq", b"")
        .file("o/after", b"2")
        .done();
    tree.apply(&second).expect("second");
    assert_eq!(
        tree.listing(),
        map(&[
            ("o", "dir"),
            ("o/after", "file:2"),
            ("o/before", "file:2"),
            ("o/sub", "dir"),
            ("o/sub/new", "file:2"),
            ("other", "dir"),
            ("other/x", "file:1"),
        ])
    );
}

#[test]
fn devices_and_fifos_are_skipped_and_foreign_ids_overflow() {
    require_root();
    let tree = Tree::new();
    let layer = Craft::new()
        .raw(tar::EntryType::Char, b"dev/null", None, b"", 0)
        .raw(tar::EntryType::Block, b"dev/sda", None, b"", 0)
        .raw(tar::EntryType::Fifo, b"run/pipe", None, b"", 0)
        .raw(tar::EntryType::Regular, b"stranger", None, b"s", 100_000)
        .done();
    let summary = tree.apply(&layer).expect("layer");
    assert_eq!((summary.devices_skipped, summary.fifos_skipped), (2, 1));
    assert_eq!(summary.ids_overflowed, 1);
    assert_eq!(tree.listing(), map(&[("stranger", "file:s")]));
    let st = fs::metadata(tree.root.join("stranger")).expect("stranger");
    assert_eq!((st.uid(), st.gid()), (IDS.base + 65534, IDS.base + 65534));
}

/// Builds a layer for a tree (some name the tree's `outside` by its absolute path).
type MakeLayer = Box<dyn Fn(&Tree) -> Vec<u8>>;

#[test]
fn hostile_layers_are_refused_and_touch_nothing_outside() {
    require_root();
    let outside_abs = |tree: &Tree| tree.outside.to_string_lossy().into_owned();
    let cases: Vec<(&str, MakeLayer)> = vec![
        (
            "dot-dot",
            Box::new(|_| Craft::new().file("../escape", b"x").done()),
        ),
        ("absolute", Box::new(|_| Craft::new().file("/abs", b"x").done())),
        (
            "through a symlink",
            Box::new(move |t| {
                Craft::new()
                    .symlink("evil", &outside_abs(t))
                    .file("evil/passwd", b"x")
                    .done()
            }),
        ),
        (
            "through a relative symlink",
            Box::new(|_| {
                Craft::new()
                    .symlink("evil", "../outside")
                    .file("evil/secret", b"x")
                    .done()
            }),
        ),
        (
            "a directory over a symlink's target",
            Box::new(|_| Craft::new().symlink("evil", "../outside").dir("evil/sub/").done()),
        ),
        (
            "a hard link through a symlink",
            Box::new(move |t| {
                Craft::new()
                    .symlink("out", &outside_abs(t))
                    .link("stolen", "out/secret")
                    .done()
            }),
        ),
        (
            "a hard link to /etc/passwd",
            Box::new(|_| Craft::new().link("pw", "/etc/passwd").done()),
        ),
        (
            "a hard link outside",
            Box::new(|_| Craft::new().link("s", "../outside/secret").done()),
        ),
        (
            "a hard link to a directory",
            Box::new(|_| Craft::new().dir("d/").link("l", "d").done()),
        ),
        (
            "a hard link to nothing",
            Box::new(|_| Craft::new().link("l", "nope").done()),
        ),
        (
            "a whiteout escaping",
            Box::new(|_| Craft::new().file("../.wh.outside", b"").done()),
        ),
        (
            "a whiteout of ..",
            Box::new(|_| Craft::new().file("x/.wh...", b"").done()),
        ),
        (
            "a whiteout through a symlink",
            Box::new(|_| {
                Craft::new()
                    .symlink("evil", "../outside")
                    .file("evil/.wh.secret", b"")
                    .done()
            }),
        ),
        (
            "an opaque marker through a symlink",
            Box::new(|_| {
                Craft::new()
                    .symlink("evil", "../outside")
                    .file("evil/.wh..wh..opq", b"")
                    .done()
            }),
        ),
        (
            "a sparse file",
            Box::new(|_| {
                Craft::new()
                    .raw(tar::EntryType::GNUSparse, b"s", None, b"", 0)
                    .done()
            }),
        ),
    ];
    for (what, layer) in cases {
        let tree = Tree::new();
        let layer = layer(&tree);
        let message = expect_invalid(&tree, &layer, what);
        eprintln!("{what}: {message}");
    }
}

#[test]
fn truncation_and_limits_are_refused() {
    require_root();
    let layer = Craft::new().file("a", &[7u8; 4096]).file("b", b"b").done();
    // Cut inside a member's data, and cut before the end-of-archive marker.
    for cut in [layer.len() - 2048 - 600, layer.len() - 1024] {
        let tree = Tree::new();
        let message = expect_invalid(&tree, &layer[..cut], "truncated");
        assert!(message.contains("truncated"), "{message}");
    }
    let tree = Tree::new();
    let e = tree
        .apply_with(
            &layer,
            LayerLimits {
                max_bytes: 2048,
                max_entries: 10,
            },
        )
        .expect_err("too large");
    assert!(matches!(e, ImageError::LayerTooLarge { .. }), "{e:?}");
    tree.assert_outside_untouched();
    let tree = Tree::new();
    let e = tree
        .apply_with(
            &layer,
            LayerLimits {
                max_bytes: 1 << 20,
                max_entries: 1,
            },
        )
        .expect_err("too many");
    assert!(matches!(e, ImageError::LayerTooLarge { .. }), "{e:?}");
    assert!(tree
        .apply_with(
            &layer,
            LayerLimits {
                max_bytes: layer.len() as u64,
                max_entries: 2
            }
        )
        .is_ok());
}

#[test]
fn a_layer_read_through_a_wrong_digest_is_refused() {
    require_root();
    let tree = Tree::new();
    let layer = Craft::new().file("a", b"a").done();
    let reader = VerifiedReader::new(&layer[..], Digest::of(b"something else"), layer.len() as u64);
    let dir = fs::File::open(&tree.root).expect("root");
    let e = apply_layer(
        std::os::fd::AsFd::as_fd(&dir),
        reader,
        &IDS,
        LayerLimits::default(),
    )
    .expect_err("wrong digest");
    assert!(matches!(e, ImageError::InvalidImage { .. }), "{e:?}");
    let reader = VerifiedReader::new(&layer[..], Digest::of(&layer), layer.len() as u64);
    apply_layer(
        std::os::fd::AsFd::as_fd(&dir),
        reader,
        &IDS,
        LayerLimits::default(),
    )
    .expect("right digest");
}
