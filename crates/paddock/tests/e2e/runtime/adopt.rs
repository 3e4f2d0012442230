//! The runtime calls `paddock serve` builds on, against real sandboxes: adopting sandboxes an earlier
//! process created (alive, dead, missing, owned by someone else, or with a pid that now names another
//! process), usage counters, live limit changes, reclaiming by id, and directory watches inside a
//! real sandbox. The sandboxes to adopt are created by a separate process that then exits, as a
//! restarted server's would be: this test binary run again on [`helper_creates_sandboxes_then_exits`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use paddock_protocol::FsEventKind;
use paddock_runtime::agent_client::{AgentClient, WatchUpdate};
use paddock_runtime::native::NativeBackend;
use paddock_runtime::{Adoption, RuntimeError, SandboxBackend, SandboxHandle};
use paddock_types::{ByteSize, CpuQuota, Limits, RootfsSpec, SandboxId, SandboxSpec};

use crate::support::{agent_sh, native_config, test_name, wait_until, TestEnv};

/// Set (to `<state dir>\n<cgroup parent>\n<id>,<id>...`) when this binary runs as the creating
/// process.
const CREATOR_ENV: &str = "PADDOCK_TEST_ADOPT_CREATOR";
const MIB: u64 = 1 << 20;

fn backend(state: &Path, cgroup_parent: &str) -> NativeBackend {
    NativeBackend::open(native_config(state, cgroup_parent)).expect("open the native backend")
}

fn spec(id: &str) -> SandboxSpec {
    SandboxSpec {
        id: id.parse().expect("sandbox id"),
        limits: Limits {
            memory: Some(ByteSize::gib(1)),
            cpus: None,
            pids: Some(256),
            disk: Some(ByteSize::gib(2)),
        },
        rootfs: RootfsSpec::Host,
        mounts: Vec::new(),
        workdir: None,
        user: "user".parse().expect("user"),
        env: Vec::new(),
        volume: paddock_types::VolumeSource::Template,
        volumes: Vec::new(),
        network: None,
    }
}

fn id(s: &str) -> SandboxId {
    s.parse().expect("sandbox id")
}

/// Not a test of its own: the body of the creating process (a no-op unless [`CREATOR_ENV`] is set).
/// It raises its own open-file limit first, as a server does, which sandboxes must not inherit.
#[tokio::test]
async fn helper_creates_sandboxes_then_exits() {
    let Ok(job) = std::env::var(CREATOR_ENV) else {
        return;
    };
    let mut lines = job.lines();
    let (state, parent, ids) = (
        lines.next().expect("state"),
        lines.next().expect("parent"),
        lines.next().expect("ids"),
    );
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let hard = getrlimit(Resource::Nofile).maximum;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: hard,
            maximum: hard,
        },
    )
    .expect("raise the open-file limit");
    let backend = backend(Path::new(state), parent);
    for id in ids.split(',') {
        let handle = backend.create_sandbox(&spec(id)).expect("create");
        // Exit without tearing down: the lock goes with this process, the sandbox stays.
        std::mem::forget(handle);
    }
}

/// Creates sandboxes `ids` in another process, which exits (releasing their locks) before this
/// returns.
fn create_elsewhere(env: &TestEnv, ids: &[&str]) {
    let exe = std::env::current_exe().expect("test binary");
    let job = format!(
        "{}\n{}\n{}",
        env.state().display(),
        env.cgroup_parent,
        ids.join(",")
    );
    let out = Command::new(exe)
        .args([
            &test_name(module_path!(), "helper_creates_sandboxes_then_exits"),
            "--exact",
            "--nocapture",
        ])
        .env(CREATOR_ENV, job)
        .output()
        .expect("run the creating process");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "creating process failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn alive(adoption: Adoption) -> SandboxHandle {
    match adoption {
        Adoption::Alive(handle) => handle,
        other => panic!("expected a live sandbox, got {other:?}"),
    }
}

fn run_dir(env: &TestEnv, id: &str) -> PathBuf {
    env.state().join("run").join(id)
}

/// Nothing of sandbox `id` exists: run directory, cgroups, subvolume.
fn assert_gone(env: &TestEnv, id: &str) {
    assert!(!run_dir(env, id).exists(), "run dir of {id} left");
    assert!(
        !env.state().join("pool/sandboxes").join(id).exists(),
        "subvolume of {id} left"
    );
    assert!(!env.cgroup_ids().iter().any(|c| c == id), "cgroups of {id} left");
}

fn init_record(env: &TestEnv, id: &str) -> (i32, u64) {
    let text = std::fs::read_to_string(run_dir(env, id).join("init.pid")).expect("init.pid");
    let mut fields = text.split_whitespace();
    let pid = fields.next().and_then(|f| f.parse().ok()).expect("pid");
    let start = fields.next().and_then(|f| f.parse().ok()).expect("start time");
    (pid, start)
}

fn start_time(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(')').expect("comm");
    rest.split_whitespace()
        .nth(19)
        .and_then(|f| f.parse().ok())
        .expect("start time")
}

fn process_gone(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    matches!(state, None | Some("Z") | Some("X"))
}

/// Forks up to `count` waiting processes in the sandbox, prints how many forks succeeded, and ends
/// them.
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

async fn forks(client: &AgentClient, count: u32) -> u32 {
    let (code, out) = agent_sh(client, &format!("{FORK_SCRIPT}{count}")).await;
    assert_eq!(code, 0, "{out}");
    out.trim().parse().expect("fork count")
}

/// The sandbox's CFS quota, from its cgroup (v1 or v2).
fn cpu_quota(env: &TestEnv, id: &str) -> String {
    let v1 = Path::new("/sys/fs/cgroup/cpu")
        .join(&env.cgroup_parent)
        .join(id)
        .join("cpu.cfs_quota_us");
    let v2 = Path::new("/sys/fs/cgroup")
        .join(&env.cgroup_parent)
        .join(id)
        .join("cpu.max");
    std::fs::read_to_string(&v1)
        .or_else(|_| std::fs::read_to_string(&v2))
        .expect("cpu quota file")
        .trim()
        .to_owned()
}

#[tokio::test]
async fn adopted_sandbox_reports_usage_takes_new_limits_and_is_destroyed() {
    let env = TestEnv::new();
    create_elsewhere(&env, &["sb-kept", "sb-abandoned"]);
    let backend = backend(env.state(), &env.cgroup_parent);
    let handle = alive(backend.adopt_sandbox(&id("sb-kept")).expect("adopt"));
    assert_eq!(handle.id().as_str(), "sb-kept");
    assert_eq!(
        init_record(&env, "sb-kept").0,
        handle.init_pid().expect("a native init")
    );

    // While this process holds it, another one (here: another backend) cannot take it.
    let other = backend_with_same_state(&env);
    assert!(matches!(
        other.adopt_sandbox(&id("sb-kept")).expect("adopt"),
        Adoption::Busy
    ));
    assert!(!other.reclaim_sandbox(&id("sb-kept")).expect("reclaim"));

    // Garbage collection takes the sandbox nobody adopted and leaves the adopted one alone.
    let reclaimed = backend.collect_garbage().expect("gc");
    assert_eq!(reclaimed, vec!["sb-abandoned".to_owned()]);
    assert_gone(&env, "sb-abandoned");

    let client = AgentClient::connect(&handle.agent_socket).await.expect("connect");

    // Neither the creator's raised open-file limit nor its signal state reached the sandbox.
    let (code, out) = agent_sh(
        &client,
        "ulimit -Sn; grep 'Max open files' /proc/1/limits; grep -E '^Sig(Ign|Blk)' /proc/self/status",
    )
    .await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "1024", "{out}");
    let agent_limits: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(agent_limits[3], "1024", "agent soft limit: {out}");
    let agent_hard: u64 = agent_limits[4].parse().expect("hard limit");
    assert!(agent_hard <= 524_288, "{out}");
    assert!(
        lines[2..].iter().all(|l| l.ends_with("0000000000000000")),
        "a workload starts with no ignored or blocked signal: {out}"
    );

    // Usage moves: memory (a 48 MiB file in /dev/shm is charged to the sandbox), disk, CPU.
    let before = backend.sandbox_usage(&handle).expect("usage");
    assert_eq!(before.disk_limit_bytes, Some(2 << 30));
    assert!(before.pids >= 1, "{before:?}");
    let (code, _) = agent_sh(
        &client,
        "head -c 48M /dev/zero > /dev/shm/blob && head -c 16M /dev/urandom > /home/user/data && \
         i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done",
    )
    .await;
    assert_eq!(code, 0);
    // Disk usage is counted at the pool's transaction commits: force one.
    paddock_sys::btrfs::sync(&env.state().join("pool")).expect("btrfs sync");
    let after = backend.sandbox_usage(&handle).expect("usage");
    assert!(
        after.memory_bytes >= before.memory_bytes + 40 * MIB,
        "memory: {before:?} -> {after:?}"
    );
    assert!(after.memory_peak_bytes >= after.memory_bytes, "{after:?}");
    assert!(
        after.disk_bytes >= before.disk_bytes + 15 * MIB,
        "disk: {before:?} -> {after:?}"
    );
    assert!(
        after.cpu_time_us > before.cpu_time_us + 10_000,
        "cpu: {before:?} -> {after:?}"
    );
    let json = serde_json::to_value(after).expect("usage serializes");
    assert!(json.get("disk_limit_bytes").is_some(), "{json}");

    // Limits change while it runs, both ways.
    let mut limits = spec("sb-kept").limits;
    limits.pids = Some(8);
    limits.cpus = Some(CpuQuota::try_from(0.5).expect("quota"));
    limits.disk = Some(ByteSize::gib(1));
    backend.update_limits(&handle, &limits).expect("lower limits");
    let forked = forks(&client, 30).await;
    assert!(forked < 8, "{forked} forks under pids 8");
    assert!(
        ["50000", "50000 100000"].contains(&cpu_quota(&env, "sb-kept").as_str()),
        "{}",
        cpu_quota(&env, "sb-kept")
    );
    assert_eq!(
        backend.sandbox_usage(&handle).expect("usage").disk_limit_bytes,
        Some(1 << 30)
    );
    limits.pids = Some(256);
    limits.disk = None;
    limits.cpus = None;
    backend.update_limits(&handle, &limits).expect("raise limits");
    assert_eq!(forks(&client, 30).await, 30, "pids limit raised again");
    assert!(
        ["-1", "max 100000"].contains(&cpu_quota(&env, "sb-kept").as_str()),
        "{}",
        cpu_quota(&env, "sb-kept")
    );
    assert_eq!(
        backend.sandbox_usage(&handle).expect("usage").disk_limit_bytes,
        None
    );
    // Memory cannot go below what the sandbox holds (the /dev/shm file cannot be reclaimed): a clear
    // error on cgroup v1, where the kernel refuses; v2 would OOM-kill inside instead.
    if Path::new("/sys/fs/cgroup/memory/tasks").exists() {
        limits.memory = Some(ByteSize::mib(8));
        let err = backend
            .update_limits(&handle, &limits)
            .expect_err("memory below usage");
        assert!(matches!(err, RuntimeError::InvalidSpec(_)), "{err:?}");
        assert!(err.to_string().contains("memory"), "{err}");
    }

    // Directory watches work inside a real sandbox (seccomp, Landlock, its own /proc).
    let (_watch, mut updates) = client.watch("/home/user", true).await.expect("watch");
    let (code, _) = agent_sh(&client, "mkdir -p /home/user/w/x && echo hi > /home/user/w/x/f").await;
    assert_eq!(code, 0);
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|e: &paddock_protocol::FsEvent| e.path == "/home/user/w/x/f" && e.kind == FsEventKind::Create)
    {
        match tokio::time::timeout(Duration::from_secs(10), updates.recv()).await {
            Ok(Some(WatchUpdate::Events(events))) => seen.extend(events),
            other => panic!("no create event for the new file: {other:?}; seen {seen:#?}"),
        }
    }
    drop(updates);
    drop(client);

    // An adopted sandbox (whose init is not this process's child) is torn down completely.
    let init = handle.init_pid().expect("a native init");
    backend.destroy_sandbox(handle).expect("destroy");
    assert!(process_gone(init), "init {init} survived");
    assert_gone(&env, "sb-kept");
    assert_clean_after_reaping(&env);
}

/// Asserts nothing of this environment is left, after the host's PID 1 has reaped the sandbox inits
/// orphaned by the creating process: those may linger briefly as zombies (this machine's PID 1 reaps
/// about every two seconds), which still name their cgroup in `/proc/<pid>/cgroup`. Anything alive
/// fails at once.
fn assert_clean_after_reaping(env: &TestEnv) {
    let alive: Vec<(i32, String)> = env
        .processes()
        .into_iter()
        .filter(|(pid, _)| !process_gone(*pid))
        .collect();
    assert!(alive.is_empty(), "processes left alive: {alive:?}");
    assert!(
        wait_until(Duration::from_secs(30), || env.processes().is_empty()),
        "zombies never reaped: {:?}",
        env.processes()
    );
    env.assert_clean();
}

fn backend_with_same_state(env: &TestEnv) -> NativeBackend {
    backend(env.state(), &env.cgroup_parent)
}

#[tokio::test]
async fn dead_missing_busy_and_impostor_sandboxes_are_told_apart() {
    let env = TestEnv::new();
    let backend = backend(env.state(), &env.cgroup_parent);

    // Missing: nothing there, nothing done.
    assert!(matches!(
        backend.adopt_sandbox(&id("sb-never")).expect("adopt"),
        Adoption::Missing
    ));
    assert!(!backend.reclaim_sandbox(&id("sb-never")).expect("reclaim"));

    // Busy: this process owns it (through another backend instance).
    let owned = backend.create_sandbox(&spec("sb-owned")).expect("create");
    let other = backend_with_same_state(&env);
    assert!(matches!(
        other.adopt_sandbox(&id("sb-owned")).expect("adopt"),
        Adoption::Busy
    ));
    assert!(!other.reclaim_sandbox(&id("sb-owned")).expect("reclaim"));
    backend.destroy_sandbox(owned).expect("destroy");
    assert_gone(&env, "sb-owned");

    create_elsewhere(
        &env,
        &[
            "sb-killed",
            "sb-impostor",
            "sb-restarted",
            "sb-frozen",
            "sb-reclaimed",
        ],
    );

    // Dead: its init was killed.
    let (init, _) = init_record(&env, "sb-killed");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(init).expect("pid"),
        rustix::process::Signal::KILL,
    )
    .expect("kill init");
    assert!(wait_until(Duration::from_secs(10), || process_gone(init)));
    assert!(matches!(
        backend.adopt_sandbox(&id("sb-killed")).expect("adopt"),
        Adoption::Dead
    ));
    assert_gone(&env, "sb-killed");

    // init.pid naming another live process (the pid was reused): not adopted, and that process is
    // not touched; the real sandbox is reclaimed through its cgroup.
    let mut impostor = Command::new("sleep").arg("60").spawn().expect("sleep");
    let impostor_pid = impostor.id() as i32;
    std::fs::write(
        run_dir(&env, "sb-impostor").join("init.pid"),
        format!("{impostor_pid} {}\n", start_time(impostor_pid)),
    )
    .expect("rewrite init.pid");
    assert!(matches!(
        backend.adopt_sandbox(&id("sb-impostor")).expect("adopt"),
        Adoption::Dead
    ));
    assert!(
        impostor.try_wait().expect("try_wait").is_none(),
        "the unrelated process was killed"
    );
    let _ = impostor.kill();
    let _ = impostor.wait();
    assert_gone(&env, "sb-impostor");

    // The right pid with another start time (the init died and its pid was reused) is not it either.
    let (pid, start) = init_record(&env, "sb-restarted");
    std::fs::write(
        run_dir(&env, "sb-restarted").join("init.pid"),
        format!("{pid} {}\n", start + 1),
    )
    .expect("rewrite init.pid");
    assert!(matches!(
        backend.adopt_sandbox(&id("sb-restarted")).expect("adopt"),
        Adoption::Dead
    ));
    assert!(wait_until(Duration::from_secs(10), || process_gone(pid)));
    assert_gone(&env, "sb-restarted");

    // An init whose agent does not answer (stopped) is dead too, and killed for good.
    let (frozen, _) = init_record(&env, "sb-frozen");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(frozen).expect("pid"),
        rustix::process::Signal::STOP,
    )
    .expect("stop init");
    assert!(matches!(
        backend.adopt_sandbox(&id("sb-frozen")).expect("adopt"),
        Adoption::Dead
    ));
    assert!(wait_until(Duration::from_secs(10), || process_gone(frozen)));
    assert_gone(&env, "sb-frozen");

    // Reclaim by id: once true, then nothing is left to reclaim.
    assert!(backend.reclaim_sandbox(&id("sb-reclaimed")).expect("reclaim"));
    assert_gone(&env, "sb-reclaimed");
    assert!(!backend.reclaim_sandbox(&id("sb-reclaimed")).expect("reclaim"));

    // Leftovers without a run directory (a crash in the middle of a teardown) count as dead.
    create_elsewhere(&env, &["sb-half"]);
    let (half_init, _) = init_record(&env, "sb-half");
    std::fs::remove_dir_all(run_dir(&env, "sb-half")).expect("remove run dir");
    assert!(matches!(
        backend.adopt_sandbox(&id("sb-half")).expect("adopt"),
        Adoption::Dead
    ));
    assert!(wait_until(Duration::from_secs(10), || process_gone(half_init)));
    assert_gone(&env, "sb-half");

    assert_clean_after_reaping(&env);
}

/// A create whose process died between making its staging directory and renaming it into place
/// leaves `run/.new-<id>`. Adopting that id after a restart (the store recorded it, so nothing
/// else creates it) removes the staging directory at once, rather than leaving it for gc's
/// minute of grace; one whose lock is held (a create still under way) stays.
#[tokio::test]
async fn an_interrupted_creates_staging_directory_goes_with_its_adoption() {
    let env = TestEnv::new();
    let backend = backend(env.state(), &env.cgroup_parent);
    let run = env.state().join("run");
    let staging = |id: &str| run.join(format!(".new-{id}"));
    std::fs::create_dir_all(staging("sb-cut")).expect("a staging directory");
    std::fs::write(staging("sb-cut").join("lock"), b"").expect("its lock file");
    assert!(matches!(
        backend.adopt_sandbox(&id("sb-cut")).expect("adopt"),
        Adoption::Missing
    ));
    assert!(!staging("sb-cut").exists(), "the staging directory stayed");

    // A staging directory without even its lock file yet (the process died right after mkdir).
    std::fs::create_dir_all(staging("sb-bare")).expect("a staging directory");
    assert!(!backend.reclaim_sandbox(&id("sb-bare")).expect("reclaim"));
    assert!(!staging("sb-bare").exists(), "the staging directory stayed");

    // Held: another open file description holds its lock, as a create under way does.
    std::fs::create_dir_all(staging("sb-held")).expect("a staging directory");
    let held = std::fs::File::create(staging("sb-held").join("lock")).expect("lock file");
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("locked");
    assert!(matches!(
        backend.adopt_sandbox(&id("sb-held")).expect("adopt"),
        Adoption::Missing
    ));
    assert!(
        staging("sb-held").exists(),
        "a staging directory whose lock is held was removed"
    );
    drop(held);
    std::fs::remove_dir_all(staging("sb-held")).expect("cleaned up");
    env.assert_clean();
}
