//! Teardown leaves nothing behind, whatever way the run ends.

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::support::{assert_code, stdout, wait_until, TestEnv};

/// Starts `paddock run` with a script that prints `READY` once its background processes are up.
fn start(env: &TestEnv, script: &str) -> Child {
    let mut child = env
        .cmd()
        .args(["run", "--", "/bin/sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out = child.stdout.take().expect("stdout");
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("READY") {
        let n = out.read(&mut buf).expect("read");
        assert!(
            n > 0,
            "sandbox ended before READY: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    child
}

const DAEMONS: &str = "sleep 1000 & setsid sleep 1001 & (setsid sh -c 'sleep 1002 &' &); \
                       nohup sleep 1003 >/dev/null 2>&1 & echo READY; sleep 1000";

fn signal(child: &Child, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("pid");
    rustix::process::kill_process(pid, sig).expect("signal");
}

#[test]
fn sigterm_and_sigint_tear_everything_down() {
    let env = TestEnv::new();
    for (sig, code) in [
        (rustix::process::Signal::TERM, 143),
        (rustix::process::Signal::INT, 130),
    ] {
        let mut child = start(&env, DAEMONS);
        assert!(
            env.processes().len() >= 5,
            "daemons not running: {:?}",
            env.processes()
        );
        signal(&child, sig);
        assert_eq!(child.wait().expect("wait").code(), Some(code));
        env.assert_clean();
    }
}

#[test]
fn daemonized_processes_do_not_survive_a_normal_exit() {
    let env = TestEnv::new();
    let o = env.sh(
        &[],
        "setsid sleep 1000 & (setsid sh -c 'sleep 1002 &' &); nohup sleep 1003 >/dev/null 2>&1 & exit 7",
    );
    assert_code(&o, 7);
    env.assert_clean();
}

#[test]
fn a_killed_paddock_takes_its_sandbox_along_and_gc_reclaims_the_rest() {
    let env = TestEnv::new();
    let mut child = start(&env, DAEMONS);
    signal(&child, rustix::process::Signal::KILL);
    child.wait().expect("wait");
    assert!(
        wait_until(Duration::from_secs(10), || env.processes().is_empty()),
        "sandbox processes outlived paddock: {:?}",
        env.processes()
    );
    // Storage and cgroups remain until reclaimed.
    let o = env.cmd().arg("gc").output().expect("gc");
    assert_code(&o, 0);
    assert!(stdout(&o).contains("reclaimed sb-"), "{}", stdout(&o));
    env.assert_clean();
    // A later run also reclaims leftovers by itself.
    let mut child = start(&env, DAEMONS);
    signal(&child, rustix::process::Signal::KILL);
    child.wait().expect("wait");
    assert!(wait_until(Duration::from_secs(10), || env.processes().is_empty()));
    assert_code(&env.run(&[], &["true"]), 0);
    env.assert_clean();
}

/// This environment's parent cgroups that exist, in every hierarchy.
fn parent_cgroups(env: &TestEnv) -> Vec<std::path::PathBuf> {
    ["memory", "pids", "cpu", "blkio", "unified", ""]
        .iter()
        .map(|h| {
            std::path::Path::new("/sys/fs/cgroup")
                .join(h)
                .join(&env.cgroup_parent)
        })
        .filter(|p| p.is_dir())
        .collect()
}

#[test]
fn gc_and_pool_destroy_remove_the_parent_cgroups_paddock_made() {
    let env = TestEnv::new();
    assert_code(&env.run(&[], &["true"]), 0);
    assert!(!parent_cgroups(&env).is_empty(), "a run makes its parent cgroups");
    assert_code(&env.cmd().arg("gc").output().expect("gc"), 0);
    assert_eq!(
        parent_cgroups(&env),
        Vec::<std::path::PathBuf>::new(),
        "gc leaves the empty parent cgroups it made"
    );

    assert_code(&env.run(&[], &["true"]), 0);
    assert_code(
        &env.cmd()
            .args(["pool", "destroy"])
            .output()
            .expect("pool destroy"),
        0,
    );
    assert_eq!(
        parent_cgroups(&env),
        Vec::<std::path::PathBuf>::new(),
        "pool destroy leaves the empty parent cgroups it made"
    );

    // A parent made by the operator (on a v1 hierarchy here) is theirs: gc leaves it.
    let operators = std::path::Path::new("/sys/fs/cgroup/pids").join(&env.cgroup_parent);
    if std::path::Path::new("/sys/fs/cgroup/pids/tasks").exists() {
        std::fs::create_dir(&operators).expect("the operator's parent cgroup");
        assert_code(&env.run(&[], &["true"]), 0);
        assert_code(&env.cmd().arg("gc").output().expect("gc"), 0);
        assert_eq!(parent_cgroups(&env), vec![operators.clone()]);
        std::fs::remove_dir(&operators).expect("remove the operator's parent");
    }
    env.assert_clean();
}
