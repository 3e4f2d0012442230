//! Sandboxes made ahead (`paddock run --keep-ready`, runtime `ready.rs`): a run takes the sandbox an
//! earlier run's maker left ready, and as it ends starts the maker of the next one. What these tests try to break:
//! a sandbox taken this way must be exactly a fresh sandbox (nothing of an earlier run, the run's own
//! environment and limits), must end with its run however the run ends (its init is not the run's
//! child), and must never be left to leak (gc keeps only live, current ones; `pool destroy` removes
//! them).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::{assert_code, stdout, wait_until, TestEnv};

/// The ids of `env`'s ready sandboxes (run directories holding a ready record).
fn ready(env: &TestEnv) -> BTreeSet<String> {
    std::fs::read_dir(env.state().join("run"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("ready.json").exists())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

/// Waits (a safety net of a minute) until a sandbox other than those of `besides` is ready, then
/// until its maker is done (it tears the previous run's sandbox down after making this one, and a
/// run ending while a maker works starts none); returns its id.
#[track_caller]
fn wait_ready(env: &TestEnv, besides: &BTreeSet<String>) -> String {
    let mut found = None;
    let made = wait_until(Duration::from_secs(60), || {
        found = ready(env).difference(besides).next().cloned();
        found.is_some()
    });
    assert!(made, "no sandbox was made ahead; ready: {:?}", ready(env));
    wait_for_makers(env);
    found.expect("found")
}

/// Waits (a safety net of a minute) until no maker is at work: the maker lock is free.
#[track_caller]
fn wait_for_makers(env: &TestEnv) {
    let lock = std::fs::File::open(env.state().join("ready.lock")).expect("the maker lock exists");
    let free = wait_until(Duration::from_secs(60), || {
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockShared).is_ok()
    });
    assert!(free, "a maker is still at work");
}

/// `paddock run --keep-ready [opts] -- sh -c script`.
fn keep_ready_sh(env: &TestEnv, opts: &[&str], script: &str) -> std::process::Output {
    let mut all = vec!["--keep-ready"];
    all.extend_from_slice(opts);
    env.sh(&all, script)
}

/// What a sandbox looks like from inside to its command: environment, descriptors, files an earlier
/// run could have left, processes, mounts (without their ids), credentials and cgroups.
const PROBE: &str = r#"
echo "== env"; env | grep -v -e '^PWD=' -e '^SHLVL=' -e '^_=' | sort
echo "== fds"; ls /proc/self/fd
echo "== files"; ls -A /tmp /home/user /root 2>&1; ls /etc | md5sum
echo "== processes"; for p in /proc/[0-9]*; do read -r c < "$p/comm" && echo "$c"; done
echo "== mounts"; cut -d' ' -f4- /proc/self/mountinfo | sed -e 's/subvolid=[0-9]*//' -e 's/shared:[0-9]*//' -e 's/master:[0-9]*//'
echo "== credentials"; id; grep -e '^Cap' -e '^NoNewPrivs' -e '^Seccomp:' /proc/self/status
echo "== cgroups"; cat /proc/self/cgroup
"#;

#[test]
fn a_sandbox_made_ahead_is_exactly_a_fresh_one_with_nothing_of_an_earlier_run() {
    let env = TestEnv::new();
    // The first run finds none ready and starts the first maker.
    let o = keep_ready_sandbox_first_run(&env);
    let first = stdout(&o).trim().to_owned();
    let r1 = wait_ready(&env, &BTreeSet::new());
    assert_ne!(r1, first, "the maker made a sandbox of its own");

    // The earlier run, in the sandbox made ahead: it leaves what it can (files, a process, its
    // environment) and ends; the maker it starts makes the next sandbox, then tears this one down.
    let o = keep_ready_sh(
        &env,
        &["-e", "EARLIER=secret"],
        "hostname; echo left > /tmp/left; echo left > /home/user/left; (sleep 1000 &) ; exec 7>/tmp/fd",
    );
    assert_code(&o, 0);
    assert_eq!(stdout(&o).trim(), r1, "the run took the sandbox made ahead");
    // Its processes (the background `sleep` included) end with it; the rest of its teardown is its
    // maker's, after the next sandbox is made.
    assert!(
        wait_until(Duration::from_secs(30), || sandbox_processes(&env, &r1)
            .is_empty()),
        "{:?}",
        sandbox_processes(&env, &r1)
    );
    let r2 = wait_ready(&env, &BTreeSet::from([r1.clone()]));
    assert!(
        !env.state().join("run").join(&r1).exists(),
        "its run directory is gone"
    );
    assert!(
        !env.state().join("pool/sandboxes").join(&r1).exists(),
        "its volume is gone"
    );
    assert!(!env.cgroup_ids().contains(&r1), "its cgroups are gone");

    let o = keep_ready_sh(&env, &["-e", "LATER=1"], &format!("hostname; {PROBE}"));
    assert_code(&o, 0);
    let taken = stdout(&o);
    let (host, taken) = taken.split_once('\n').expect("hostname first");
    assert_eq!(host, r2, "the later run took the next sandbox made ahead");
    assert!(!taken.contains("EARLIER") && !taken.contains("left"), "{taken}");

    // The same probe in a sandbox made for its run: everything but the names is the same.
    let o = env.sh(&["-e", "LATER=1"], &format!("hostname; {PROBE}"));
    assert_code(&o, 0);
    let fresh = stdout(&o);
    let (fresh_host, fresh) = fresh.split_once('\n').expect("hostname first");
    assert_eq!(
        taken.replace(host, "<id>"),
        fresh.replace(fresh_host, "<id>"),
        "a sandbox made ahead differs from a fresh one"
    );
    assert!(taken.contains("LATER=1"), "the run's own environment: {taken}");

    // The later run's maker left one more; `pool destroy` removes every one.
    wait_ready(&env, &BTreeSet::from([r1, r2]));
    destroy_and_assert_clean(&env);
}

/// A `--keep-ready` run (the first of a pool finds none ready): prints its sandbox's id.
fn keep_ready_sandbox_first_run(env: &TestEnv) -> std::process::Output {
    let o = keep_ready_sh(env, &[], "hostname");
    assert_code(&o, 0);
    o
}

/// `paddock pool destroy` (which must succeed), then nothing may be left.
#[track_caller]
fn destroy_and_assert_clean(env: &TestEnv) {
    let o = env
        .cmd()
        .args(["pool", "destroy"])
        .stdin(Stdio::null())
        .output()
        .expect("destroy");
    assert_code(&o, 0);
    assert!(ready(env).is_empty());
    env.assert_clean();
}

/// Whether any process of sandbox `id` is left (in its cgroups).
fn sandbox_processes(env: &TestEnv, id: &str) -> Vec<(i32, String)> {
    let marker = format!("/{}/{id}", env.cgroup_parent);
    env.processes()
        .into_iter()
        .filter(|(pid, _)| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&marker))
        })
        .collect()
}

/// The executable's name of process `pid` (`comm`).
fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[test]
fn a_sandbox_made_ahead_ends_with_its_run_however_the_run_ends() {
    let env = TestEnv::new();
    let mut seen = BTreeSet::new();
    // Killed while the front supervises, then after it handed over to `paddock-wait`.
    for handed_over in [false, true] {
        // A killed run starts no maker: a finished one leaves the next sandbox.
        keep_ready_sandbox_first_run(&env);
        let id = wait_ready(&env, &seen);
        seen.insert(id.clone());
        let (mut run, _out, up) = env.spawn_run_until_up(&[
            "--keep-ready",
            "--",
            "/bin/sh",
            "-c",
            "hostname; echo up; exec sleep 1000",
        ]);
        let up = String::from_utf8_lossy(&up).into_owned();
        assert!(up.starts_with(&id), "the run took {id}: {up}");
        if handed_over {
            assert!(
                wait_until(Duration::from_secs(30), || comm(run.id()) == "paddock-wait"),
                "the run did not hand over"
            );
        }
        assert!(!sandbox_processes(&env, &id).is_empty(), "the sandbox runs");
        run.kill().expect("SIGKILL");
        run.wait().expect("reaped");
        // Its init is not the run's child, so no parent-death signal ends it: the agent does, when
        // the connection holding the sandbox closes.
        assert!(
            wait_until(Duration::from_secs(30), || sandbox_processes(&env, &id)
                .is_empty()),
            "processes of {id} outlived their run (handed over: {handed_over}): {:?}",
            sandbox_processes(&env, &id)
        );
        // What is left of it (run directory, cgroups, volume) is an abandoned sandbox's: gc's.
        let o = env.cmd().arg("gc").stdin(Stdio::null()).output().expect("gc");
        assert_code(&o, 0);
        assert!(stdout(&o).contains(&format!("reclaimed {id}")), "{}", stdout(&o));
    }
    destroy_and_assert_clean(&env);
}

#[test]
fn gc_keeps_a_live_current_ready_sandbox_and_reclaims_a_dead_or_stale_one() {
    let env = TestEnv::new();
    // Its own copy of the agent, so the test can make it "another build" without touching others'.
    let agent_dir = tempfile::tempdir().expect("tempdir");
    let agent = agent_dir.path().join("paddock-agent");
    std::fs::copy(crate::support::agent_bin(), &agent).expect("copy the agent");
    let mut run = env.cmd();
    run.env("PADDOCK_AGENT", &agent)
        .args(["run", "--keep-ready", "--", "true"])
        .stdin(Stdio::null());
    assert_code(&run.output().expect("run"), 0);
    let live = wait_ready(&env, &BTreeSet::new());

    let gc = |env: &TestEnv| {
        let o = env
            .cmd()
            .env("PADDOCK_AGENT", &agent)
            .arg("gc")
            .stdin(Stdio::null())
            .output()
            .expect("gc");
        assert_code(&o, 0);
        stdout(&o)
    };
    assert_eq!(gc(&env).trim(), "nothing to reclaim");
    assert_eq!(ready(&env), BTreeSet::from([live.clone()]), "kept");
    assert!(!sandbox_processes(&env, &live).is_empty());

    // Its init killed: reclaimed.
    let record =
        std::fs::read_to_string(env.state().join("run").join(&live).join("init.pid")).expect("init.pid");
    let pid: i32 = record
        .split_whitespace()
        .next()
        .expect("pid")
        .parse()
        .expect("pid");
    assert_code(
        &Command::new("kill")
            .args(["-9", &pid.to_string()])
            .output()
            .expect("kill"),
        0,
    );
    assert!(wait_until(Duration::from_secs(30), || sandbox_processes(
        &env, &live
    )
    .is_empty()));
    assert!(gc(&env).contains(&format!("reclaimed {live}")));
    assert!(ready(&env).is_empty());

    // Made with an agent that has changed since: stale, reclaimed (and never taken).
    assert_code(&run.output().expect("run"), 0);
    let stale = wait_ready(&env, &BTreeSet::new());
    replace(&agent);
    assert!(gc(&env).contains(&format!("reclaimed {stale}")));
    assert!(ready(&env).is_empty());
    assert!(wait_until(Duration::from_secs(30), || sandbox_processes(
        &env, &stale
    )
    .is_empty()));

    // Once more, now for a run: it never takes a stale one (its own gc reclaims it first).
    assert_code(&run.output().expect("run"), 0);
    let stale = wait_ready(&env, &BTreeSet::new());
    replace(&agent);
    let o = env
        .cmd()
        .env("PADDOCK_AGENT", &agent)
        .args(["run", "--keep-ready", "--", "hostname"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_code(&o, 0);
    assert_ne!(stdout(&o).trim(), stale);
    assert!(!ready(&env).contains(&stale));
    assert!(wait_until(Duration::from_secs(30), || sandbox_processes(
        &env, &stale
    )
    .is_empty()));
    destroy_and_assert_clean(&env);
}

/// Replaces the executable at `path` with a copy of itself: a new file, as an upgrade makes.
fn replace(path: &Path) {
    let bytes = std::fs::read(path).expect("read");
    std::fs::remove_file(path).expect("remove");
    std::fs::write(path, bytes).expect("a new file");
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
}

#[test]
fn a_run_takes_only_a_sandbox_made_for_its_limits_and_user() {
    let env = TestEnv::new();
    keep_ready_sandbox_first_run(&env);
    let default = wait_ready(&env, &BTreeSet::new());
    // Other limits: not the default one; its maker makes one of its shape beside it.
    let o = keep_ready_sh(&env, &["--memory", "256M"], "hostname");
    assert_code(&o, 0);
    assert_ne!(stdout(&o).trim(), default);
    let small = wait_ready(&env, &BTreeSet::from([default.clone()]));
    let o = keep_ready_sh(&env, &["--user", "root"], "hostname; id -u");
    assert_code(&o, 0);
    assert_eq!(stdout(&o).lines().nth(1), Some("0"));
    assert!(![&default, &small].contains(&&stdout(&o).lines().next().unwrap_or_default().to_owned()));
    let root = wait_ready(&env, &BTreeSet::from([default.clone(), small.clone()]));
    // The 256M run's sandbox: taken by a run asking for 256M, and limited to it.
    let (mut run, _out, up) = env.spawn_run_until_up(&[
        "--keep-ready",
        "--memory",
        "256M",
        "--",
        "/bin/sh",
        "-c",
        "hostname; echo up; read x; true",
    ]);
    assert!(
        String::from_utf8_lossy(&up).starts_with(&small),
        "{}",
        String::from_utf8_lossy(&up)
    );
    assert_eq!(memory_limit(&env, &small), Some(256 << 20));
    drop(run.stdin.take());
    assert!(run.wait().expect("wait").success());
    assert!(ready(&env).contains(&root) && ready(&env).contains(&default));
    destroy_and_assert_clean(&env);
}

/// The memory limit of sandbox `id`'s cgroup, read on the host (cgroup v1 or v2).
fn memory_limit(env: &TestEnv, id: &str) -> Option<u64> {
    for file in [
        Path::new("/sys/fs/cgroup/memory")
            .join(&env.cgroup_parent)
            .join(id)
            .join("memory.limit_in_bytes"),
        Path::new("/sys/fs/cgroup")
            .join(&env.cgroup_parent)
            .join(id)
            .join("memory.max"),
    ] {
        if let Ok(v) = std::fs::read_to_string(file) {
            return v.trim().parse().ok();
        }
    }
    None
}

#[test]
fn a_claim_or_a_maker_killed_midway_leaves_only_what_gc_reclaims() {
    let env = TestEnv::new();
    keep_ready_sandbox_first_run(&env);
    let ready_one = wait_ready(&env, &BTreeSet::new());

    // A run killed right after it claimed a sandbox (its record removed, nothing held yet).
    let o = env
        .cmd()
        .env(paddock_runtime::fault::FAULT_ENV, "ready.claimed")
        .args(["run", "--keep-ready", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(
        crate::support::stderr(&o).contains("fault point ready.claimed reached"),
        "{}",
        crate::support::stderr(&o)
    );
    assert!(!ready(&env).contains(&ready_one), "it was claimed");
    let o = env.cmd().arg("gc").stdin(Stdio::null()).output().expect("gc");
    assert_code(&o, 0);
    assert_eq!(stdout(&o).trim(), format!("reclaimed {ready_one}"));
    assert!(wait_until(Duration::from_secs(30), || sandbox_processes(
        &env, &ready_one
    )
    .is_empty()));

    // A maker killed after making its sandbox and before recording it, holding the run's sandbox it
    // was to tear down: both are abandoned sandboxes, and gc reclaims both (had the point not been
    // reached, a ready sandbox would be left and nothing reclaimed).
    let o = env
        .cmd()
        .env(paddock_runtime::fault::FAULT_ENV, "ready.made")
        .args(["run", "--keep-ready", "--", "hostname"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_code(&o, 0);
    let run_sandbox = stdout(&o).trim().to_owned();
    wait_for_makers(&env);
    assert!(ready(&env).is_empty(), "{:?}", ready(&env));
    let o = env.cmd().arg("gc").stdin(Stdio::null()).output().expect("gc");
    assert_code(&o, 0);
    let gc_out = stdout(&o);
    let reclaimed: BTreeSet<&str> = gc_out
        .lines()
        .filter_map(|l| l.strip_prefix("reclaimed "))
        .collect();
    assert_eq!(reclaimed.len(), 2, "{}", stdout(&o));
    assert!(reclaimed.contains(run_sandbox.as_str()), "{}", stdout(&o));
    env.assert_clean();
}
