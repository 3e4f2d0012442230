//! Directory watches: which events arrive for which changes, recursion, confinement, limits and
//! backpressure.

use std::os::unix::fs::symlink;
use std::time::Duration;

use paddock_protocol::{ErrorCode, FsEvent, FsEventKind, WatchEndReason};
use paddock_runtime::agent_client::{AgentClientError, WatchEvents, WatchUpdate};

use crate::harness::{require_root, TestAgent};

/// Everything a watch reported until `done` holds for it (or the watch ended), within a deadline.
#[derive(Debug, Default)]
struct Seen {
    events: Vec<FsEvent>,
    ended: Option<WatchEndReason>,
}

impl Seen {
    fn has(&self, kind: FsEventKind, path: &str) -> bool {
        self.events.iter().any(|e| e.kind == kind && e.path == path)
    }

    fn position(&self, kind: FsEventKind, path: &str) -> usize {
        self.events
            .iter()
            .position(|e| e.kind == kind && e.path == path)
            .unwrap_or_else(|| panic!("no {kind:?} of {path}: {:#?}", self.events))
    }
}

async fn watch_until(events: &mut WatchEvents, mut done: impl FnMut(&Seen) -> bool) -> Seen {
    let mut seen = Seen::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done(&seen) && seen.ended.is_none() {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(WatchUpdate::Events(batch))) => {
                assert!(!batch.is_empty(), "no empty batches");
                seen.events.extend(batch);
            }
            Ok(Some(WatchUpdate::Ended(reason))) => seen.ended = Some(reason),
            Ok(None) => break,
            Err(_) => panic!(
                "timed out after {} events; the last ones: {:#?}",
                seen.events.len(),
                &seen.events[seen.events.len().saturating_sub(5)..]
            ),
        }
    }
    seen
}

/// A tmpfs mounted at a directory of a test root (many directories are slow to create and delete on
/// a disk); unmounted on drop, also when the test panics.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(path: std::path::PathBuf) -> Self {
        std::fs::create_dir_all(&path).expect("mount point");
        rustix::mount::mount("tmpfs", &path, "tmpfs", rustix::mount::MountFlags::empty(), None)
            .expect("mount tmpfs");
        Self(path)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
    }
}

/// How many kernel watches the agent's inotify instances hold (`inotify wd:` lines of their
/// fdinfo).
fn kernel_watches(agent: &TestAgent) -> usize {
    let fds = std::fs::read_dir(format!("/proc/{}/fd", agent.pid())).expect("agent fds");
    fds.flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| target.to_string_lossy() == "anon_inode:inotify")
        })
        .map(|fd| {
            let info = format!(
                "/proc/{}/fdinfo/{}",
                agent.pid(),
                fd.file_name().to_string_lossy()
            );
            let text = std::fs::read_to_string(info).unwrap_or_default();
            text.lines().filter(|l| l.starts_with("inotify wd:")).count()
        })
        .sum()
}

fn code<T: std::fmt::Debug>(result: Result<T, AgentClientError>) -> Option<ErrorCode> {
    result.expect_err("the call must fail").code()
}

#[tokio::test]
async fn create_modify_rename_attrib_and_delete_are_reported() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    std::fs::create_dir(agent.host_path("/tmp/w")).expect("mkdir");
    // `..` and a symlink in the request resolve inside the root; events name the real directory.
    symlink("/tmp/w", agent.host_path("/tmp/link")).expect("symlink");
    let (_id, mut events) = client.watch("/home/../tmp/link", false).await.expect("watch");

    let file = agent.host_path("/tmp/w/a.txt");
    std::fs::write(&file, b"one").expect("create");
    std::fs::write(&file, b"two").expect("modify");
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
    std::fs::rename(&file, agent.host_path("/tmp/w/b.txt")).expect("rename");
    std::fs::create_dir(agent.host_path("/tmp/w/sub")).expect("mkdir sub");
    std::fs::write(agent.host_path("/tmp/w/sub/deep"), b"x").expect("write below");
    std::fs::remove_file(agent.host_path("/tmp/w/b.txt")).expect("delete");

    let seen = watch_until(&mut events, |s| s.has(FsEventKind::Remove, "/tmp/w/b.txt")).await;
    let order = [
        seen.position(FsEventKind::Create, "/tmp/w/a.txt"),
        seen.position(FsEventKind::Modify, "/tmp/w/a.txt"),
        seen.position(FsEventKind::Attrib, "/tmp/w/a.txt"),
        seen.position(FsEventKind::RenameFrom, "/tmp/w/a.txt"),
        seen.position(FsEventKind::RenameTo, "/tmp/w/b.txt"),
        seen.position(FsEventKind::Create, "/tmp/w/sub"),
        seen.position(FsEventKind::Remove, "/tmp/w/b.txt"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "out of order: {seen:#?}");
    let sub = &seen.events[order[5]];
    assert!(sub.is_dir, "{sub:?}");
    assert!(!seen.events[order[0]].is_dir);
    assert!(
        !seen.events.iter().any(|e| e.path.starts_with("/tmp/w/sub/")),
        "a non-recursive watch does not look into subdirectories: {seen:#?}"
    );
    // Repeated identical events are merged.
    assert!(
        seen.events.windows(2).all(|w| w[0] != w[1]),
        "consecutive duplicates: {seen:#?}"
    );
    assert_eq!(seen.ended, None);
}

#[tokio::test]
async fn recursive_watch_follows_new_subdirectories() {
    require_root!();
    let (agent, client) = TestAgent::start_with_default_user("user").await;
    std::fs::create_dir_all(agent.host_path("/home/user/proj/old/deeper")).expect("mkdir");
    let (_id, mut events) = client.watch("proj", true).await.expect("watch relative to home");

    // Present before the watch: watched.
    std::fs::write(agent.host_path("/home/user/proj/old/deeper/x"), b"x").expect("write");
    // Created after: a new directory tree, filled at once (before its watch can exist).
    std::fs::create_dir_all(agent.host_path("/home/user/proj/new/inner")).expect("mkdir -p");
    std::fs::write(agent.host_path("/home/user/proj/new/inner/f"), b"f").expect("write");
    let seen = watch_until(&mut events, |s| {
        s.has(FsEventKind::Create, "/home/user/proj/new/inner/f")
            && s.has(FsEventKind::Create, "/home/user/proj/old/deeper/x")
    })
    .await;
    assert!(seen.has(FsEventKind::Create, "/home/user/proj/new"), "{seen:#?}");

    // And the new directories are watched from now on.
    std::fs::write(agent.host_path("/home/user/proj/new/inner/g"), b"g").expect("write");
    let seen = watch_until(&mut events, |s| {
        s.has(FsEventKind::Create, "/home/user/proj/new/inner/g")
    })
    .await;
    assert_eq!(seen.ended, None);

    // A directory moved out of the tree is no longer reported, one moved in is.
    std::fs::rename(
        agent.host_path("/home/user/proj/new"),
        agent.host_path("/tmp/moved-out"),
    )
    .expect("move out");
    std::fs::write(agent.host_path("/tmp/moved-out/inner/h"), b"h").expect("write outside");
    std::fs::create_dir_all(agent.host_path("/tmp/incoming/sub")).expect("mkdir");
    std::fs::rename(
        agent.host_path("/tmp/incoming"),
        agent.host_path("/home/user/proj/incoming"),
    )
    .expect("move in");
    std::fs::write(agent.host_path("/home/user/proj/incoming/sub/i"), b"i").expect("write");
    let seen = watch_until(&mut events, |s| {
        s.has(FsEventKind::Create, "/home/user/proj/incoming/sub/i")
    })
    .await;
    assert!(
        seen.has(FsEventKind::RenameFrom, "/home/user/proj/new"),
        "{seen:#?}"
    );
    assert!(
        seen.has(FsEventKind::RenameTo, "/home/user/proj/incoming"),
        "{seen:#?}"
    );
    assert!(
        !seen.events.iter().any(|e| e.path.ends_with("/h")),
        "events under the old path after the move: {seen:#?}"
    );
}

#[tokio::test]
async fn watches_stay_inside_the_root() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    let outside = tempfile::tempdir().expect("outside dir");
    let target = outside.path().to_str().expect("utf-8").to_owned();
    symlink(&target, agent.host_path("/tmp/escape")).expect("symlink");
    // The absolute target resolves inside the root, where it does not exist.
    assert_eq!(
        code(client.watch("/tmp/escape", true).await),
        Some(ErrorCode::NotFound)
    );
    // A relative one that climbs out stops at the root: the watch is on the sandbox's `/`.
    symlink("../../../../../../..", agent.host_path("/tmp/up")).expect("symlink");
    let (_id, mut events) = client.watch("/tmp/up", false).await.expect("watch /");
    std::fs::write(outside.path().join("secret"), b"s").expect("write outside");
    std::fs::write(agent.host_path("/inside"), b"i").expect("write inside");
    let seen = watch_until(&mut events, |s| s.has(FsEventKind::Create, "/inside")).await;
    assert!(
        seen.events.iter().all(|e| !e.path.contains("secret")),
        "{seen:#?}"
    );

    assert_eq!(
        code(client.watch("/no/such/dir", false).await),
        Some(ErrorCode::NotFound)
    );
    std::fs::write(agent.host_path("/tmp/file"), b"f").expect("write");
    assert_eq!(
        code(client.watch("/tmp/file", false).await),
        Some(ErrorCode::NotADirectory)
    );
}

#[tokio::test]
async fn a_deleted_directory_ends_its_watch() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    std::fs::create_dir_all(agent.host_path("/tmp/gone/sub")).expect("mkdir");
    let (_id, mut events) = client.watch("/tmp/gone", true).await.expect("watch");
    std::fs::remove_dir_all(agent.host_path("/tmp/gone")).expect("rm -r");
    let seen = watch_until(&mut events, |_| false).await;
    assert_eq!(seen.ended, Some(WatchEndReason::Deleted), "{seen:#?}");
    let last = seen.events.last().expect("a final event");
    assert_eq!(
        (last.kind, last.path.as_str()),
        (FsEventKind::Remove, "/tmp/gone")
    );
    assert!(seen.has(FsEventKind::Remove, "/tmp/gone/sub"), "{seen:#?}");
    assert!(events.recv().await.is_none(), "nothing after the end");

    std::fs::create_dir(agent.host_path("/tmp/moving")).expect("mkdir");
    let (_id, mut events) = client.watch("/tmp/moving", false).await.expect("watch");
    std::fs::rename(agent.host_path("/tmp/moving"), agent.host_path("/tmp/moved")).expect("mv");
    let seen = watch_until(&mut events, |_| false).await;
    assert_eq!(seen.ended, Some(WatchEndReason::Moved), "{seen:#?}");
}

#[tokio::test]
async fn unwatch_and_drop_end_a_watch() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    std::fs::create_dir(agent.host_path("/tmp/u")).expect("mkdir");
    let (id, mut events) = client.watch("/tmp/u", false).await.expect("watch");
    let (other, mut other_events) = client.watch("/tmp/u", false).await.expect("second watch");
    assert_ne!(id, other);
    client.unwatch(id).await.expect("unwatch");
    assert!(events.recv().await.is_none(), "no updates after unwatch");
    assert_eq!(
        code(client.unwatch(id).await),
        Some(ErrorCode::BadRequest),
        "unknown watch"
    );
    // The other watch of the same directory is unaffected.
    std::fs::write(agent.host_path("/tmp/u/f"), b"f").expect("write");
    watch_until(&mut other_events, |s| s.has(FsEventKind::Create, "/tmp/u/f")).await;

    // Dropping the events unwatches in the background: the unwatch frame is written as soon as the
    // spawned task runs (this runtime has one thread), so before the one below.
    drop(other_events);
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        code(client.unwatch(other).await),
        Some(ErrorCode::BadRequest),
        "dropping the events did not unwatch"
    );

    // Watches belong to their connection: another client cannot end this one's.
    let second = agent.connect().await;
    let (third, _third_events) = second.watch("/tmp/u", false).await.expect("watch");
    assert_eq!(code(client.unwatch(third).await), Some(ErrorCode::BadRequest));
    second.unwatch(third).await.expect("its own connection can");
}

#[tokio::test]
async fn too_many_directories_are_refused() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    let _tmpfs = Tmpfs::mount(agent.host_path("/tmp/many"));
    for i in 0..8200 {
        std::fs::create_dir_all(agent.host_path(&format!("/tmp/many/{}/{i}", i % 50))).expect("mkdir");
    }
    assert_eq!(
        code(client.watch("/tmp/many", true).await),
        Some(ErrorCode::LimitExceeded)
    );
    // The refused watch left nothing behind: a smaller one still fits.
    let (_id, _events) = client.watch("/tmp/many/7", true).await.expect("watch a part");
}

#[tokio::test]
async fn a_consumer_that_does_not_read_gets_an_overflow_not_unbounded_memory() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    let _tmpfs = Tmpfs::mount(agent.host_path("/tmp/flood"));
    let files = [agent.host_path("/tmp/flood/a"), agent.host_path("/tmp/flood/b")];
    for file in &files {
        std::fs::write(file, b"x").expect("create");
    }
    let (_id, mut events) = client.watch("/tmp/flood", false).await.expect("watch");
    let rss_before = agent.rss_kib();
    // Alternating files, so that no two consecutive events are the same and merged.
    let changes = 60_000;
    for i in 0..changes {
        let mode = if i % 4 < 2 { 0o644 } else { 0o640 };
        std::fs::set_permissions(&files[i % 2], std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
    }
    // Let the agent take everything the kernel queued while nobody reads.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = agent.rss_kib();
    let seen = watch_until(&mut events, |s| s.has(FsEventKind::Overflow, "/tmp/flood")).await;
    assert!(
        seen.events.len() < changes,
        "{} events delivered for {changes} changes: nothing was dropped",
        seen.events.len()
    );
    assert!(
        rss_after < rss_before + 32 * 1024,
        "agent memory grew from {rss_before} KiB to {rss_after} KiB"
    );
    // Once the consumer has caught up, events flow again.
    std::fs::write(agent.host_path("/tmp/flood/after"), b"x").expect("write");
    watch_until(&mut events, |s| s.has(FsEventKind::Create, "/tmp/flood/after")).await;
}

#[tokio::test]
async fn recursion_skips_pseudo_file_systems_and_watches_are_released() {
    require_root!();
    let (agent, client) = TestAgent::start().await;
    for dir in ["/tmp/p/a/deep", "/tmp/p/b", "/tmp/p/proc"] {
        std::fs::create_dir_all(agent.host_path(dir)).expect("mkdir");
    }
    let proc_mount = agent.host_path("/tmp/p/proc");
    rustix::mount::mount(
        "proc",
        &proc_mount,
        "proc",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .expect("mount proc");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = rustix::mount::unmount(&self.0, rustix::mount::UnmountFlags::DETACH);
        }
    }
    let _unmount = Unmount(proc_mount);

    assert_eq!(kernel_watches(&agent), 0);
    let (id, _events) = client.watch("/tmp/p", true).await.expect("watch");
    // /tmp/p, a, a/deep and b; nothing of the thousands of directories of /proc.
    assert_eq!(kernel_watches(&agent), 4);
    let (other, _other_events) = client.watch("/tmp/p/a", false).await.expect("watch");
    assert_eq!(
        kernel_watches(&agent),
        4,
        "one kernel watch per directory, shared"
    );
    client.unwatch(id).await.expect("unwatch");
    assert_eq!(
        kernel_watches(&agent),
        1,
        "the shared one stays for the other watch"
    );
    client.unwatch(other).await.expect("unwatch");
    assert_eq!(kernel_watches(&agent), 0);

    // A closed connection releases its watches.
    let second = agent.connect().await;
    let (_id, _events) = second.watch("/tmp/p", true).await.expect("watch");
    assert_eq!(kernel_watches(&agent), 4);
    drop(_events);
    drop(second);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while kernel_watches(&agent) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "watches of a closed connection stay"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
