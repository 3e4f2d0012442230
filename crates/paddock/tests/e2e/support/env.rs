//! The fixture: [`require_root`], then a [`TestEnv`] of the test's own (a state directory, so a
//! storage pool, and a parent cgroup) that runs the real `paddock` binary; dropped, also when the test
//! panics, it reclaims everything. [`TestEnv::assert_clean`] checks nothing was left behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Host uid range the sandboxes map to (paddock's default).
pub const ID_BASE: u32 = 1_000_000_000;

pub fn paddock_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_paddock"))
}

/// The setup shim's executable, built with `paddock` (a second binary of the same package).
pub fn setup_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_paddock-setup"))
}

pub fn agent_bin() -> PathBuf {
    let p = paddock_bin().with_file_name("paddock-agent");
    assert!(
        p.exists(),
        "agent binary missing at {}: build the workspace first (`cargo build --workspace`)",
        p.display()
    );
    p
}

/// Fails the test unless this is root on a host with what every sandbox needs (cgroup hierarchies
/// with the memory, pids and cpu controllers; user namespaces). The end-to-end suite must fail there
/// rather than count skipped tests as passes: CI runs it as root. [`TestEnv::new`] and the API
/// harness start with it; a test only calls it itself when it needs root before its environment.
///
/// A root host that lacks a feature only some tests need (the freezer, `ip`/`nft`, an I/O weight)
/// is different: those tests skip with a loud reason ([`skip`]).
#[track_caller]
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the end-to-end tests create real sandboxes and must run as root (CI does): \
         run scripts/test.sh as root"
    );
    let cgroup = Path::new("/sys/fs/cgroup");
    if !cgroup.join("cgroup.controllers").exists() {
        for controller in ["memory", "pids", "cpu"] {
            assert!(
                cgroup.join(controller).join("tasks").exists(),
                "the end-to-end tests need the cgroup v1 controller '{controller}' mounted at \
                 /sys/fs/cgroup/{controller} (or a cgroup v2 root)"
            );
        }
    }
    let user_namespaces = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert!(
        user_namespaces.is_some_and(|n| n > 0),
        "the end-to-end tests need user namespaces (/proc/sys/user/max_user_namespaces > 0)"
    );
}

/// A loud skip, for a root host that lacks what one test needs: says why on stderr (nextest shows
/// it with the test's output). Not being root is still a failure ([`require_root`] first), so no
/// run that is not root can pass by skipping.
#[track_caller]
pub fn skip(reason: &str) {
    require_root();
    eprintln!("SKIPPED: {reason}");
}

pub struct TestEnv {
    pub state_dir: tempfile::TempDir,
    /// This test's own parent cgroup, so tests running in parallel never see each other's sandboxes.
    pub cgroup_parent: String,
}

impl TestEnv {
    /// The fixture every test that creates sandboxes starts with: [`require_root`] (a failure when
    /// not root), then a fresh state directory and cgroup parent. Dropped, also when the test
    /// panics, it destroys the pool and removes the parent cgroups; a test ends with
    /// [`TestEnv::assert_clean`] (the API harness calls it on drop) to check nothing was left.
    #[track_caller]
    pub fn new() -> Self {
        require_root();
        let state_dir = tempfile::Builder::new()
            .prefix("paddock-test-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let name = state_dir
            .path()
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        Self {
            state_dir,
            cgroup_parent: name,
        }
    }

    pub fn state(&self) -> &Path {
        self.state_dir.path()
    }

    /// `paddock` with this environment's state dir and agent.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(paddock_bin());
        c.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("PADDOCK_STATE_DIR", self.state())
            .env("PADDOCK_AGENT", agent_bin())
            .env("PADDOCK_POOL_SIZE", "8G")
            .env("PADDOCK_CGROUP_PARENT", &self.cgroup_parent);
        c
    }

    /// Runs `paddock run [opts] -- argv` with stdin from /dev/null and captures the output.
    pub fn run(&self, opts: &[&str], argv: &[&str]) -> Output {
        let mut c = self.cmd();
        c.arg("run").args(opts).arg("--").args(argv).stdin(Stdio::null());
        c.output().expect("paddock runs")
    }

    /// Runs a shell script as `user` in a sandbox.
    pub fn sh(&self, opts: &[&str], script: &str) -> Output {
        self.run(opts, &["/bin/sh", "-c", script])
    }

    /// Starts `paddock run ARGS` with stdin and stdout piped and reads its stdout until it ends with
    /// `up\n`: the sandbox is made and its command runs. Returns the run, its stdout and what was read.
    #[track_caller]
    pub fn spawn_run_until_up(
        &self,
        args: &[&str],
    ) -> (std::process::Child, std::process::ChildStdout, Vec<u8>) {
        use std::io::Read;
        let mut child = self
            .cmd()
            .arg("run")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut out = child.stdout.take().expect("stdout");
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !seen.ends_with(b"up\n") {
            let n = out.read(&mut buf).expect("read");
            assert!(n > 0, "the run ended early: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buf[..n]);
        }
        (child, out, seen)
    }

    /// `paddock gc` on this environment's state directory, which must succeed.
    #[track_caller]
    pub fn gc(&self) {
        let o = self
            .cmd()
            .arg("gc")
            .stdin(Stdio::null())
            .output()
            .expect("runs gc");
        assert_code(&o, 0);
    }

    /// Asserts that no sandbox of this environment left anything behind: run directories, subvolumes,
    /// cgroups, or processes of the sandbox uid range.
    pub fn assert_clean(&self) {
        let run = self.state().join("run");
        let leftovers = || -> Vec<_> {
            std::fs::read_dir(&run)
                .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default()
        };
        // A networked sandbox's last teardown steps (its link, then its run directory, renamed
        // `.gone-...`) run in the background after its destroy returned: give them a deadline.
        wait_until(std::time::Duration::from_secs(60), || leftovers().is_empty());
        let leftovers = leftovers();
        assert!(leftovers.is_empty(), "run dirs left behind: {leftovers:?}");
        for dir in ["pool/sandboxes", "pool/stopped"] {
            let vols: Vec<_> = std::fs::read_dir(self.state().join(dir))
                .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(vols.is_empty(), "subvolumes left behind in {dir}: {vols:?}");
        }
        // A killed sandbox whose init is not our child (re-adopted after a server restart) stays a
        // zombie until its parent (the host's init) reaps it: give that a deadline.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut procs = self.processes();
        while !procs.is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(50));
            procs = self.processes();
        }
        assert!(procs.is_empty(), "processes left behind: {procs:?}");
        let cgroups = self.cgroup_ids();
        assert!(cgroups.is_empty(), "cgroups left behind: {cgroups:?}");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let state = self.state().to_string_lossy().into_owned();
        let extra: Vec<&str> = mounts
            .lines()
            .filter(|l| {
                l.contains(&state)
                    && !l.contains(&format!("{state}/pool "))
                    && !l.contains(&format!("{state}/run "))
            })
            .collect();
        assert!(extra.is_empty(), "mounts left behind: {extra:?}");
    }

    /// Ids of this environment's sandboxes with cgroups (any hierarchy).
    pub fn cgroup_ids(&self) -> Vec<String> {
        let mut ids = Vec::new();
        for h in ["memory", "pids", "cpu", "blkio", "unified", ""] {
            let dir = Path::new("/sys/fs/cgroup").join(h).join(&self.cgroup_parent);
            if let Ok(rd) = std::fs::read_dir(dir) {
                ids.extend(
                    rd.flatten()
                        .filter(|e| e.path().is_dir())
                        .filter_map(|e| e.file_name().into_string().ok()),
                );
            }
        }
        ids
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let destroy = || self.cmd().args(["pool", "destroy"]).output();
        let mut out = destroy();
        if !out.as_ref().is_ok_and(|o| o.status.success()) {
            // A failed test can leave sandboxes (its server killed): gc reclaims them, then the
            // pool can go.
            let _ = self.cmd().arg("gc").output();
            out = destroy();
        }
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                eprintln!("pool destroy failed: {}", String::from_utf8_lossy(&o.stderr));
                // Never leave the pool mounted on an image the temporary directory deletes.
                let _ = std::process::Command::new("umount")
                    .arg("--lazy")
                    .arg(self.state().join("pool"))
                    .status();
            }
            Err(e) => eprintln!("pool destroy failed: {e}"),
        }
        for h in ["memory", "pids", "cpu", "blkio", "unified", ""] {
            let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(h).join(&self.cgroup_parent));
        }
    }
}

impl TestEnv {
    /// Host processes in any of this environment's sandbox cgroups: (pid, command line).
    pub fn processes(&self) -> Vec<(i32, String)> {
        let marker = format!("/{}/", self.cgroup_parent);
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir("/proc") else {
            return out;
        };
        for e in rd.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let Ok(cg) = std::fs::read_to_string(e.path().join("cgroup")) else {
                continue;
            };
            if cg.lines().any(|l| l.contains(&marker)) {
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                out.push((pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")));
            }
        }
        out
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits for `cond` with a deadline.
pub fn wait_until(deadline: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// The name libtest knows a test of this binary by, for a test that runs the binary again on one
/// test (`--exact`): its module's `module_path!()` without the crate's name, then `test`.
pub fn test_name(module_path: &str, test: &str) -> String {
    let module = module_path.split_once("::").map_or("", |(_, rest)| rest);
    format!("{module}::{test}")
}

/// Asserts the run exited with `code`, printing its output otherwise.
#[track_caller]
pub fn assert_code(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "unexpected exit status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        stdout(o),
        stderr(o)
    );
}
