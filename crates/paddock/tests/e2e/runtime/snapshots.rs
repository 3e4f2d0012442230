//! Snapshots, forks, rollback and pause of real sandboxes, driving the native backend directly: a
//! snapshot taken while a process writes holds a consistent prefix of what it wrote; a rollback
//! restores the file system exactly and restarts the sandbox under the same id and limits; forks
//! never see each other's writes; a paused sandbox uses no CPU; snapshots are measured, listed and
//! deleted, never garbage-collected, and removed with the pool. Every test ends by checking that no
//! sandbox, snapshot, cgroup or process is left.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_protocol::{CommandSpec, SpawnRequest, Stream};
use paddock_runtime::agent_client::{AgentClient, ProcessEvent};
use paddock_runtime::native::{IdRange, NativeBackend, NativeConfig};
use paddock_runtime::{Backend, RuntimeError, SandboxHandle};
use paddock_types::{ByteSize, RootfsSpec, SandboxId, SandboxSpec, SnapshotId, VolumeSource};

use crate::support::{
    agent_bin, assert_code, connect, host_spec, paddock_bin, skip, wait_until, GcOnDrop, TestEnv, ID_BASE,
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

fn request(script: &str, user: Option<&str>, detached: bool) -> SpawnRequest {
    SpawnRequest {
        command: CommandSpec::Shell {
            script: script.to_owned(),
        },
        env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        cwd: None,
        user: user.map(str::to_owned),
        stdin: false,
        pty: None,
        timeout_ms: if detached { None } else { Some(60_000) },
        tag: None,
        detached,
    }
}

/// What a shell script (run as `user`, the sandbox's default when `None`) printed, and its exit code.
async fn sh_as(client: &AgentClient, user: Option<&str>, script: &str) -> (i32, String) {
    let (_pid, mut events) = client.spawn(request(script, user, false)).await.expect("spawn");
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(60), events.recv())
            .await
            .expect("the script ends in time");
        match event {
            Some(ProcessEvent::Output { stream, data, .. }) => match stream {
                Stream::Stderr => stderr.extend(data),
                _ => stdout.extend(data),
            },
            Some(ProcessEvent::Exited(status)) => {
                let out = String::from_utf8_lossy(&stdout).into_owned();
                if status.shell_code() != 0 {
                    eprintln!("{script}: {}", String::from_utf8_lossy(&stderr));
                }
                return (status.shell_code(), out);
            }
            None => panic!("events ended without an exit"),
        }
    }
}

async fn sh(client: &AgentClient, script: &str) -> (i32, String) {
    sh_as(client, None, script).await
}

/// Runs `script`, which must succeed, and returns its output.
async fn ok(client: &AgentClient, script: &str) -> String {
    let (code, out) = sh(client, script).await;
    assert_eq!(code, 0, "{script}: {out}");
    out
}

/// Starts `script` in the background (nobody follows its output).
async fn background(client: &AgentClient, script: &str) {
    client
        .spawn(request(script, None, true))
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
    let root = pool(env).join("sandboxes").join(id);
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
    let handle = backend.create_sandbox(&spec("sb-writer")).await.expect("create");
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
            std::fs::read_to_string(pool(&env).join("sandboxes/sb-writer/home/user/log"))
                .is_ok_and(|t| lines(&t) > 1000)
        }),
        "the writer never got going"
    );

    let mut taken = Vec::new();
    for n in 0..20 {
        let snapshot = snapshot_id(&format!("sn-writer-{n}"));
        let watch = FreezeWatch::start(&env, "sb-writer");
        let started = Instant::now();
        backend
            .snapshot_sandbox(&handle, &snapshot)
            .await
            .expect("snapshot");
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
            &std::fs::read_to_string(pool(&env).join("sandboxes/sb-writer/home/user/log"))
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
        .await
        .expect_err("the same snapshot id twice");
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
    assert!(!frozen(&env, "sb-writer"));

    drop(client);
    backend.destroy_sandbox(handle).await.expect("destroy");
    let listed = backend.list_snapshots().expect("list");
    assert_eq!(listed.len(), 20, "{listed:?}");
    for snapshot in listed {
        assert!(backend.delete_snapshot(&snapshot).await.expect("delete"));
    }
    assert_all_clean(&env);
}

#[tokio::test]
async fn rollback_restores_the_file_system_exactly_and_restarts_the_sandbox() {
    rollback_case(false).await;
}

/// The same through a rollback prepared ahead (`prepare_rollback`: a copy of the sandbox booted on the
/// snapshot, switched to at the rollback).
#[tokio::test]
async fn a_prepared_rollback_restores_exactly_the_same_and_leaves_nothing_behind() {
    rollback_case(true).await;
}

async fn rollback_case(prepared: bool) {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let handle = backend.create_sandbox(&spec("sb-roll")).await.expect("create");
    let client = connect(&handle).await;
    ok(
        &client,
        "mkdir -p /home/user/d/sub/deeper && echo original > /home/user/d/file && chmod 640 /home/user/d/file && \
         ln -s file /home/user/d/link && echo doomed > /home/user/d/sub/deeper/doomed && \
         chmod 751 /home/user/d/sub && head -c 300K /dev/urandom > /home/user/d/big && echo owned > /home/user/d/owned",
    )
    .await;
    let (code, out) = sh_as(
        &client,
        Some("root"),
        "echo secret > /root/r && chmod 600 /root/r && echo custom > /etc/custom",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    // Workloads hold no capability (not even root's chown): odd owners and set-id bits come from the
    // host.
    let volume = pool(&env).join("sandboxes/sb-roll");
    let owned = volume.join("home/user/d/owned");
    std::os::unix::fs::chown(&owned, Some(ID_BASE + 1234), Some(ID_BASE + 2345)).expect("chown");
    std::fs::set_permissions(&owned, std::os::unix::fs::PermissionsExt::from_mode(0o4750)).expect("chmod");
    assert_eq!(
        ok(
            &client,
            "stat -c '%u:%g %a' /home/user/d/owned; readlink /home/user/d/link"
        )
        .await,
        "1234:2345 4750\nfile\n"
    );
    let expected = volume_tree(&env, "sb-roll");
    assert!(expected.len() > 20, "{expected:#?}");

    let snapshot = snapshot_id("sn-roll");
    backend
        .snapshot_sandbox(&handle, &snapshot)
        .await
        .expect("snapshot");

    // Change everything: content, modes, owners, the symlink, deletions, new files; and leave a
    // process running.
    ok(
        &client,
        "echo changed > /home/user/d/file && chmod 600 /home/user/d/file && rm /home/user/d/link && \
         echo not-a-link > /home/user/d/link && rm -r /home/user/d/sub && echo new > /home/user/d/new && \
         : > /home/user/d/big && chmod 700 /home/user/d",
    )
    .await;
    let (code, out) = sh_as(
        &client,
        Some("root"),
        "rm /root/r && echo other > /etc/custom && echo new > /etc/new",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    std::os::unix::fs::chown(&owned, Some(ID_BASE), Some(ID_BASE)).expect("chown");
    std::fs::set_permissions(&owned, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
    assert_ne!(volume_tree(&env, "sb-roll"), expected);
    background(&client, "exec sleep 1000").await;
    let old_init = handle.init_pid();
    let old_processes: Vec<i32> = env.processes().into_iter().map(|(pid, _)| pid).collect();
    assert!(old_processes.len() >= 2, "{old_processes:?}");

    let next = run_dir(&env, "sb-roll.next");
    if prepared {
        backend
            .prepare_rollback(&handle, &snapshot)
            .await
            .expect("prepare the rollback");
        assert!(next.join("agent.sock").exists(), "a prepared sandbox runs");
        assert!(pool(&env).join("sandboxes/sb-roll.next").is_dir());
    }
    let started = Instant::now();
    let handle = backend
        .rollback_sandbox(handle, &snapshot)
        .await
        .expect("rollback");
    assert!(!next.exists(), "the prepared sandbox became the sandbox");
    assert!(!pool(&env).join("sandboxes/sb-roll.next").exists());
    eprintln!("rollback took {:?}", started.elapsed());
    assert_eq!(handle.id().as_str(), "sb-roll");
    assert_ne!(handle.init_pid(), old_init);
    let record = std::fs::read_to_string(run_dir(&env, "sb-roll").join("init.pid")).expect("init.pid");
    assert!(record.starts_with(&format!("{} ", handle.init_pid())), "{record}");
    for pid in &old_processes {
        assert!(process_gone(*pid), "process {pid} survived the rollback");
    }
    // The old agent's connection is gone; a new one works at once.
    assert!(client.spawn(request("true", None, false)).await.is_err());
    assert_eq!(
        volume_tree(&env, "sb-roll"),
        expected,
        "the file system differs from the snapshot"
    );
    // And the new sandbox sees it.
    let client = connect(&handle).await;
    assert_eq!(
        ok(
            &client,
            "cat /home/user/d/file /home/user/d/sub/deeper/doomed; readlink /home/user/d/link; \
             stat -c '%u:%g %a' /home/user/d/owned"
        )
        .await,
        "original\ndoomed\nfile\n1234:2345 4750\n"
    );
    assert_eq!(
        sh_as(&client, Some("root"), "cat /root/r /etc/custom").await,
        (0, "secret\ncustom\n".to_owned())
    );
    let (code, out) = sh(&client, "test ! -e /home/user/d/new && test ! -e /etc/new").await;
    assert_eq!(code, 0, "files created after the snapshot survived: {out}");
    assert_eq!(ok(&client, "hostname").await.trim(), "sb-roll");
    // Same limits: pids (64) and disk.
    let forked: u32 = ok(&client, &format!("{FORK_SCRIPT}100"))
        .await
        .trim()
        .parse()
        .expect("count");
    assert!(
        (10..64).contains(&forked),
        "{forked} forks under a pids limit of 64"
    );
    let usage = backend.sandbox_usage(&handle).await.expect("usage");
    assert_eq!(usage.disk_limit_bytes, Some(2 << 30));

    // The snapshot is intact: rolling back again, after more changes, gives the same tree.
    ok(&client, "rm -rf /home/user/d").await;
    if prepared {
        backend
            .prepare_rollback(&handle, &snapshot)
            .await
            .expect("prepare the rollback again");
    }
    let handle = backend
        .rollback_sandbox(handle, &snapshot)
        .await
        .expect("second rollback");
    assert_eq!(volume_tree(&env, "sb-roll"), expected);
    let client = connect(&handle).await;
    assert_eq!(ok(&client, "cat /home/user/d/file").await, "original\n");

    // A preparation that fails once its run directory is staged leaves no staging directory (here
    // the way is blocked by a file where `<id>.next` goes); one that finds a staging directory a
    // crash left (`run/.new-<id>.next`, empty: the crash came before its lock file) takes it over.
    if prepared {
        let run = env.state().join("run");
        let staged = |run: &Path| -> Vec<String> {
            names(run)
                .into_iter()
                .filter(|n| n.starts_with(".new-"))
                .collect()
        };
        std::fs::write(&next, "in the way").expect("a file where the run dir goes");
        backend
            .prepare_rollback(&handle, &snapshot)
            .await
            .expect_err("the way is blocked");
        assert_eq!(
            staged(&run),
            Vec::<String>::new(),
            "a failed preparation left its staging directory behind"
        );
        std::fs::remove_file(&next).expect("clear the way");
        std::fs::create_dir(run.join(".new-sb-roll.next")).expect("a crash's leftover");
        backend
            .prepare_rollback(&handle, &snapshot)
            .await
            .expect("prepare over a crash's staging directory");
        assert!(next.join("lock").exists());
        assert_eq!(staged(&run), Vec::<String>::new());
        backend.discard_rollback(&handle).await.expect("discard");
    }
    // A prepared rollback that is discarded leaves nothing behind.
    if prepared {
        backend
            .prepare_rollback(&handle, &snapshot)
            .await
            .expect("prepare");
        assert!(next.exists());
        backend.discard_rollback(&handle).await.expect("discard");
        assert!(!next.exists(), "a discarded preparation is removed");
        assert!(!pool(&env).join("sandboxes/sb-roll.next").exists());
        // And one still prepared when the rollback goes elsewhere is removed with the sandbox.
        backend
            .prepare_rollback(&handle, &snapshot)
            .await
            .expect("prepare");
    }
    // A rollback to a snapshot that does not exist fails, and takes the sandbox with it.
    drop(client);
    let err = backend
        .rollback_sandbox(handle, &snapshot_id("sn-missing"))
        .await
        .expect_err("rollback to a missing snapshot");
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
    assert_gone(&env, "sb-roll");
    assert_gone(&env, "sb-roll.next");

    assert!(backend.delete_snapshot(&snapshot).await.expect("delete"));
    assert_all_clean(&env);
}

#[tokio::test]
async fn forks_never_see_each_others_writes() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = Arc::new(backend(&env));
    let source = backend.create_sandbox(&spec("sb-source")).await.expect("create");
    let source_client = connect(&source).await;
    ok(
        &source_client,
        "echo base > /home/user/base && mkdir /home/user/shared",
    )
    .await;
    let snapshot = snapshot_id("sn-base");
    backend
        .snapshot_sandbox(&source, &snapshot)
        .await
        .expect("snapshot");

    let mut forks = Vec::new();
    for i in 0..3 {
        let id = format!("sb-fork-{i}");
        let handle = backend
            .create_sandbox(&fork_spec(&id, &snapshot))
            .await
            .expect("fork");
        let client = connect(&handle).await;
        assert_eq!(ok(&client, "cat /home/user/base").await, "base\n");
        assert_eq!(
            ok(&client, "hostname; cat /etc/hostname").await,
            format!("{id}\n{id}\n")
        );
        ok(
            &client,
            &format!("echo {i} > /home/user/shared/mine-{i} && echo {i} > /home/user/base"),
        )
        .await;
        forks.push((handle, client));
    }
    ok(
        &source_client,
        "echo source > /home/user/shared/source-after && rm /home/user/base",
    )
    .await;

    for (i, (_, client)) in forks.iter().enumerate() {
        assert_eq!(ok(client, "ls /home/user/shared").await, format!("mine-{i}\n"));
        assert_eq!(ok(client, "cat /home/user/base").await, format!("{i}\n"));
    }
    assert_eq!(
        ok(&source_client, "ls /home/user/shared; ls /home/user").await,
        "source-after\nshared\n"
    );
    let in_snapshot = snapshot_dir(&env, &snapshot).join("home/user");
    assert_eq!(names(&in_snapshot.join("shared")), Vec::<String>::new());
    assert_eq!(
        std::fs::read_to_string(in_snapshot.join("base")).expect("base"),
        "base\n"
    );

    // A fork of a snapshot that does not exist is refused up front, leaving nothing.
    let err = backend
        .create_sandbox(&fork_spec("sb-nowhere", &snapshot_id("sn-missing")))
        .await
        .expect_err("fork of a missing snapshot");
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
    assert_gone(&env, "sb-nowhere");

    // Ten forks of one snapshot at once (as a control plane's fork into N copies does).
    let started = Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let backend = backend.clone();
            let spec = fork_spec(&format!("sb-many-{i}"), &snapshot);
            let runtime = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || runtime.block_on(backend.create_sandbox(&spec)))
        })
        .collect();
    let mut many = Vec::new();
    for task in tasks {
        many.push(task.await.expect("join").expect("concurrent fork"));
    }
    eprintln!("10 concurrent forks of one snapshot took {:?}", started.elapsed());
    for handle in &many {
        let client = connect(handle).await;
        assert_eq!(
            ok(&client, "cat /home/user/base; ls /home/user/shared").await,
            "base\n"
        );
    }

    for handle in many {
        backend.destroy_sandbox(handle).await.expect("destroy");
    }
    drop(source_client);
    backend.destroy_sandbox(source).await.expect("destroy");
    for (handle, client) in forks {
        drop(client);
        backend.destroy_sandbox(handle).await.expect("destroy");
    }
    // The snapshot outlived the sandbox it was taken of.
    assert_eq!(backend.list_snapshots().expect("list"), vec![snapshot.clone()]);
    assert!(backend.delete_snapshot(&snapshot).await.expect("delete"));
    assert_all_clean(&env);
}

/// CPU time the sandbox used over `window`, microseconds.
async fn cpu_burnt(backend: &NativeBackend, handle: &SandboxHandle, window: Duration) -> u64 {
    let before = backend.sandbox_usage(handle).await.expect("usage").cpu_time_us;
    tokio::time::sleep(window).await;
    backend.sandbox_usage(handle).await.expect("usage").cpu_time_us - before
}

/// Whether the sandbox burns 50 ms of CPU within ten seconds (on a busy test machine its loop may get
/// little of a CPU, but never none).
async fn burns_cpu(backend: &NativeBackend, handle: &SandboxHandle) -> bool {
    let before = backend.sandbox_usage(handle).await.expect("usage").cpu_time_us;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now = backend.sandbox_usage(handle).await.expect("usage").cpu_time_us;
        if now - before >= 50_000 {
            return true;
        }
    }
    false
}

#[tokio::test]
async fn a_paused_sandbox_uses_no_cpu_until_resumed() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let handle = backend.create_sandbox(&spec("sb-paused")).await.expect("create");
    let client = connect(&handle).await;
    background(&client, "while :; do :; done").await;
    let window = Duration::from_millis(300);
    assert!(burns_cpu(&backend, &handle).await, "the loop does not burn CPU");

    backend.pause_sandbox(&handle).await.expect("pause");
    assert!(frozen(&env, "sb-paused"));
    let paused = cpu_burnt(&backend, &handle, window).await;
    assert!(paused < 2_000, "{paused} us of CPU while paused");
    backend
        .pause_sandbox(&handle)
        .await
        .expect("pausing twice is fine");

    // A snapshot of a paused sandbox leaves it paused.
    let snapshot = snapshot_id("sn-paused");
    backend
        .snapshot_sandbox(&handle, &snapshot)
        .await
        .expect("snapshot while paused");
    assert!(frozen(&env, "sb-paused"), "the snapshot thawed a paused sandbox");
    assert!(cpu_burnt(&backend, &handle, window).await < 2_000);

    backend.resume_sandbox(&handle).await.expect("resume");
    assert!(!frozen(&env, "sb-paused"));
    assert!(burns_cpu(&backend, &handle).await, "no CPU after resume");
    assert_eq!(ok(&client, "echo alive").await, "alive\n");
    backend
        .resume_sandbox(&handle)
        .await
        .expect("resuming twice is fine");

    // A rollback of a paused sandbox starts it running.
    backend.pause_sandbox(&handle).await.expect("pause");
    drop(client);
    let handle = backend
        .rollback_sandbox(handle, &snapshot)
        .await
        .expect("rollback while paused");
    assert!(!frozen(&env, "sb-paused"));
    let client = connect(&handle).await;
    assert_eq!(ok(&client, "echo alive").await, "alive\n");

    // A paused sandbox can be destroyed.
    background(&client, "exec sleep 1000").await;
    backend.pause_sandbox(&handle).await.expect("pause");
    drop(client);
    backend
        .destroy_sandbox(handle)
        .await
        .expect("destroy while paused");
    assert!(backend.delete_snapshot(&snapshot).await.expect("delete"));
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
    let handle = backend.create_sandbox(&spec("sb-usage")).await.expect("create");
    let client = connect(&handle).await;
    ok(
        &client,
        "head -c 8M /dev/urandom > /home/user/big && mkdir /home/user/more",
    )
    .await;
    let first = snapshot_id("sn-first");
    let second = snapshot_id("sn-second");
    backend.snapshot_sandbox(&handle, &first).await.expect("snapshot");
    sync_pool(&env);
    let fresh = backend.snapshot_usage(&first).await.expect("usage");
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
    let diverged = backend.snapshot_usage(&first).await.expect("usage");
    assert!(diverged.exclusive_bytes >= 8 * MIB, "{fresh:?} -> {diverged:?}");
    assert_eq!(diverged.referenced_bytes, fresh.referenced_bytes);
    backend
        .snapshot_sandbox(&handle, &second)
        .await
        .expect("snapshot");
    assert_eq!(
        backend.list_snapshots().expect("list"),
        vec![first.clone(), second.clone()]
    );

    let json = serde_json::to_value(diverged).expect("serialize");
    assert!(json.get("exclusive_bytes").is_some(), "{json}");

    assert!(backend.delete_snapshot(&first).await.expect("delete"));
    assert!(!snapshot_dir(&env, &first).exists());
    assert!(!backend.delete_snapshot(&first).await.expect("delete again"));
    assert_eq!(backend.list_snapshots().expect("list"), vec![second.clone()]);
    let err = backend
        .snapshot_usage(&first)
        .await
        .expect_err("usage of a deleted snapshot");
    assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");

    // Garbage collection reclaims sandboxes, never snapshots: not with the sandbox alive, not after
    // it is gone.
    assert!(backend.collect_garbage().await.expect("gc").is_empty());
    drop(client);
    backend.destroy_sandbox(handle).await.expect("destroy");
    assert!(backend.collect_garbage().await.expect("gc").is_empty());
    let out = env.cmd().arg("gc").output().expect("paddock gc");
    assert_code(&out, 0);
    assert_eq!(backend.list_snapshots().expect("list"), vec![second.clone()]);
    assert!(
        backend
            .snapshot_usage(&second)
            .await
            .expect("usage")
            .referenced_bytes
            >= 4 * MIB
    );

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
    let handle = backend.create_sandbox(&full).await.expect("create");
    let client = connect(&handle).await;
    ok(&client, "echo keep > /home/user/keep").await;
    let (code, _) = sh(&client, "head -c 64M /dev/zero > /home/user/fill").await;
    assert_ne!(code, 0, "64 MiB written under a 32 MiB limit");
    assert_ne!(
        sh(&client, "head -c 1M /dev/zero > /home/user/more").await.0,
        0,
        "not full"
    );

    let snapshot = snapshot_id("sn-full");
    backend
        .snapshot_sandbox(&handle, &snapshot)
        .await
        .expect("snapshot at the disk limit");
    drop(client);
    let handle = backend
        .rollback_sandbox(handle, &snapshot)
        .await
        .expect("rollback at the disk limit");
    let client = connect(&handle).await;
    assert_eq!(ok(&client, "cat /home/user/keep").await, "keep\n");
    let usage = backend.sandbox_usage(&handle).await.expect("usage");
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
    let (code, _) = sh(&client, "head -c 64M /dev/zero > /home/user/fill2").await;
    assert_ne!(code, 0, "the disk limit no longer holds after a rollback");

    drop(client);
    backend.destroy_sandbox(handle).await.expect("destroy");
    assert!(backend.delete_snapshot(&snapshot).await.expect("delete"));
    assert_all_clean(&env);
}

/// Set (to `<state dir>\n<cgroup parent>\n<id>`) when this binary runs as the process that creates a
/// sandbox and exits, as a restarted server's predecessor would.
const CREATOR_ENV: &str = "PADDOCK_TEST_SNAPSHOTS_CREATOR";

/// Not a test of its own: the body of the creating process (a no-op unless [`CREATOR_ENV`] is set).
#[tokio::test]
async fn helper_creates_a_sandbox_then_exits() {
    let Ok(job) = std::env::var(CREATOR_ENV) else {
        return;
    };
    let mut lines = job.lines();
    let (state, parent, id) = (
        lines.next().expect("state"),
        lines.next().expect("parent"),
        lines.next().expect("id"),
    );
    let backend = NativeBackend::open(NativeConfig {
        state_dir: state.into(),
        pool_size: "8G".parse().expect("size"),
        ids: IdRange::DEFAULT,
        agent_binary: agent_bin(),
        setup_binary: paddock_bin(),
        cgroup_parent: parent.to_owned(),
        die_with_parent: false,
        network_subnet: Default::default(),
    })
    .expect("open the native backend");
    let handle = backend.create_sandbox(&spec(id)).await.expect("create");
    let client = connect(&handle).await;
    ok(&client, "echo from-the-first-owner > /home/user/first").await;
    // Exit without tearing down: the lock goes with this process, the sandbox stays.
    std::mem::forget(handle);
}

/// Creates sandbox `id` in another process, which exits before this returns.
fn create_elsewhere(env: &TestEnv, id: &str) {
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "runtime::snapshots::helper_creates_a_sandbox_then_exits",
            "--exact",
            "--nocapture",
        ])
        .env(
            CREATOR_ENV,
            format!("{}\n{}\n{id}", env.state().display(), env.cgroup_parent),
        )
        .output()
        .expect("run the creating process");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "creating process failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn an_adopted_sandbox_stays_paused_and_can_be_rolled_back() {
    if !require_freezer() {
        return;
    }
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    create_elsewhere(&env, "sb-adopted");
    // Paused when its owner went away (as `pause_sandbox` leaves it).
    std::fs::write(unified_cgroup(&env, "sb-adopted").join("cgroup.freeze"), "1").expect("freeze");
    let backend = backend(&env);
    let handle = match backend
        .adopt_sandbox(&sandbox_id("sb-adopted"))
        .await
        .expect("adopt")
    {
        paddock_runtime::Adoption::Alive(handle) => handle,
        other => panic!("a paused sandbox was not adopted: {other:?}"),
    };
    assert!(frozen(&env, "sb-adopted"), "adoption resumed a paused sandbox");
    backend.resume_sandbox(&handle).await.expect("resume");
    let client = connect(&handle).await;
    assert_eq!(
        ok(&client, "cat /home/user/first").await,
        "from-the-first-owner\n"
    );

    // Its rollback restarts it from what its first owner recorded (root file system, user, mounts).
    let snapshot = snapshot_id("sn-adopted");
    backend
        .snapshot_sandbox(&handle, &snapshot)
        .await
        .expect("snapshot");
    ok(&client, "rm /home/user/first").await;
    let old_init = handle.init_pid();
    drop(client);
    let handle = backend
        .rollback_sandbox(handle, &snapshot)
        .await
        .expect("rollback of an adopted sandbox");
    assert!(wait_until(Duration::from_secs(10), || process_gone(old_init)));
    let client = connect(&handle).await;
    assert_eq!(
        ok(&client, "cat /home/user/first; id -un").await,
        "from-the-first-owner\nuser\n"
    );

    drop(client);
    backend.destroy_sandbox(handle).await.expect("destroy");
    assert!(backend.delete_snapshot(&snapshot).await.expect("delete"));
    // The first init, orphaned by its creator, is reaped by the host's init in its own time.
    assert!(
        wait_until(Duration::from_secs(30), || env.processes().is_empty()),
        "processes left: {:?}",
        env.processes()
    );
    assert_all_clean(&env);
}

/// Not a check: timings of snapshot, rollback and forks on a sandbox holding 1 GB in 10,000 files.
/// Run with `PADDOCK_LOG=debug cargo nextest run -p paddock --test runtime_snapshots --run-ignored only
/// --no-capture`.
#[tokio::test]
#[ignore = "a measurement (writes 1 GB), run by hand"]
async fn measure_snapshot_rollback_and_fork_times() {
    if !require_freezer() {
        return;
    }
    // PADDOCK_LOG=debug shows each step's time.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("PADDOCK_LOG"))
        .with_writer(std::io::stderr)
        .try_init();
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = Arc::new(backend(&env));
    let handle = backend.create_sandbox(&spec("sb-big")).await.expect("create");
    let client = connect(&handle).await;
    // 100 directories of 100 files of 100 KiB, each with bytes of its own.
    ok(
        &client,
        "mkdir -p /home/user/data && cd /home/user/data && for d in $(seq 0 99); do mkdir $d; \
         for f in $(seq 0 99); do head -c 100K /dev/urandom > $d/$f; done; done",
    )
    .await;
    sync_pool(&env);
    let p50 = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };

    let mut snapshots = Vec::new();
    for i in 0..21 {
        let snapshot = snapshot_id(&format!("sn-idle-{i}"));
        let t = Instant::now();
        backend
            .snapshot_sandbox(&handle, &snapshot)
            .await
            .expect("snapshot");
        snapshots.push(t.elapsed());
    }
    eprintln!(
        "snapshot, idle 1 GB / 10k files: p50 {:?}, all {snapshots:?}",
        p50(snapshots.clone())
    );

    let mut busy = Vec::new();
    for i in 0..21 {
        ok(
            &client,
            &format!("echo {i} >> /home/user/data/0/0 && head -c 1M /dev/urandom > /home/user/step"),
        )
        .await;
        let snapshot = snapshot_id(&format!("sn-busy-{i}"));
        let t = Instant::now();
        backend
            .snapshot_sandbox(&handle, &snapshot)
            .await
            .expect("snapshot");
        busy.push(t.elapsed());
    }
    eprintln!(
        "snapshot after small writes (1 MB dirty): p50 {:?}, all {busy:?}",
        p50(busy.clone())
    );

    let target = snapshot_id("sn-idle-0");
    let t = Instant::now();
    let usage = backend.snapshot_usage(&target).await.expect("usage");
    eprintln!("snapshot_usage of 10k files: {:?} ({usage:?})", t.elapsed());

    drop(client);
    let mut handle = handle;
    let mut rollbacks = Vec::new();
    for _ in 0..11 {
        let t = Instant::now();
        handle = backend.rollback_sandbox(handle, &target).await.expect("rollback");
        rollbacks.push(t.elapsed());
    }
    eprintln!(
        "rollback, 1 GB / 10k files: p50 {:?}, all {rollbacks:?}",
        p50(rollbacks.clone())
    );
    let client = connect(&handle).await;
    assert_eq!(ok(&client, "ls /home/user/data | wc -l").await.trim(), "100");
    drop(client);

    let mut sequential = Vec::new();
    let mut forks = Vec::new();
    for i in 0..10 {
        let t = Instant::now();
        forks.push(
            backend
                .create_sandbox(&fork_spec(&format!("sb-seq-{i}"), &target))
                .await
                .expect("fork"),
        );
        sequential.push(t.elapsed());
    }
    eprintln!(
        "10 sequential forks: total {:?}, p50 {:?}",
        sequential.iter().sum::<Duration>(),
        p50(sequential.clone())
    );
    let t = Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let backend = backend.clone();
            let spec = fork_spec(&format!("sb-par-{i}"), &target);
            let runtime = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || runtime.block_on(backend.create_sandbox(&spec)))
        })
        .collect();
    for task in tasks {
        forks.push(task.await.expect("join").expect("fork"));
    }
    eprintln!("10 concurrent forks: total {:?}", t.elapsed());

    for fork in forks {
        backend.destroy_sandbox(fork).await.expect("destroy");
    }
    backend.destroy_sandbox(handle).await.expect("destroy");
    for snapshot in backend.list_snapshots().expect("list") {
        backend.delete_snapshot(&snapshot).await.expect("delete");
    }
    assert_all_clean(&env);
}

/// A sandbox's files travel in snapshots. One that turned its `/etc/resolv.conf` into a symlink to a
/// host path must not get that host file mounted into a sandbox created from its snapshot on a
/// `--rootfs` template (whose generated `/etc` files are bound from the volume by path; `passwd`,
/// `group`, `hosts` and `hostname` are rewritten for the new sandbox, `resolv.conf` is not).
#[tokio::test]
async fn a_symlink_in_a_snapshot_never_binds_a_host_file() {
    if !require_freezer() {
        return;
    }
    let busybox = std::path::Path::new("/bin/busybox");
    assert!(
        busybox.exists(),
        "this test needs busybox-static (/bin/busybox); scripts/test.sh installs it"
    );
    let env = TestEnv::new();
    let _gc = GcOnDrop(&env);
    let backend = backend(&env);
    let secret_dir = tempfile::Builder::new()
        .prefix("paddock-secret-")
        .tempdir_in("/var/tmp")
        .expect("secret dir");
    std::fs::set_permissions(
        secret_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let secret = secret_dir.path().join("host-secret");
    std::fs::write(&secret, "host-only\n").expect("secret");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");

    let handle = backend.create_sandbox(&spec("sb-evil")).await.expect("create");
    let client = connect(&handle).await;
    let (code, out) = sh_as(
        &client,
        Some("root"),
        &format!(
            "ln -sf {} /etc/resolv.conf && ls -l /etc/resolv.conf",
            secret.display()
        ),
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let snapshot = snapshot_id("sn-evil");
    backend
        .snapshot_sandbox(&handle, &snapshot)
        .await
        .expect("snapshot");
    drop(client);
    backend.destroy_sandbox(handle).await.expect("destroy");

    let rootfs = tempfile::Builder::new()
        .prefix("paddock-rootfs-")
        .tempdir_in("/var/tmp")
        .expect("rootfs");
    std::fs::set_permissions(rootfs.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let bin = rootfs.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    std::fs::create_dir_all(rootfs.path().join("etc")).expect("etc");
    std::fs::copy(busybox, bin.join("busybox")).expect("copy busybox");
    for applet in ["sh", "cat"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("symlink");
    }
    std::fs::write(
        rootfs.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\n",
    )
    .expect("passwd");
    std::fs::write(rootfs.path().join("etc/resolv.conf"), "nameserver 127.0.0.1\n").expect("resolv.conf");
    let custom = SandboxSpec {
        rootfs: RootfsSpec::Dir {
            path: rootfs.path().to_owned(),
        },
        ..fork_spec("sb-victim", &snapshot)
    };
    match backend.create_sandbox(&custom).await {
        Err(e) => assert!(e.to_string().contains("not a regular file"), "{e}"),
        Ok(handle) => {
            let client = connect(&handle).await;
            let (_, out) = sh(&client, "cat /etc/resolv.conf").await;
            drop(client);
            backend.destroy_sandbox(handle).await.expect("destroy");
            panic!("a sandbox was created on a symlinked /etc/resolv.conf; it reads: {out}");
        }
    }
    assert_gone(&env, "sb-victim");
    assert!(backend.delete_snapshot(&snapshot).await.expect("delete"));
    assert_all_clean(&env);
}
