//! Snapshots, forks, rollback and pause of real sandboxes, driving the native backend directly: a
//! snapshot taken while a process writes holds a consistent prefix of what it wrote; a rollback
//! restores the file system exactly and restarts the sandbox under the same id and limits; forks
//! never see each other's writes; a paused sandbox uses no CPU; snapshots are measured, listed and
//! deleted, never garbage-collected, and removed with the pool. Every test ends by checking that no
//! sandbox, snapshot, cgroup or process is left. Below: what the tests share, and the snapshots
//! themselves; rollbacks, forks and pause in the modules.

mod forks;
mod legacy;
mod pause;
mod rollback;
mod timings;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_runtime::agent_client::AgentClient;
use paddock_runtime::native::{IdRange, NativeBackend, NativeConfig};
use paddock_runtime::{RuntimeError, SandboxBackend, SandboxHandle, StorageBackend};
use paddock_types::{ByteSize, RootfsSpec, SandboxId, SandboxSpec, SnapshotId, VolumeSource};

use crate::support::{
    agent_bin, agent_sh, agent_sh_as, assert_code, connect, host_spec, setup_bin, shell_request, skip,
    test_name, wait_until, GcOnDrop, TestEnv, ID_BASE,
};

const MIB: u64 = 1 << 20;

fn backend(env: &TestEnv) -> NativeBackend {
    NativeBackend::open(env.native_config()).expect("open the native backend")
}

fn spec(id: &str) -> SandboxSpec {
    host_spec(id)
}

fn fork_spec(id: &str, snapshot: &SnapshotId) -> SandboxSpec {
    SandboxSpec {
        volume: VolumeSource::Snapshot(snapshot.clone()),
        ..spec(id)
    }
}

fn sandbox_id(s: &str) -> SandboxId {
    s.parse().expect("sandbox id")
}

fn snapshot_id(s: &str) -> SnapshotId {
    s.parse().expect("snapshot id")
}

fn pool(env: &TestEnv) -> PathBuf {
    env.state().join("pool")
}

fn snapshot_dir(env: &TestEnv, snapshot: &SnapshotId) -> PathBuf {
    pool(env).join("snapshots").join(snapshot.as_str())
}

fn run_dir(env: &TestEnv, id: &str) -> PathBuf {
    env.state().join("run").join(id)
}

/// Commits the pool's transaction: quota and extent-sharing numbers are current afterwards.
fn sync_pool(env: &TestEnv) {
    paddock_sys::btrfs::sync(&pool(env)).expect("btrfs sync");
}

/// Runs `script`, which must succeed, and returns its output.
async fn ok(client: &AgentClient, script: &str) -> String {
    let (code, out) = agent_sh(client, script).await;
    assert_eq!(code, 0, "{script}: {out}");
    out
}

/// Starts `script` in the background (nobody follows its output).
async fn background(client: &AgentClient, script: &str) {
    client
        .spawn(shell_request(script, None, true))
        .await
        .expect("spawn a background process");
}

fn process_gone(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    matches!(state, None | Some("Z") | Some("X"))
}

/// The sandbox's cgroup2 directory (its freezer), on a hybrid or a pure v2 host.
fn unified_cgroup(env: &TestEnv, id: &str) -> PathBuf {
    let hybrid = Path::new("/sys/fs/cgroup/unified")
        .join(&env.cgroup_parent)
        .join(id);
    if hybrid.exists() {
        hybrid
    } else {
        Path::new("/sys/fs/cgroup").join(&env.cgroup_parent).join(id)
    }
}

fn frozen(env: &TestEnv, id: &str) -> bool {
    let path = unified_cgroup(env, id).join("cgroup.freeze");
    std::fs::read_to_string(&path).expect("cgroup.freeze").trim() == "1"
}

/// Notices changes of a sandbox's `cgroup.events`: the kernel reports one when every process of the
/// sandbox has stopped (`frozen 1`) and one when they run again. Nothing else changes it while the
/// sandbox's processes neither all exit nor all stop.
struct FreezeWatch {
    inotify: std::os::fd::OwnedFd,
}

impl FreezeWatch {
    fn start(env: &TestEnv, id: &str) -> Self {
        use rustix::fs::inotify;
        let inotify = inotify::init(inotify::CreateFlags::CLOEXEC).expect("inotify");
        inotify::add_watch(
            &inotify,
            unified_cgroup(env, id).join("cgroup.events"),
            inotify::WatchFlags::MODIFY,
        )
        .expect("watch cgroup.events");
        Self { inotify }
    }

    /// Whether the sandbox was frozen since [`FreezeWatch::start`] (the notification comes from a
    /// kernel work queue: waited for up to two seconds).
    fn saw_a_freeze(self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let mut fds = [PollFd::new(&self.inotify, PollFlags::IN)];
        let timeout = Timespec {
            tv_sec: 2,
            tv_nsec: 0,
        };
        poll(&mut fds, Some(&timeout)).expect("poll inotify") > 0
    }
}

/// Whether this host can freeze sandboxes (a cgroup2 hierarchy); a loud skip when not.
fn require_freezer() -> bool {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").is_ok();
    let hybrid = Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists();
    if !(v2 || hybrid) {
        skip("no cgroup2 hierarchy, so no freezer (snapshots and pause are unsupported)");
        return false;
    }
    true
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Nothing of sandbox `id` exists: run directory, cgroups, subvolume.
fn assert_gone(env: &TestEnv, id: &str) {
    assert!(!run_dir(env, id).exists(), "run dir of {id} left");
    assert!(
        !pool(env).join("sandboxes").join(id).exists(),
        "subvolume of {id} left"
    );
    assert!(!env.cgroup_ids().iter().any(|c| c == id), "cgroups of {id} left");
}

/// Nothing is left: no sandbox (run dir, subvolume, cgroup, process, mount) and no snapshot.
fn assert_all_clean(env: &TestEnv) {
    env.assert_clean();
    let snapshots = names(&pool(env).join("snapshots"));
    assert!(snapshots.is_empty(), "snapshots left behind: {snapshots:?}");
}

/// Forks up to `count` waiting processes in the sandbox and prints how many forks succeeded.
const FORK_SCRIPT: &str = r#"python3 -c '
import os, sys, signal
pids = []
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    pids.append(pid)
print(len(pids))
for p in pids:
    os.kill(p, 9)
    os.waitpid(p, 0)
' "#;

/// Everything a rollback must restore, read from the host: for every path of the sandbox's volume,
/// its type, mode, owner (host ids), modification time, and its content or link target.
fn volume_tree(env: &TestEnv, id: &str) -> BTreeMap<String, String> {
    use std::os::unix::fs::MetadataExt;
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let meta = std::fs::symlink_metadata(dir).expect("stat");
        let describe = |meta: &std::fs::Metadata, what: String| {
            format!(
                "{:o} {}:{} {}.{} {what}",
                meta.mode(),
                meta.uid(),
                meta.gid(),
                meta.mtime(),
                meta.mtime_nsec()
            )
        };
        let key = |p: &Path| p.strip_prefix(root).expect("inside").display().to_string();
        out.insert(key(dir), describe(&meta, "dir".into()));
        for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).expect("stat");
            if meta.is_dir() {
                walk(root, &path, out);
                continue;
            }
            let what = if meta.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&path).expect("readlink").display())
            } else {
                let bytes = std::fs::read(&path).expect("read");
                format!("{} bytes {:?}", bytes.len(), &bytes[..bytes.len().min(64)])
            };
            out.insert(key(&path), describe(&meta, what));
        }
    }
    let root = crate::support::volume_in(&pool(env), id);
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

#[tokio::test]
async fn a_snapshot_taken_while_a_process_writes_holds_a_consistent_prefix() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let handle = backend.create_sandbox(&spec("sb-writer")).expect("create");
    let client = connect(&handle).await;
    // Each line is one write(2), without fsync, first to the log, then to the journal: at any instant
    // the journal holds as many lines as the log or one fewer.
    background(
        &client,
        "i=0; while :; do i=$((i+1)); echo \"line $i of the log\" >> /home/user/log; \
         echo \"line $i of the log\" >> /home/user/journal; done",
    )
    .await;
    let lines = |text: &str| text.lines().count();
    assert!(
        wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(crate::support::volume_in(&pool(&env), "sb-writer").join("home/user/log"))
                .is_ok_and(|t| lines(&t) > 1000)
        }),
        "the writer never got going"
    );

    let mut taken = Vec::new();
    for n in 0..20 {
        let snapshot = snapshot_id(&format!("sn-writer-{n}"));
        let watch = FreezeWatch::start(&env, "sb-writer");
        let started = Instant::now();
        backend.snapshot_sandbox(&handle, &snapshot).expect("snapshot");
        taken.push(started.elapsed());
        assert!(
            watch.saw_a_freeze(),
            "the sandbox was not frozen for snapshot {n}"
        );
        assert!(!frozen(&env, "sb-writer"), "the sandbox was left frozen");
        let read = |name: &str| {
            let text = std::fs::read_to_string(snapshot_dir(&env, &snapshot).join("home/user").join(name))
                .expect("a file in the snapshot");
            assert!(text.ends_with('\n'), "a torn last line in {name} of snapshot {n}");
            for (i, line) in text.lines().enumerate() {
                assert_eq!(
                    line,
                    format!("line {} of the log", i + 1),
                    "{name} of snapshot {n}"
                );
            }
            lines(&text)
        };
        let (log, journal) = (read("log"), read("journal"));
        assert!(
            journal == log || journal + 1 == log,
            "snapshot {n} is not one instant: {log} lines in the log, {journal} in the journal"
        );
        // The snapshot is read-only, even for root.
        let err = std::fs::write(snapshot_dir(&env, &snapshot).join("home/user/x"), "x")
            .expect_err("a snapshot is read-only");
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    taken.sort();
    eprintln!(
        "snapshots of a sandbox being written to: p50 {:?}, max {:?}",
        taken[10], taken[19]
    );

    // The writer was thawed: it keeps writing.
    let count = || {
        lines(
            &std::fs::read_to_string(
                crate::support::volume_in(&pool(&env), "sb-writer").join("home/user/log"),
            )
            .unwrap_or_default(),
        )
    };
    let before = count();
    assert!(
        wait_until(Duration::from_secs(10), || count() > before + 100),
        "the writer stopped after the snapshots"
    );

    // A snapshot id is taken once.
    let err = backend
        .snapshot_sandbox(&handle, &snapshot_id("sn-writer-0"))
        .expect_err("the same snapshot id twice");
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
    assert!(!frozen(&env, "sb-writer"));

    drop(client);
    backend.destroy_sandbox(handle).expect("destroy");
    let listed = backend.list_snapshots().expect("list");
    assert_eq!(listed.len(), 20, "{listed:?}");
    for snapshot in listed {
        assert!(backend.delete_snapshot(&snapshot).expect("delete"));
    }
    assert_all_clean(&env);
}

#[tokio::test]
async fn snapshots_are_measured_listed_deleted_and_left_alone_by_gc() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let handle = backend.create_sandbox(&spec("sb-usage")).expect("create");
    let client = connect(&handle).await;
    ok(
        &client,
        "head -c 8M /dev/urandom > /home/user/big && mkdir /home/user/more",
    )
    .await;
    let first = snapshot_id("sn-first");
    let second = snapshot_id("sn-second");
    backend.snapshot_sandbox(&handle, &first).expect("snapshot");
    sync_pool(&env);
    let fresh = backend.snapshot_usage(&first).expect("usage");
    assert!(fresh.referenced_bytes >= 8 * MIB, "{fresh:?}");
    assert!(
        fresh.exclusive_bytes < MIB,
        "all shared with the sandbox: {fresh:?}"
    );

    // The sandbox diverges: what only the snapshot keeps becomes its own.
    ok(
        &client,
        "rm /home/user/big && head -c 4M /dev/urandom > /home/user/other",
    )
    .await;
    sync_pool(&env);
    let diverged = backend.snapshot_usage(&first).expect("usage");
    assert!(diverged.exclusive_bytes >= 8 * MIB, "{fresh:?} -> {diverged:?}");
    assert_eq!(diverged.referenced_bytes, fresh.referenced_bytes);
    backend.snapshot_sandbox(&handle, &second).expect("snapshot");
    assert_eq!(
        backend.list_snapshots().expect("list"),
        vec![first.clone(), second.clone()]
    );

    let json = serde_json::to_value(diverged).expect("serialize");
    assert!(json.get("exclusive_bytes").is_some(), "{json}");

    assert!(backend.delete_snapshot(&first).expect("delete"));
    assert!(!snapshot_dir(&env, &first).exists());
    assert!(!backend.delete_snapshot(&first).expect("delete again"));
    assert_eq!(backend.list_snapshots().expect("list"), vec![second.clone()]);
    let err = backend
        .snapshot_usage(&first)
        .expect_err("usage of a deleted snapshot");
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");

    // Garbage collection reclaims sandboxes, never snapshots: not with the sandbox alive, not after
    // it is gone.
    assert!(backend.collect_garbage().expect("gc").is_empty());
    drop(client);
    backend.destroy_sandbox(handle).expect("destroy");
    assert!(backend.collect_garbage().expect("gc").is_empty());
    let out = env.cmd().arg("gc").output().expect("paddock gc");
    assert_code(&out, 0);
    assert_eq!(backend.list_snapshots().expect("list"), vec![second.clone()]);
    assert!(backend.snapshot_usage(&second).expect("usage").referenced_bytes >= 4 * MIB);

    // `pool destroy` takes the remaining snapshot with it.
    env.assert_clean();
    drop(backend);
    let out = env
        .cmd()
        .args(["pool", "destroy"])
        .output()
        .expect("paddock pool destroy");
    assert_code(&out, 0);
    assert!(!env.state().join("pool.img").exists(), "the pool image is left");
    assert!(!pool(&env).join("snapshots").exists(), "snapshots left behind");
}

#[tokio::test]
async fn a_sandbox_at_its_disk_limit_can_be_snapshotted_and_rolled_back() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let mut full = spec("sb-full");
    full.limits.disk = Some(ByteSize::mib(32));
    let handle = backend.create_sandbox(&full).expect("create");
    let client = connect(&handle).await;
    ok(&client, "echo keep > /home/user/keep").await;
    let (code, _) = agent_sh(&client, "head -c 64M /dev/zero > /home/user/fill").await;
    assert_ne!(code, 0, "64 MiB written under a 32 MiB limit");
    assert_ne!(
        agent_sh(&client, "head -c 1M /dev/zero > /home/user/more")
            .await
            .0,
        0,
        "not full"
    );

    let snapshot = snapshot_id("sn-full");
    backend
        .snapshot_sandbox(&handle, &snapshot)
        .expect("snapshot at the disk limit");
    drop(client);
    let handle = backend
        .rollback_sandbox(handle, &snapshot)
        .expect("rollback at the disk limit");
    let client = connect(&handle).await;
    assert_eq!(ok(&client, "cat /home/user/keep").await, "keep\n");
    let usage = backend.sandbox_usage(&handle).expect("usage");
    assert_eq!(
        usage.disk_limit_bytes,
        Some(32 * MIB),
        "the disk limit is re-applied"
    );
    // The restored bytes stay charged to the subvolume that wrote them: the rolled-back sandbox
    // starts with its whole allowance, and the limit still holds.
    ok(
        &client,
        "rm /home/user/fill && head -c 8M /dev/zero > /home/user/again",
    )
    .await;
    let (code, _) = agent_sh(&client, "head -c 64M /dev/zero > /home/user/fill2").await;
    assert_ne!(code, 0, "the disk limit no longer holds after a rollback");

    drop(client);
    backend.destroy_sandbox(handle).expect("destroy");
    assert!(backend.delete_snapshot(&snapshot).expect("delete"));
    assert_all_clean(&env);
}
