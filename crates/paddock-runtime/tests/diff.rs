//! `native::diff`: comparing a snapshot's tree with a live tree, through the public API.
//!
//! Most tests need no privileges. Those that need root (ownership changes, mounts inside a tree, a
//! real btrfs snapshot) say loudly when they skip.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use paddock_runtime::native::diff::{diff_trees, DiffError};
use paddock_types::diff::{Change, DiffEntry, DiffOptions, EntryKind, TreeDiff};
use proptest::prelude::*;

struct Trees {
    dir: tempfile::TempDir,
    old: PathBuf,
    new: PathBuf,
}

fn trees() -> Trees {
    let dir = tempfile::tempdir().expect("tempdir");
    let (old, new) = (dir.path().join("old"), dir.path().join("new"));
    fs::create_dir(&old).expect("mkdir old");
    fs::create_dir(&new).expect("mkdir new");
    Trees { dir, old, new }
}

fn write(root: &Path, rel: &str, content: impl AsRef<[u8]>) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir -p");
    fs::write(&path, content).expect("write");
}

fn both(t: &Trees, rel: &str, content: &str) {
    write(&t.old, rel, content);
    write(&t.new, rel, content);
}

fn text_options() -> DiffOptions {
    DiffOptions {
        text_diff: true,
        ..DiffOptions::default()
    }
}

fn diff(t: &Trees, options: &DiffOptions) -> TreeDiff {
    diff_trees(&t.old, &t.new, options).expect("diff")
}

fn summary(d: &TreeDiff) -> Vec<(String, Change, EntryKind)> {
    d.entries
        .iter()
        .map(|e| (e.path.clone(), e.change, e.kind))
        .collect()
}

fn entry<'a>(d: &'a TreeDiff, path: &str) -> &'a DiffEntry {
    d.entries
        .iter()
        .find(|e| e.path == path)
        .unwrap_or_else(|| panic!("no entry {path} in {:#?}", d.entries))
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn added_modified_and_deleted_files() {
    let t = trees();
    both(&t, "home/user/same.txt", "unchanged\n");
    write(
        &t.old,
        "home/user/notes.txt",
        "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\n",
    );
    write(
        &t.new,
        "home/user/notes.txt",
        "one\ntwo\nthree\nfour\nFIVE\nsix\nseven\neight\n",
    );
    write(&t.new, "home/user/new.txt", "hello\n");
    write(&t.old, "tmp/gone.txt", "bye\n");
    fs::create_dir_all(t.new.join("tmp")).expect("mkdir");

    let d = diff(&t, &text_options());
    assert_eq!(
        summary(&d),
        [
            ("/home/user/new.txt".into(), Change::Added, EntryKind::File),
            ("/home/user/notes.txt".into(), Change::Modified, EntryKind::File),
            ("/tmp/gone.txt".into(), Change::Deleted, EntryKind::File),
        ]
    );
    assert_eq!((d.added, d.modified, d.deleted), (1, 1, 1));
    assert_eq!((d.bytes_added, d.bytes_deleted), (6, 4));
    assert!(!d.truncated);

    let notes = entry(&d, "/home/user/notes.txt");
    assert_eq!((notes.old_size, notes.new_size), (Some(40), Some(40)));
    assert!(!notes.mode_changed && !notes.owner_changed);
    assert_eq!(
        notes.unified.as_deref(),
        Some(
            "--- a/home/user/notes.txt\n+++ b/home/user/notes.txt\n@@ -2,7 +2,7 @@\n two\n three\n four\n-five\n+FIVE\n six\n seven\n eight\n"
        )
    );
    assert_eq!(
        entry(&d, "/home/user/new.txt").unified.as_deref(),
        Some("--- /dev/null\n+++ b/home/user/new.txt\n@@ -0,0 +1 @@\n+hello\n")
    );
    assert_eq!(
        entry(&d, "/tmp/gone.txt").unified.as_deref(),
        Some("--- a/tmp/gone.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n")
    );

    // Without text_diff: the same entries, no diffs.
    let plain = diff(&t, &DiffOptions::default());
    assert_eq!(summary(&plain), summary(&d));
    assert!(plain.entries.iter().all(|e| e.unified.is_none()));
}

#[test]
fn identical_trees_with_different_inodes_have_no_entries() {
    let t = trees();
    for i in 0..20 {
        both(&t, &format!("home/user/d{}/f{i}", i % 3), &"x".repeat(i * 1000));
    }
    symlink("f1", t.old.join("home/link")).expect("symlink");
    symlink("f1", t.new.join("home/link")).expect("symlink");
    let d = diff(&t, &text_options());
    assert_eq!(d.entries, []);
    assert_eq!((d.added, d.modified, d.deleted, d.truncated), (0, 0, 0, false));
}

#[test]
fn mode_change_without_content_change() {
    let t = trees();
    both(&t, "home/user/run.sh", "#!/bin/sh\n");
    both(&t, "home/user/dir/x", "x");
    fs::set_permissions(t.new.join("home/user/run.sh"), fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::set_permissions(t.new.join("home/user/dir"), fs::Permissions::from_mode(0o700)).expect("chmod");
    let d = diff(&t, &text_options());
    assert_eq!(
        summary(&d),
        [
            ("/home/user/dir".into(), Change::Modified, EntryKind::Dir),
            ("/home/user/run.sh".into(), Change::Modified, EntryKind::File),
        ]
    );
    let e = entry(&d, "/home/user/run.sh");
    assert!(e.mode_changed && !e.owner_changed);
    assert_eq!(e.unified, None, "the content did not change");
    let dir = entry(&d, "/home/user/dir");
    assert_eq!((dir.old_size, dir.new_size), (None, None));
}

#[test]
fn owner_change_needs_root() {
    if !is_root() {
        eprintln!("SKIPPED owner_change_needs_root: chown needs root");
        return;
    }
    let t = trees();
    both(&t, "home/user/f", "x");
    std::os::unix::fs::chown(t.new.join("home/user/f"), Some(1000), Some(1000)).expect("chown");
    let d = diff(&t, &DiffOptions::default());
    assert_eq!(
        summary(&d),
        [("/home/user/f".into(), Change::Modified, EntryKind::File)]
    );
    assert!(entry(&d, "/home/user/f").owner_changed);
}

/// Symlinks written by the sandbox are compared by target and never followed: not for content,
/// not into directories.
#[test]
fn symlinks_are_never_followed() {
    const MARKER: &str = "SECRET-MARKER-7f3a";
    let t = trees();
    let outside = t.dir.path().join("outside");
    fs::create_dir(&outside).expect("mkdir");
    fs::write(outside.join("secret"), format!("{MARKER}\n")).expect("write");
    let secret = outside.join("secret");

    both(&t, "home/user/target.txt", "fine\n");
    symlink("target.txt", t.old.join("home/user/link")).expect("symlink");
    symlink(&secret, t.new.join("home/user/link")).expect("symlink"); // retargeted
    symlink(&secret, t.new.join("home/user/added-link")).expect("symlink");
    symlink("/etc/shadow", t.new.join("home/user/shadow")).expect("symlink");
    // A directory replaced by a symlink to a directory outside the tree.
    both(&t, "root/cfg/a", "a\n");
    fs::remove_dir_all(t.new.join("root/cfg")).expect("rm");
    symlink(&outside, t.new.join("root/cfg")).expect("symlink");
    // And the same with a symlinked volume top-level directory as a subtree to limit to.
    let d = diff(&t, &text_options());
    assert_eq!(
        summary(&d),
        [
            ("/home/user/added-link".into(), Change::Added, EntryKind::Symlink),
            ("/home/user/link".into(), Change::Modified, EntryKind::Symlink),
            ("/home/user/shadow".into(), Change::Added, EntryKind::Symlink),
            ("/root/cfg".into(), Change::TypeChanged, EntryKind::Symlink),
            ("/root/cfg/a".into(), Change::Deleted, EntryKind::File),
        ]
    );
    let link = entry(&d, "/home/user/link");
    assert_eq!(link.old_size, Some("target.txt".len() as u64));
    assert_eq!(link.new_size, Some(secret.as_os_str().len() as u64));
    let json = serde_json::to_string(&d).expect("json");
    assert!(
        !json.contains(MARKER),
        "the symlink target's content leaked: {json}"
    );
    assert!(d
        .entries
        .iter()
        .all(|e| e.unified.as_deref().is_none_or(|u| !u.contains(MARKER))));
    assert!(
        !d.entries.iter().any(|e| e.path.contains("secret")),
        "walked through the symlink"
    );

    // A subtree named through a symlinked ancestor does not reach outside either.
    let sub = diff_trees(
        &t.old,
        &t.new,
        &DiffOptions {
            paths: vec!["root/cfg/secret".into()],
            ..text_options()
        },
    )
    .expect("diff");
    assert_eq!(sub.entries, []);
}

#[test]
fn type_changes_list_what_came_and_went() {
    let t = trees();
    write(&t.old, "home/user/thing", "was a file\n");
    write(&t.new, "home/user/thing/inside.txt", "now a dir\n");
    write(&t.old, "home/user/other/a", "a\n");
    write(&t.old, "home/user/other/b", "b\n");
    write(&t.new, "home/user/other", "now a file\n");
    let d = diff(&t, &text_options());
    assert_eq!(
        summary(&d),
        [
            ("/home/user/other".into(), Change::TypeChanged, EntryKind::File),
            ("/home/user/other/a".into(), Change::Deleted, EntryKind::File),
            ("/home/user/other/b".into(), Change::Deleted, EntryKind::File),
            ("/home/user/thing".into(), Change::TypeChanged, EntryKind::Dir),
            (
                "/home/user/thing/inside.txt".into(),
                Change::Added,
                EntryKind::File
            ),
        ]
    );
    assert_eq!((d.added, d.modified, d.deleted), (1, 2, 2));
    assert_eq!(d.bytes_added, 11 + 10);
    assert_eq!(d.bytes_deleted, 2 + 2 + 11);
    let thing = entry(&d, "/home/user/thing");
    assert_eq!((thing.old_size, thing.new_size), (Some(11), None));
    assert_eq!(
        thing.unified.as_deref(),
        Some("--- a/home/user/thing\n+++ /dev/null\n@@ -1 +0,0 @@\n-was a file\n")
    );
}

#[test]
fn binary_and_non_utf8_files_have_no_text_diff() {
    let t = trees();
    write(&t.old, "home/bin", b"abc\0def");
    write(&t.new, "home/bin", b"abc\0deg");
    write(&t.old, "home/latin1", b"caf\xe9\n");
    write(&t.new, "home/latin1", b"caf\xe8\n");
    write(&t.new, "home/added-bin", b"\0\x01\x02");
    let d = diff(&t, &text_options());
    assert_eq!(
        summary(&d),
        [
            ("/home/added-bin".into(), Change::Added, EntryKind::File),
            ("/home/bin".into(), Change::Modified, EntryKind::File),
            ("/home/latin1".into(), Change::Modified, EntryKind::File),
        ]
    );
    assert!(d.entries.iter().all(|e| e.unified.is_none()));
}

#[test]
fn files_beyond_the_bounds_are_modified_without_diffs() {
    let t = trees();
    let big = "line\n".repeat(1000); // 5000 bytes
    write(&t.old, "home/big.txt", &big);
    write(&t.new, "home/big.txt", format!("{big}more\n"));
    // Same size, same content, different inodes: equal when read, but too large to read here.
    both(&t, "home/same-but-large.bin", &"z".repeat(20_000));
    both(&t, "home/same-small.txt", "small\n");
    let options = DiffOptions {
        max_text_bytes: 4096,
        max_compare_bytes: 10_000,
        ..text_options()
    };
    let d = diff(&t, &options);
    assert_eq!(
        summary(&d),
        [
            ("/home/big.txt".into(), Change::Modified, EntryKind::File),
            (
                "/home/same-but-large.bin".into(),
                Change::Modified,
                EntryKind::File
            ),
        ]
    );
    assert!(d.entries.iter().all(|e| e.unified.is_none()));
    // With room to read it, the large file compares equal.
    let roomy = diff(
        &t,
        &DiffOptions {
            max_text_bytes: 4096,
            ..text_options()
        },
    );
    assert_eq!(
        summary(&roomy),
        [("/home/big.txt".into(), Change::Modified, EntryKind::File)]
    );
    // A spent total budget makes files that need reading count as modified, unread.
    let spent = diff(
        &t,
        &DiffOptions {
            max_total_compare_bytes: 0,
            ..DiffOptions::default()
        },
    );
    assert_eq!(spent.modified, 3);
    // And a spent text budget stops diffs, not the comparison.
    let no_text = diff(
        &t,
        &DiffOptions {
            max_total_text_bytes: 10,
            ..text_options()
        },
    );
    assert_eq!(summary(&no_text), summary(&roomy));
    assert!(no_text.entries.iter().all(|e| e.unified.is_none()));
}

#[test]
fn deleted_directory_lists_its_descendants() {
    let t = trees();
    fs::create_dir_all(t.old.join("home")).expect("mkdir");
    fs::create_dir_all(t.new.join("home")).expect("mkdir");
    write(&t.old, "home/project/src/main.rs", "fn main() {}\n");
    write(&t.old, "home/project/README", "hi\n");
    fs::create_dir_all(t.old.join("home/project/empty")).expect("mkdir");
    symlink("README", t.old.join("home/project/link")).expect("symlink");
    let d = diff(&t, &DiffOptions::default());
    assert_eq!(
        summary(&d),
        [
            ("/home/project".into(), Change::Deleted, EntryKind::Dir),
            ("/home/project/README".into(), Change::Deleted, EntryKind::File),
            ("/home/project/empty".into(), Change::Deleted, EntryKind::Dir),
            ("/home/project/link".into(), Change::Deleted, EntryKind::Symlink),
            ("/home/project/src".into(), Change::Deleted, EntryKind::Dir),
            (
                "/home/project/src/main.rs".into(),
                Change::Deleted,
                EntryKind::File
            ),
        ]
    );
    assert_eq!((d.deleted, d.bytes_deleted), (6, 13 + 3));
    assert_eq!(entry(&d, "/home/project/src/main.rs").old_size, Some(13));
    assert_eq!(entry(&d, "/home/project/src/main.rs").new_size, None);
}

/// Fifos, sockets (and devices) are compared by metadata and never opened: opening a fifo for
/// reading would block forever, so the diff runs on a thread with a deadline.
#[test]
fn special_files_are_compared_by_metadata_only() {
    let t = trees();
    for root in [&t.old, &t.new] {
        fs::create_dir_all(root.join("tmp")).expect("mkdir");
        mkfifo(&root.join("tmp/same-fifo"), 0o644);
        mkfifo(&root.join("tmp/chmod-fifo"), 0o644);
    }
    fs::set_permissions(t.new.join("tmp/chmod-fifo"), fs::Permissions::from_mode(0o600)).expect("chmod");
    mkfifo(&t.new.join("tmp/new-fifo"), 0o644);
    let _socket = std::os::unix::net::UnixListener::bind(t.new.join("tmp/sock")).expect("bind");
    mkfifo(&t.old.join("tmp/was-fifo"), 0o644);
    write(&t.new, "tmp/was-fifo", "now a file\n");

    let (tx, rx) = mpsc::channel();
    let (old, new) = (t.old.clone(), t.new.clone());
    std::thread::spawn(move || tx.send(diff_trees(&old, &new, &text_options()).map_err(|e| e.to_string())));
    let d = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the diff blocked (it opened a fifo?)")
        .expect("diff");
    assert_eq!(
        summary(&d),
        [
            ("/tmp/chmod-fifo".into(), Change::Modified, EntryKind::Other),
            ("/tmp/new-fifo".into(), Change::Added, EntryKind::Other),
            ("/tmp/sock".into(), Change::Added, EntryKind::Other),
            ("/tmp/was-fifo".into(), Change::TypeChanged, EntryKind::File),
        ]
    );
    assert!(entry(&d, "/tmp/chmod-fifo").mode_changed);
    assert_eq!(entry(&d, "/tmp/new-fifo").unified, None);
    assert_eq!(entry(&d, "/tmp/new-fifo").new_size, None);
    assert_eq!(
        entry(&d, "/tmp/was-fifo").unified.as_deref(),
        Some("--- /dev/null\n+++ b/tmp/was-fifo\n@@ -0,0 +1 @@\n+now a file\n")
    );
}

fn mkfifo(path: &Path, mode: u32) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_bits_retain(mode),
        0,
    )
    .expect("mkfifo");
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).expect("chmod");
    // past the umask
}

#[test]
fn bounds_set_truncated() {
    let t = trees();
    for i in 0..10 {
        write(&t.new, &format!("home/f{i}"), "x");
    }
    both(&t, "etc/hostname", "sandbox\n");

    let d = diff(
        &t,
        &DiffOptions {
            max_entries: 3,
            ..DiffOptions::default()
        },
    );
    assert!(d.truncated);
    assert_eq!(summary(&d).len(), 3);
    assert_eq!(d.added, 3, "counts describe the listed entries");
    assert_eq!(d.entries[0].path, "/home");

    let exact = diff(
        &t,
        &DiffOptions {
            max_entries: 11,
            ..DiffOptions::default()
        },
    );
    assert!(!exact.truncated, "a limit that is not exceeded does not truncate");

    let scanned = diff(
        &t,
        &DiffOptions {
            max_scanned: 5,
            ..DiffOptions::default()
        },
    );
    assert!(scanned.truncated);

    let shallow = diff(
        &t,
        &DiffOptions {
            max_depth: 1,
            ..DiffOptions::default()
        },
    );
    assert!(shallow.truncated);
    assert_eq!(
        summary(&shallow),
        [("/home".into(), Change::Added, EntryKind::Dir)]
    );
}

/// A tree deeper than any stack: the walk is iterative, stops at `max_depth`, and holds two
/// descriptors per level at most.
#[test]
fn deep_trees_are_cut_at_max_depth() {
    let t = trees();
    let mut deep = t.new.clone();
    for _ in 0..400 {
        deep.push("d");
    }
    fs::create_dir_all(&deep).expect("mkdir -p");
    let d = diff(&t, &DiffOptions::default());
    assert!(d.truncated);
    assert_eq!(d.entries.len(), DiffOptions::default().max_depth);
    let d = diff(
        &t,
        &DiffOptions {
            max_depth: 1000,
            ..DiffOptions::default()
        },
    );
    assert!(!d.truncated);
    assert_eq!(d.entries.len(), 400);
}

#[test]
fn order_is_depth_first_with_siblings_in_byte_order() {
    let t = trees();
    for rel in ["b", "a.b", "a/x", "a/B", "Z", "a-", "\u{e9}"] {
        write(&t.new, rel, "x");
    }
    let d = diff(&t, &DiffOptions::default());
    let paths: Vec<_> = d.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/Z", "/a", "/a/B", "/a/x", "/a-", "/a.b", "/b", "/\u{e9}"]
    );
    assert_eq!(diff(&t, &DiffOptions::default()), d, "deterministic");
}

#[test]
fn subtrees_limit_the_walk() {
    let t = trees();
    write(&t.new, "home/user/a", "a");
    write(&t.new, "home/other/b", "b");
    write(&t.new, "etc/c", "c");
    write(&t.old, "home/user/file", "old");
    write(&t.new, "home/user/file", "new");
    let limited = |paths: &[&str]| {
        let options = DiffOptions {
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            ..DiffOptions::default()
        };
        summary(&diff(&t, &options))
            .into_iter()
            .map(|(p, c, _)| (p, c))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        limited(&["home/user"]),
        [
            ("/home/user/a".to_owned(), Change::Added),
            ("/home/user/file".to_owned(), Change::Modified),
        ]
    );
    assert_eq!(
        limited(&["/etc/", "home/user/file", "home/user/file/below", "missing/x"]),
        [
            ("/etc".to_owned(), Change::Added),
            ("/etc/c".to_owned(), Change::Added),
            ("/home/user/file".to_owned(), Change::Modified),
        ]
    );
    assert_eq!(limited(&["home"]).len(), 4);
    let bad = diff_trees(
        &t.old,
        &t.new,
        &DiffOptions {
            paths: vec!["home/../../etc".into()],
            ..DiffOptions::default()
        },
    );
    assert!(matches!(bad, Err(DiffError::InvalidPath { .. })), "{bad:?}");
}

#[test]
fn missing_roots_are_errors() {
    let t = trees();
    let missing = t.dir.path().join("missing");
    let err = diff_trees(&missing, &t.new, &DiffOptions::default()).expect_err("missing old");
    assert!(
        matches!(&err, DiffError::OpenRoot { path, .. } if *path == missing),
        "{err:?}"
    );
    assert!(err.to_string().contains("missing"), "{err}");
    assert!(diff_trees(&t.old, &missing, &DiffOptions::default()).is_err());
    write(&t.old, "file", "x");
    assert!(diff_trees(&t.old.join("file"), &t.new, &DiffOptions::default()).is_err());
}

#[test]
fn entries_serialize_in_snake_case() {
    let e = DiffEntry {
        path: "/home/user/x".into(),
        change: Change::TypeChanged,
        kind: EntryKind::Dir,
        old_size: Some(3),
        new_size: None,
        mode_changed: false,
        owner_changed: true,
        unified: None,
    };
    let json = serde_json::to_value(&e).expect("json");
    assert_eq!(json["change"], "type_changed");
    assert_eq!(json["kind"], "dir");
    assert_eq!(serde_json::from_value::<DiffEntry>(json).expect("back"), e);
}

/// Mount points inside a tree (a bind mount keeps the device number, a tmpfs does not) are listed,
/// never entered.
#[test]
fn mounts_inside_a_tree_are_not_entered() {
    if !is_root() {
        eprintln!("SKIPPED mounts_inside_a_tree_are_not_entered: mounting needs root");
        return;
    }
    let t = trees();
    let outside = t.dir.path().join("outside");
    write(&outside, "secret", "SECRET-MARKER\n");
    fs::create_dir_all(t.new.join("home/bound")).expect("mkdir");
    fs::create_dir_all(t.new.join("home/tmpfs")).expect("mkdir");
    if let Err(e) = paddock_sys::mount::bind(&outside, &t.new.join("home/bound"), false) {
        eprintln!("SKIPPED mounts_inside_a_tree_are_not_entered: cannot bind-mount here: {e}");
        return;
    }
    let _unmount = Unmount(t.new.join("home/bound"));
    paddock_sys::mount::mount_fs(
        "tmpfs",
        &t.new.join("home/tmpfs"),
        paddock_sys::mount::MountAttrs::WRITABLE,
        "size=1m",
    )
    .expect("mount tmpfs");
    let _unmount_tmpfs = Unmount(t.new.join("home/tmpfs"));
    write(&t.new, "home/tmpfs/inside", "x");
    let d = diff(&t, &text_options());
    let paths: Vec<_> = d.entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["/home", "/home/bound", "/home/tmpfs"]);
}

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = paddock_sys::mount::unmount_detach(&self.0);
    }
}

/// Builds `count` files of ~100 bytes in 100 directories under `root/home/user`.
fn populate(root: &Path, count: usize) {
    for i in 0..count {
        write(
            root,
            &format!("home/user/d{:03}/f{i:05}.txt", i % 100),
            format!("file {i}\n").repeat(10),
        );
    }
}

/// 10 changes: 5 files rewritten, 3 added, 2 deleted.
fn change_ten(root: &Path) {
    for i in 0..5 {
        let path = root.join(format!("home/user/d{:03}/f{i:05}.txt", i % 100));
        fs::remove_file(&path).expect("rm"); // break a hard link, as a write to a snapshot's file would
        fs::write(&path, format!("changed {i}\n")).expect("write");
    }
    for i in 0..3 {
        write(root, &format!("home/user/new/n{i}.txt"), "new\n");
    }
    for i in 5..7 {
        fs::remove_file(root.join(format!("home/user/d{:03}/f{i:05}.txt", i % 100))).expect("rm");
    }
}

fn timed(old: &Path, new: &Path) -> (TreeDiff, Duration) {
    let start = Instant::now();
    let d = diff_trees(old, new, &text_options()).expect("diff");
    (d, start.elapsed())
}

/// 10,000 files, 10 changed. `new` is made of hard links to `old`'s files (same inode, size and
/// ctime, as in a btrfs snapshot), so unchanged files take the fast path; a second run compares
/// two independent copies, where every file must be read. Prints timings; asserts none.
#[test]
fn ten_thousand_files_ten_changed() {
    let t = trees();
    populate(&t.old, 10_000);
    for i in 0..10_000 {
        let rel = format!("home/user/d{:03}/f{i:05}.txt", i % 100);
        fs::create_dir_all(t.new.join(&rel).parent().expect("parent")).expect("mkdir");
        fs::hard_link(t.old.join(&rel), t.new.join(&rel)).expect("link");
    }
    change_ten(&t.new);
    let (d, linked) = timed(&t.old, &t.new);
    assert_eq!((d.added, d.modified, d.deleted), (4, 5, 2), "{:#?}", summary(&d));

    let copies = trees();
    populate(&copies.old, 10_000);
    populate(&copies.new, 10_000);
    change_ten(&copies.new);
    let (d, copied) = timed(&copies.old, &copies.new);
    assert_eq!((d.added, d.modified, d.deleted), (4, 5, 2));
    println!(
        "diff of 10,000 files with 10 changed: {linked:?} (unchanged files share inodes, as in a snapshot), \
         {copied:?} (independent copies: every file read)"
    );
}

/// The real thing: a btrfs subvolume, a read-only snapshot of it, 10 changes to the subvolume.
#[test]
fn btrfs_snapshot_ten_thousand_files() {
    if !is_root() {
        eprintln!("SKIPPED btrfs_snapshot_ten_thousand_files: mounting a btrfs image needs root");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("fs.img");
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).expect("mkdir");
    fs::File::create(&image)
        .and_then(|f| f.set_len(256 << 20))
        .expect("image");
    let ok = |cmd: &mut std::process::Command| cmd.output().is_ok_and(|o| o.status.success());
    if !ok(std::process::Command::new("mkfs.btrfs").arg("-q").arg(&image)) {
        eprintln!("SKIPPED btrfs_snapshot_ten_thousand_files: mkfs.btrfs failed or is missing");
        return;
    }
    if !ok(std::process::Command::new("mount")
        .args(["-o", "loop"])
        .arg(&image)
        .arg(&mnt))
    {
        eprintln!("SKIPPED btrfs_snapshot_ten_thousand_files: cannot loop-mount a btrfs image here");
        return;
    }
    let _unmount = Unmount(mnt.clone());
    paddock_sys::btrfs::create_subvolume(&mnt, "vol").expect("subvolume");
    let vol = mnt.join("vol");
    populate(&vol, 10_000);
    paddock_sys::btrfs::snapshot_subvolume(&vol, &mnt, "snap", true).expect("snapshot");
    let snap = mnt.join("snap");
    let (d, cold) = timed(&snap, &vol);
    assert_eq!(d.entries, []);
    let (_, unchanged) = timed(&snap, &vol);
    // Change 10 files in place this time (the snapshot keeps its copy).
    for i in 0..5 {
        fs::write(
            vol.join(format!("home/user/d{:03}/f{i:05}.txt", i % 100)),
            format!("changed {i}\n"),
        )
        .expect("write");
    }
    for i in 0..3 {
        write(&vol, &format!("home/user/new/n{i}.txt"), "new\n");
    }
    for i in 5..7 {
        fs::remove_file(vol.join(format!("home/user/d{:03}/f{i:05}.txt", i % 100))).expect("rm");
    }
    let (d, changed) = timed(&snap, &vol);
    assert_eq!((d.added, d.modified, d.deleted), (4, 5, 2), "{:#?}", summary(&d));
    assert!(d
        .entries
        .iter()
        .filter(|e| e.change == Change::Modified)
        .all(|e| e.unified.is_some()));
    println!(
        "btrfs snapshot vs live, 10,000 files: {cold:?} with no change (first walk of the snapshot), \
         {unchanged:?} again, {changed:?} with 10 changed"
    );
}

/// A tree described as data: relative path to `Some(content)` for a file, `None` for a directory.
type Model = BTreeMap<Vec<String>, Option<String>>;

fn model() -> impl Strategy<Value = Model> {
    let name = prop::sample::select(vec!["a", "b", "c"]);
    let path = prop::collection::vec(name, 1..4);
    let content = prop::option::of(prop::sample::select(vec!["x\n", "y\n", ""]));
    prop::collection::vec((path, content), 0..12).prop_map(|items| {
        // An item is dropped if its path is taken, lies under a file, or is a file over a directory;
        // the parents of the others are directories.
        let mut m = Model::new();
        for (path, content) in items {
            let path: Vec<String> = path.iter().map(|s| (*s).to_owned()).collect();
            let under_file = (1..path.len()).any(|n| matches!(m.get(&path[..n]), Some(Some(_))));
            let over_dir =
                content.is_some() && m.keys().any(|k| k.len() > path.len() && k.starts_with(&path));
            if under_file || over_dir || m.contains_key(&path) {
                continue;
            }
            for n in 1..path.len() {
                m.entry(path[..n].to_vec()).or_insert(None);
            }
            m.insert(path, content.map(str::to_owned));
        }
        m
    })
}

fn build(root: &Path, m: &Model) {
    for (path, content) in m {
        let p = root.join(path.join("/"));
        match content {
            Some(c) => fs::write(p, c).expect("write"),
            None => fs::create_dir_all(p).expect("mkdir"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// The diff of two random trees is exactly what the model says, in depth-first byte order.
    #[test]
    fn diff_matches_the_model(old in model(), new in model()) {
        let t = trees();
        build(&t.old, &old);
        build(&t.new, &new);
        let mut expected = Vec::new();
        let all: std::collections::BTreeSet<_> = old.keys().chain(new.keys()).collect();
        for path in all {
            let change = match (old.get(path), new.get(path)) {
                (None, Some(_)) => Some(Change::Added),
                (Some(_), None) => Some(Change::Deleted),
                (Some(a), Some(b)) if a.is_some() != b.is_some() => Some(Change::TypeChanged),
                (Some(a), Some(b)) if a != b => Some(Change::Modified),
                _ => None,
            };
            if let Some(change) = change {
                expected.push((format!("/{}", path.join("/")), change));
            }
        }
        let d = diff(&t, &text_options());
        let actual: Vec<_> = d.entries.iter().map(|e| (e.path.clone(), e.change)).collect();
        prop_assert_eq!(actual, expected);
        prop_assert_eq!(diff(&t, &text_options()), d.clone());
        let t2 = trees();
        build(&t2.old, &old);
        build(&t2.new, &old);
        prop_assert_eq!(diff(&t2, &text_options()).entries, vec![]);
    }
}

/// This process's open descriptors now.
fn open_fds() -> usize {
    fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// A walk 100 levels deep holds a bounded number of descriptors (outer directories are closed and
/// reopened when the walk comes back), and still sees what comes after a deep subtree at every level:
/// through `..` where both sides were entered, from the root where the subtree exists on one side only.
#[test]
fn deep_trees_are_compared_with_bounded_descriptors() {
    let t = trees();
    let depth = 100;
    let mut rel = String::from("home");
    for level in 0..depth {
        // After the deeper `d` in byte order: compared once the walk is back at this level.
        both(&t, &format!("{rel}/z"), "same");
        write(&t.new, &format!("{rel}/z"), format!("changed at {level}"));
        if level % 10 == 5 {
            // A subtree on the new side only, deeper than the descriptors kept.
            write(&t.new, &format!("{rel}/c{}/leaf", "/c".repeat(20)), "added");
        }
        rel.push_str("/d");
    }
    let baseline = open_fds();
    let (done, watch) = mpsc::channel::<()>();
    let sampler = std::thread::spawn(move || {
        let mut most = 0;
        while watch.try_recv().is_err() {
            most = most.max(open_fds());
            std::thread::yield_now();
        }
        most
    });
    let d = diff(&t, &DiffOptions::default());
    done.send(()).expect("stop the sampler");
    let most = sampler.join().expect("sampler");
    assert!(!d.truncated);
    let modified: Vec<_> = d
        .entries
        .iter()
        .filter(|e| e.change == Change::Modified && e.path.ends_with("/z"))
        .collect();
    assert_eq!(modified.len(), depth, "{:#?}", d.entries);
    let added_leaves = d
        .entries
        .iter()
        .filter(|e| e.change == Change::Added && e.path.ends_with("/leaf"))
        .count();
    assert_eq!(added_leaves, depth / 10);
    assert!(
        most <= baseline + 24,
        "the diff held up to {most} descriptors (baseline {baseline}) at depth {depth}"
    );
}
