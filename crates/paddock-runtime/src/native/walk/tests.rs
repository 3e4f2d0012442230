use std::os::unix::fs::symlink;
use std::path::Path;

use rustix::fs::{Mode, OFlags};

use super::*;

/// Descriptors this process has open now.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").expect("fds").count()
}

fn deepest() -> WalkOptions {
    WalkOptions { max_depth: MAX_DEPTH }
}

/// Every path visited (each reduced to its last 64 bytes: a deep tree's paths add up to
/// gigabytes) and the most descriptors open during a visit.
fn walk_all(root: &Path) -> (Vec<String>, usize) {
    let fd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root");
    let mut seen = Vec::new();
    let mut most = 0;
    walk_tree::<()>(fd.as_fd(), &deepest(), |e| {
        if seen.len() % 64 == 0 {
            most = most.max(open_fds());
        }
        let tail = &e.path[e.path.len().saturating_sub(64)..];
        seen.push(String::from_utf8_lossy(tail).into_owned());
        Ok(WalkStep::Descend)
    })
    .expect("walk");
    (seen, most)
}

/// The walk's own error.
fn walk_error(stopped: Stopped<()>) -> WalkError {
    match stopped {
        Stopped::Walk(e) => e,
        Stopped::Visitor(()) => panic!("the visitor failed"),
    }
}

#[test]
fn visits_depth_first_in_byte_order_without_following_symlinks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("secret"), "x").expect("write");
    for d in ["a/x", "a.b", "b"] {
        std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
    }
    std::fs::write(dir.path().join("a/x/f"), "x").expect("write");
    symlink(outside.path(), dir.path().join("a/out")).expect("symlink");
    let (seen, _) = walk_all(dir.path());
    assert_eq!(seen, ["a", "a/out", "a/x", "a/x/f", "a.b", "b"]);
}

#[test]
fn descriptors_stay_bounded_however_deep_or_wide() {
    // On tmpfs: 50,000 directories on a journalled disk take a minute to make and remove.
    let dir = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .expect("tempdir");
    let before = open_fds();
    // 25,000 nested directories, made fd-relative (the path is far beyond PATH_MAX).
    let mut cur =
        rustix::fs::open(dir.path(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).expect("dir");
    for _ in 0..25_000 {
        rustix::fs::mkdirat(&cur, c"d", Mode::from_raw_mode(0o755)).expect("mkdir");
        cur = open_dir_at(cur.as_fd(), c"d").expect("open");
    }
    rustix::fs::mkdirat(&cur, c"leaf", Mode::from_raw_mode(0o755)).expect("mkdir");
    drop(cur);
    // And 25,000 siblings.
    std::fs::create_dir(dir.path().join("wide")).expect("mkdir");
    for i in 0..25_000 {
        std::fs::create_dir(dir.path().join(format!("wide/{i}"))).expect("mkdir");
    }
    let (seen, most) = walk_all(dir.path());
    assert_eq!(seen.len(), 25_000 + 1 + 1 + 25_000);
    assert!(seen.iter().any(|p| p.ends_with("/d/leaf")), "reached the bottom");
    assert!(
        most <= before + 4,
        "the walk held {} descriptors at most (baseline {before})",
        most - before.min(most)
    );
    // Removing what the test made needs the same care: std's remove_dir_all would recurse.
    let root = paddock_sys::fs_in_root::Root::open(dir.path()).expect("root");
    root.remove_tree(Path::new("d")).expect("remove");
}

#[test]
fn a_tree_rearranged_while_walked_fails_the_walk() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("a/b/x")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("c")).expect("mkdir");
    let fd = rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root");
    let moved = dir.path().to_owned();
    let err = walk_tree::<()>(fd.as_fd(), &deepest(), |e| {
        if e.path == b"a/b/x" {
            std::fs::rename(moved.join("a/b"), moved.join("c/b")).expect("rename");
        }
        Ok(WalkStep::Descend)
    })
    .expect_err("the walk notices");
    let err = walk_error(err);
    assert_eq!(err.step, "return to");
    assert_eq!(err.path, b"a");
}

/// Entries deeper than the bound are never visited: a directory at the bound that holds anything
/// fails the walk (an empty one is no reason to).
#[test]
fn depth_is_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("a/b/c")).expect("mkdir");
    std::fs::create_dir_all(dir.path().join("e/f")).expect("mkdir");
    let fd = rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root");
    let walk = |max_depth| {
        let mut seen = Vec::new();
        let result = walk_tree::<()>(fd.as_fd(), &WalkOptions { max_depth }, |e| {
            seen.push(String::from_utf8_lossy(e.path).into_owned());
            Ok(WalkStep::Descend)
        });
        (seen, result)
    };
    let (seen, result) = walk(3);
    assert!(result.is_ok());
    assert_eq!(seen, ["a", "a/b", "a/b/c", "e", "e/f"]);
    let (seen, result) = walk(2);
    let err = walk_error(result.expect_err("a/b holds c"));
    assert_eq!((err.step, err.path.as_slice()), ("descend into", &b"a/b"[..]));
    assert!(err.source.to_string().contains("deeper than 2 levels"), "{err}");
    assert!(seen.iter().all(|p| p.matches('/').count() < 2), "{seen:?}");
    // A visitor that enters nothing at the bound is never refused.
    let mut seen = Vec::new();
    walk_tree::<()>(fd.as_fd(), &WalkOptions { max_depth: 1 }, |e| {
        seen.push(String::from_utf8_lossy(e.path).into_owned());
        Ok(WalkStep::Continue)
    })
    .expect("walk");
    assert_eq!(seen, ["a", "e"]);
}

/// The visitor's error stops the walk and comes back as it is.
#[test]
fn a_visitor_error_stops_the_walk() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["a", "b", "c"] {
        std::fs::write(dir.path().join(name), "x").expect("write");
    }
    let fd = rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).expect("root");
    let mut seen = 0;
    let result = walk_tree(fd.as_fd(), &deepest(), |e| {
        seen += 1;
        if e.path == b"b" {
            return Err("stop here");
        }
        Ok(WalkStep::Continue)
    });
    assert!(matches!(result, Err(Stopped::Visitor("stop here"))));
    assert_eq!(seen, 2);
}

/// A directory swapped for a symlink (or anything else) after it was listed is not opened; one on
/// another file system is open but not entered.
#[test]
fn listed_directories_are_checked_when_opened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("outside");
    std::fs::create_dir(dir.path().join("d")).expect("mkdir");
    std::fs::create_dir(dir.path().join("e")).expect("mkdir");
    let root = open_dir_at(rustix::fs::CWD, dir.path()).expect("root");
    let fs = Fs::of(&Place::of_fd(root.as_fd()).expect("place"));
    let listed = |name: &CStr| {
        let st = rustix::fs::statat(&root, name, AtFlags::SYMLINK_NOFOLLOW).expect("stat");
        st.st_ino
    };
    let (d, e) = (listed(c"d"), listed(c"e"));
    assert!(matches!(
        open_listed_dir(root.as_fd(), c"d", d, &fs),
        Ok(Opened::Dir(_))
    ));
    // Another inode by the listed name.
    assert!(matches!(
        open_listed_dir(root.as_fd(), c"d", e, &fs),
        Ok(Opened::Changed)
    ));
    std::fs::remove_dir(dir.path().join("d")).expect("rmdir");
    symlink(outside.path(), dir.path().join("d")).expect("symlink");
    assert!(matches!(
        open_listed_dir(root.as_fd(), c"d", d, &fs),
        Ok(Opened::Changed)
    ));
    // Seen from another file system, every directory is foreign (or, with another device, not the
    // one listed).
    let elsewhere = Fs {
        dev: fs.dev,
        mnt_id: fs.mnt_id.map(|id| id + 1),
    };
    if fs.mnt_id.is_some() {
        assert!(matches!(
            open_listed_dir(root.as_fd(), c"e", e, &elsewhere),
            Ok(Opened::Foreign)
        ));
    }
    // `..` leads back only to the directory the walk came from.
    let inside = open_dir_at(root.as_fd(), c"e").expect("e");
    let top = Place::of_fd(root.as_fd()).expect("place").ino;
    assert!(open_parent(inside.as_fd(), top, &fs).expect("up").is_some());
    assert!(open_parent(inside.as_fd(), e, &fs).expect("up").is_none());
}
