//! The walk's handling of a tree changing under it, foreign file systems, and the pure helpers;
//! the diff through its public API is tried in `tests/diff.rs`.

use rustix::fs::Mode;

use super::compare::header_path;
use super::*;

fn walker<'a>(old: &Path, new: &Path, options: &'a DiffOptions) -> Walker<'a> {
    Walker {
        options,
        old: Tree::open(old).expect("old"),
        new: Tree::open(new).expect("new"),
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
    }
}

fn two_trees() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    std::fs::create_dir(&old).expect("old");
    std::fs::create_dir(&new).expect("new");
    (dir, old, new)
}

/// A name that was listed but is gone by the time it is looked at (deleted between the
/// directory read and the `statx`) is skipped, not an error.
#[test]
fn vanished_between_listing_and_stat() {
    let (_dir, old, new) = two_trees();
    std::fs::write(new.join("kept"), "x").expect("write");
    let options = DiffOptions::default();
    let mut w = walker(&old, &new, &options);
    let mut frame = w.root_frame().expect("frame");
    assert_eq!(frame.names, [c"kept".to_owned()]);
    frame.names = vec![c"gone".to_owned(), c"kept".to_owned()];
    w.walk(frame).expect("walk");
    let paths: Vec<_> = w.diff.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["/kept"]);
}

/// A file swapped for a fifo after its `statx` is not read (opening it does not block either),
/// and a directory swapped for a symlink is not entered.
#[test]
fn swapped_after_stat_is_not_used() {
    let (_dir, old, new) = two_trees();
    std::fs::write(new.join("f"), "x").expect("write");
    std::fs::create_dir(new.join("d")).expect("mkdir");
    let options = DiffOptions::default();
    let w = walker(&old, &new, &options);
    let root = w.new.fd.as_fd();
    let file_meta = w.new.stat(root, c"f", b"f").expect("stat").expect("exists");
    let dir_meta = w.new.stat(root, c"d", b"d").expect("stat").expect("exists");
    std::fs::remove_file(new.join("f")).expect("rm");
    rustix::fs::mknodat(root, c"f", FileType::Fifo, Mode::from_raw_mode(0o644), 0).expect("mkfifo");
    std::fs::remove_dir(new.join("d")).expect("rmdir");
    std::os::unix::fs::symlink(&old, new.join("d")).expect("symlink");
    assert!(w
        .new
        .open_file(root, c"f", b"f", &file_meta)
        .expect("open")
        .is_none());
    assert!(w
        .new
        .open_dir(root, c"d", b"d", &dir_meta)
        .expect("open")
        .is_none());
}

/// Directories on another file system or mount are listed, not entered (here: every directory
/// looks foreign because the root's device is pretended to differ).
#[test]
fn other_file_systems_are_not_entered() {
    let (_dir, old, new) = two_trees();
    std::fs::create_dir(new.join("mnt")).expect("mkdir");
    std::fs::write(new.join("mnt").join("inside"), "x").expect("write");
    let options = DiffOptions::default();
    let mut w = walker(&old, &new, &options);
    let frame = w.root_frame().expect("frame");
    w.new.fs.dev = w.new.fs.dev.wrapping_add(1);
    w.walk(frame).expect("walk");
    let paths: Vec<_> = w.diff.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["/mnt"]);
}

#[test]
fn header_paths_are_quoted_when_needed() {
    assert_eq!(header_path("a/", b"home/user/x y"), "a/home/user/x y");
    assert_eq!(header_path("a/", "h\u{e9}".as_bytes()), "a/h\u{e9}");
    assert_eq!(header_path("b/", b"x\n+++ b/etc"), "\"b/x\\n+++ b/etc\"");
    assert_eq!(header_path("a/", b"q\"\\\xff"), "\"a/q\\\"\\\\\\377\"");
}

#[test]
fn subtrees_are_checked_sorted_and_deduplicated() {
    let p = |v: &[&str]| parse_subtrees(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
    let names = |v: Vec<Vec<CString>>| {
        v.into_iter()
            .map(|c| {
                c.iter()
                    .map(|c| c.to_str().expect("utf-8"))
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(p(&["tmp", "/home/user/", "home"]).expect("ok")),
        ["home", "tmp"]
    );
    assert_eq!(
        names(p(&["home//user", "home/user/x"]).expect("ok")),
        ["home/user"]
    );
    assert!(p(&["home", "/"]).expect("ok").is_empty());
    assert!(p(&["home/../etc"]).is_err());
    assert!(p(&["./home"]).is_err());
    assert!(p(&["a\0b"]).is_err());
}
