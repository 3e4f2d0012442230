//! A real `paddock serve` for end-to-end tests that drive its REST API: start it on a free port, stop
//! it (SIGTERM) or kill it (SIGKILL), read its log, and an HTTP client for its API (`api.rs`). What
//! its sandboxes hold on the host is in `support/host.rs`.

mod api;

pub use api::{wait_for, Api, Reply};

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::TestEnv;

/// How long a server may take to start (the first start creates the storage pool; a restart re-adopts
/// every sandbox).
pub const START_DEADLINE: Duration = Duration::from_secs(90);
/// How long a server may take to stop after SIGTERM.
pub const STOP_DEADLINE: Duration = Duration::from_secs(30);
/// How long one API request may take (an exec of `true` under load included).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// A running `paddock serve`.
#[derive(Debug)]
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The admin key it wrote to `<state>/admin.key`.
    pub admin_key: String,
    /// Its stderr lines after the `listening` line.
    log: mpsc::Receiver<String>,
    /// Lines read off `log` while waiting for recovery, not yet returned by `log_lines_with`.
    early: std::sync::Mutex<Vec<String>>,
}

impl Server {
    /// Starts a server on a fresh environment: it announces the admin key it wrote.
    pub fn start(env: &TestEnv, args: &[&str], log: &str) -> Server {
        Self::spawn(env, args, log, true)
    }

    /// Starts a server again on the same state directory: the admin key exists already.
    pub fn restart(env: &TestEnv, args: &[&str], log: &str) -> Server {
        Self::spawn(env, args, log, false)
    }

    /// Starts a server on a fresh environment under `wrapper` (a command that runs the rest of its
    /// command line, such as `prlimit --nofile=N:N --`).
    pub fn start_wrapped(env: &TestEnv, wrapper: &[&str], args: &[&str], log: &str) -> Server {
        Self::spawn_with(env, wrapper, args, log, true)
    }

    fn spawn(env: &TestEnv, args: &[&str], log: &str, first_start: bool) -> Server {
        Self::spawn_with(env, &[], args, log, first_start)
    }

    /// Starts a server again on the same state directory and returns as soon as it listens, while
    /// sandboxes from before may still be recovering (see [`Server::wait_recovered`]).
    pub fn restart_serving(env: &TestEnv, args: &[&str], log: &str) -> Server {
        Self::spawn_inner(env, &[], args, log, false, &[])
    }

    /// Waits for the `paddock: recovery done` line.
    pub fn wait_recovered(&self) {
        let start = Instant::now();
        loop {
            match self
                .log
                .recv_timeout(START_DEADLINE.saturating_sub(start.elapsed()))
            {
                Ok(line) => {
                    let done = line == "paddock: recovery done";
                    self.early.lock().expect("lock").push(line);
                    if done {
                        return;
                    }
                }
                Err(_) => panic!("the server did not finish recovering"),
            }
        }
    }

    fn spawn_with(env: &TestEnv, wrapper: &[&str], args: &[&str], log: &str, first_start: bool) -> Server {
        let server = Self::spawn_inner(env, wrapper, args, log, first_start, &[]);
        server.wait_recovered();
        server
    }

    /// [`Server::start`] with extra environment variables.
    pub fn start_with_env(env: &TestEnv, args: &[&str], log: &str, vars: &[(&str, &str)]) -> Server {
        let server = Self::spawn_inner(env, &[], args, log, true, vars);
        server.wait_recovered();
        server
    }

    fn spawn_inner(
        env: &TestEnv,
        wrapper: &[&str],
        args: &[&str],
        log: &str,
        first_start: bool,
        vars: &[(&str, &str)],
    ) -> Server {
        let mut cmd = env.cmd();
        if let Some((program, rest)) = wrapper.split_first() {
            let paddock = env.cmd();
            cmd = std::process::Command::new(program);
            cmd.env_clear()
                .envs(paddock.get_envs().filter_map(|(k, v)| Some((k, v?))))
                .args(rest)
                .arg(paddock.get_program());
        }
        let mut child = cmd
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("PADDOCK_LOG", log)
            .envs(vars.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("paddock serve starts");
        let (tx, rx) = mpsc::channel();
        let pipe = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                eprintln!("[serve] {line}");
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let start = Instant::now();
        let mut seen = Vec::new();
        let url = loop {
            match rx.recv_timeout(START_DEADLINE.saturating_sub(start.elapsed())) {
                Ok(line) => {
                    if let Some(url) = line.strip_prefix("paddock: listening on ") {
                        break url.trim().to_owned();
                    }
                    seen.push(line);
                }
                Err(_) => {
                    let _ = child.kill();
                    let status = child.wait();
                    panic!(
                        "the server did not start ({status:?}); its output:\n{}",
                        seen.join("\n")
                    );
                }
            }
        };
        let announced = seen
            .iter()
            .any(|l| l.starts_with("paddock: admin API key written to "));
        let admin_key = if announced != first_start {
            Err(format!(
                "admin key announcement on this start: {announced}, expected {first_start}: {seen:?}"
            ))
        } else {
            std::fs::read_to_string(env.state().join("admin.key"))
                .map(|k| k.trim().to_owned())
                .map_err(|e| format!("admin.key: {e}"))
        };
        // A failed check here must not leave the server running (the test panics before a
        // `Server` exists to be dropped).
        let admin_key = admin_key.unwrap_or_else(|why| {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{why}");
        });
        Server {
            child,
            url,
            admin_key,
            log: rx,
            early: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The server's host pid.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid")
    }

    /// A client of its API.
    pub fn api(&self) -> Api {
        Api::new(&self.url)
    }

    /// `kill -9`: the server gets no chance to clean up. Returns once it is reaped.
    pub fn kill9(mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("SIGKILL");
        let status = self.child.wait().expect("wait");
        assert!(!status.success(), "killed server status: {status:?}");
    }

    /// Sends SIGTERM and waits for a clean exit; the server must not have panicked.
    pub fn stop(mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "server exit status after SIGTERM: {status:?}");
                break;
            }
            assert!(
                start.elapsed() < STOP_DEADLINE,
                "the server did not stop after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let rest: Vec<String> = self.log.try_iter().collect();
        assert!(
            !rest.iter().any(|l| l.contains("panicked")),
            "the server panicked: {rest:?}"
        );
    }

    /// Waits for the server to die on its own, as it does at an armed crash point (`PADDOCK_FAULT`):
    /// it writes a line containing `needle`, then kills itself. Returns its exit status and whether
    /// that line came within `deadline`; a server that wrote no such line by then (or whose stderr
    /// closed first) is killed here, so the call never hangs.
    pub fn wait_died(mut self, needle: &str, deadline: Duration) -> (std::process::ExitStatus, bool) {
        let start = Instant::now();
        let mut seen = false;
        while !seen {
            match self.log.recv_timeout(deadline.saturating_sub(start.elapsed())) {
                Ok(line) => seen = line.contains(needle),
                Err(_) => break,
            }
        }
        if !seen {
            let _ = self.child.kill();
        }
        // After the line, the server's own SIGKILL is already on its way: this wait is short.
        let status = self.child.wait().expect("wait");
        (status, seen)
    }

    /// Log lines so far (after the `listening` line) that contain `needle`.
    pub fn log_lines_with(&self, needle: &str) -> Vec<String> {
        let early = std::mem::take(&mut *self.early.lock().expect("lock"));
        early
            .into_iter()
            .chain(self.log.try_iter())
            .filter(|l| l.contains(needle))
            .collect()
    }

    /// Waits (at most `deadline`) for the server to exit on its own, as at a crash point; its
    /// status and the log lines it wrote since the last call.
    pub fn wait_exit(mut self, deadline: Duration) -> (std::process::ExitStatus, Vec<String>) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                let mut lines = std::mem::take(&mut *self.early.lock().expect("lock"));
                // The reader thread ends with the pipe: every line is in the channel by then.
                while let Ok(line) = self.log.recv_timeout(Duration::from_secs(10)) {
                    lines.push(line);
                }
                return (status, lines);
            }
            assert!(
                start.elapsed() < deadline,
                "the server did not exit within {deadline:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
