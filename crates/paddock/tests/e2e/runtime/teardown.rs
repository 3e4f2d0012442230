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
    env.gc();
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
        env.gc();
        assert_eq!(parent_cgroups(&env), vec![operators.clone()]);
        std::fs::remove_dir(&operators).expect("remove the operator's parent");
    }
    env.assert_clean();
}

/// The mount table's line for the mount at exactly `path`, if any.
fn mount_at(path: &std::path::Path) -> Option<String> {
    let target = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some(target.as_str()))
        .map(str::to_owned)
}

/// The state directory bound onto itself as a shared mount (a host whose `/` is shared, as under
/// systemd), so that a mount made below it would propagate unless made private; lazily unmounted on
/// drop.
struct SharedMount(std::path::PathBuf);

impl SharedMount {
    fn new(dir: &std::path::Path) -> Self {
        std::fs::create_dir_all(dir).expect("the state directory");
        for args in [&["--bind"][..], &["--make-shared"][..]] {
            let ok = std::process::Command::new("mount")
                .args(args)
                .args(if args[0] == "--bind" {
                    vec![dir, dir]
                } else {
                    vec![dir]
                })
                .status()
                .expect("mount runs");
            assert!(ok.success(), "mount {args:?} {}", dir.display());
        }
        Self(dir.to_owned())
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("--lazy")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn the_run_directory_is_a_private_tmpfs_that_pool_destroy_unmounts() {
    let env = TestEnv::new();
    let shared = SharedMount::new(env.state());
    let run = env.state().join("run");
    assert_code(&env.run(&[], &["true"]), 0);
    let line = mount_at(&run).unwrap_or_else(|| panic!("no mount at {}", run.display()));
    let (mount, fs) = line.split_once(" - ").expect("a mountinfo line");
    assert!(fs.starts_with("tmpfs "), "{line}");
    for option in ["nosuid", "nodev", "noexec"] {
        assert!(mount.contains(option), "{option} missing: {line}");
    }
    assert!(
        !mount.contains("shared:"),
        "mounts under it must not propagate: {line}"
    );
    // Only host root may enter it; the sandboxes' root group may pass through.
    let meta = std::fs::metadata(&run).expect("run");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(meta.permissions().mode() & 0o7777, 0o710);
    assert_eq!(meta.uid(), 0);
    // A second open finds it mounted: one mount, not two.
    assert_code(&env.run(&[], &["true"]), 0);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let stacked = mounts
        .lines()
        .filter(|l| l.split_whitespace().nth(4) == Some(&*run.to_string_lossy()))
        .count();
    assert_eq!(stacked, 1, "{mounts}");
    assert_code(
        &env.cmd()
            .args(["pool", "destroy"])
            .output()
            .expect("pool destroy"),
        0,
    );
    assert_eq!(mount_at(&run), None, "pool destroy unmounts the run directory");
    drop(shared);
    env.assert_clean();
}

#[test]
fn a_run_directory_an_older_paddock_left_occupied_stays_on_disk_until_empty() {
    let env = TestEnv::new();
    let run = env.state().join("run");
    // What an older paddock leaves while one of its sandboxes lives: its run directory on disk,
    // its lock held.
    std::fs::create_dir_all(run.join("sb-older")).expect("an older sandbox's run directory");
    std::fs::write(env.state().join(".paddock-state"), "paddock state directory\n").expect("marker");
    let lock = std::fs::File::create(run.join("sb-older/lock")).expect("its lock file");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).expect("held");
    assert_code(&env.run(&[], &["true"]), 0);
    assert_eq!(
        mount_at(&run),
        None,
        "mounted over a live sandbox's run directory"
    );
    assert!(
        run.join("sb-older").is_dir(),
        "the older sandbox's run directory is hidden or gone"
    );
    drop(lock);
    std::fs::remove_dir_all(run.join("sb-older")).expect("the older sandbox ends");
    assert_code(&env.run(&[], &["true"]), 0);
    assert!(
        mount_at(&run).is_some_and(|l| l.contains(" - tmpfs ")),
        "an empty run directory becomes a tmpfs"
    );
    env.assert_clean();
}

#[test]
fn a_run_directory_mounted_in_another_mount_namespace_is_refused_while_its_sandboxes_live() {
    let env = TestEnv::new();
    // A `paddock run` in a private mount namespace mounts the run tmpfs (and the pool) there only.
    let elsewhere = env.cmd();
    let program = elsewhere.get_program().to_owned();
    let mut other = std::process::Command::new("unshare");
    other
        .args(["--mount", "--propagation", "private", "--"])
        .arg(program)
        .args(["run", "--", "sleep", "120"])
        .envs(elsewhere.get_envs().filter_map(|(k, v)| v.map(|v| (k, v))))
        .env_remove("PADDOCK_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    /// Ends the other namespace's run however the test ends (it tears its sandbox down on TERM).
    struct Ended(Child);
    impl Drop for Ended {
        fn drop(&mut self) {
            if let Ok(None) = self.0.try_wait() {
                signal(&self.0, rustix::process::Signal::TERM);
                let _ = self.0.wait();
            }
        }
    }
    let child = Ended(other.spawn().expect("unshare runs"));
    let live = wait_until(Duration::from_secs(60), || {
        env.processes()
            .iter()
            .any(|(_, cmd)| cmd.starts_with("sleep 120"))
    });
    assert!(live, "the other namespace's sandbox did not start");
    let refused = env.run(&[], &["true"]);
    assert_code(&refused, 125);
    let line = crate::support::stderr(&refused);
    assert!(line.contains("another mount namespace"), "{line}");
    assert_eq!(line.trim().lines().count(), 1, "{line}");
    assert!(
        env.processes()
            .iter()
            .any(|(_, cmd)| cmd.starts_with("sleep 120")),
        "the other namespace's sandbox was reclaimed"
    );
    // Once that sandbox is gone, nothing can be harmed: the run directory is mounted here.
    drop(child);
    assert!(wait_until(Duration::from_secs(60), || env.processes().is_empty()));
    assert_code(&env.run(&[], &["true"]), 0);
    env.assert_clean();
}
