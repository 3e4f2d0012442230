//! Starting the real agent binary on a temporary socket and root, and small helpers for driving it
//! with the real `AgentClient`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use paddock_protocol::{CommandSpec, ExitStatus, SpawnRequest, Stream};
use paddock_runtime::agent_client::{AgentClient, ProcessEvent, ProcessEvents};

/// The passwd of every test root: root, and an unprivileged `user` (uid 1000).
const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:User:/home/user:/bin/sh\n";
const GROUP: &str = "root:x:0:\nuser:x:1000:\nextra:x:4242:user\n";

/// A running agent with its temporary root and socket; stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct TestAgent {
    child: Child,
    _dir: tempfile::TempDir,
    /// The directory given as `--root`.
    pub root: PathBuf,
    /// The socket it listens on.
    pub socket: PathBuf,
}

/// Whether the tests can run: spawning switches users and drops capabilities, which needs root.
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

macro_rules! require_root {
    () => {
        if !$crate::harness::is_root() {
            eprintln!("SKIPPED: the agent tests switch users and drop capabilities; run them as root");
            return;
        }
    };
}
pub(crate) use require_root;

impl TestAgent {
    /// Starts an agent whose default user is `root`, and connects a client.
    pub async fn start() -> (TestAgent, AgentClient) {
        Self::start_with_default_user("root").await
    }

    /// Starts an agent with the given default user, and connects a client.
    pub async fn start_with_default_user(default_user: &str) -> (TestAgent, AgentClient) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        for sub in ["etc", "root", "home/user", "tmp"] {
            std::fs::create_dir_all(root.join(sub)).expect("mkdir in root");
        }
        std::fs::write(root.join("etc/passwd"), PASSWD).expect("passwd");
        std::fs::write(root.join("etc/group"), GROUP).expect("group");
        let socket = dir.path().join("agent.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_paddock-agent"))
            .arg("--listen")
            .arg(&socket)
            .arg("--root")
            .arg(&root)
            .args(["--default-user", default_user, "--log-level", "warn"])
            .stdin(Stdio::null())
            .spawn()
            .expect("start the agent binary");
        let agent = TestAgent {
            child,
            _dir: dir,
            root,
            socket,
        };
        let client = agent.connect().await;
        (agent, client)
    }

    /// Connects another client, waiting (with a deadline) for the socket to appear.
    pub async fn connect(&self) -> AgentClient {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match AgentClient::connect(&self.socket).await {
                Ok(client) => return client,
                Err(err) if Instant::now() < deadline => {
                    let _ = err;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(err) => panic!("agent did not come up: {err:?}"),
            }
        }
    }

    /// Waits (at most `timeout`) for the agent to exit; its status if it has.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.child.try_wait().expect("try_wait") {
                Some(status) => return Some(status),
                None if Instant::now() >= deadline => return None,
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    /// Whether the agent still runs, without waiting.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// The agent's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the agent process (`VmRSS`), KiB.
    pub fn rss_kib(&self) -> u64 {
        proc_field(&format!("/proc/{}/status", self.pid()), "VmRSS:")
    }

    /// Memory only the agent uses (`Private_Clean` + `Private_Dirty` of `smaps_rollup`), KiB.
    pub fn private_kib(&self) -> u64 {
        let path = format!("/proc/{}/smaps_rollup", self.pid());
        proc_field(&path, "Private_Clean:") + proc_field(&path, "Private_Dirty:")
    }

    /// A path on the host inside the agent's root.
    pub fn host_path(&self, in_root: &str) -> PathBuf {
        self.root.join(in_root.trim_start_matches('/'))
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        let _ = paddock_sys::reap::send_signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn proc_field(path: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The environment every test process gets.
pub fn test_env() -> BTreeMap<String, String> {
    BTreeMap::from([("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned())])
}

/// A request running `script` with `sh -c` semantics as root.
pub fn shell(script: &str) -> SpawnRequest {
    SpawnRequest {
        command: CommandSpec::Shell {
            script: script.to_owned(),
        },
        env: test_env(),
        cwd: None,
        user: Some("root".to_owned()),
        stdin: false,
        pty: None,
        timeout_ms: None,
        tag: None,
        detached: false,
    }
}

/// A request exec'ing `argv` as root.
pub fn argv(args: &[&str]) -> SpawnRequest {
    SpawnRequest {
        command: CommandSpec::Argv {
            argv: args.iter().map(|s| (*s).to_owned()).collect(),
        },
        ..shell("")
    }
}

/// Everything a process produced, checked for contiguous offsets.
#[derive(Debug, Default)]
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub exit: Option<ExitStatus>,
    /// Offset of the first byte seen per stream (stdout/pty, stderr).
    pub first_offsets: (Option<u64>, Option<u64>),
}

impl Collected {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Receives events until the exit (or until `until` returns true for the collected output), with
/// a deadline.
pub async fn collect_until(
    events: &mut ProcessEvents,
    timeout: Duration,
    mut until: impl FnMut(&Collected) -> bool,
) -> Collected {
    let mut c = Collected::default();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if until(&c) {
            return c;
        }
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no exit within {timeout:?}; so far: {:?} / {:?}",
                    c.stdout_str(),
                    c.stderr_str()
                )
            });
        match event {
            Some(ProcessEvent::Output { stream, offset, data }) => {
                let (buf, first) = match stream {
                    Stream::Stdout | Stream::Pty => (&mut c.stdout, &mut c.first_offsets.0),
                    Stream::Stderr => (&mut c.stderr, &mut c.first_offsets.1),
                };
                let base = *first.get_or_insert(offset);
                assert_eq!(offset, base + buf.len() as u64, "offsets are contiguous");
                assert!(data.len() <= 64 * 1024, "output frames carry at most 64 KiB");
                buf.extend_from_slice(&data);
            }
            Some(ProcessEvent::Exited(status)) => {
                c.exit = Some(status);
                return c;
            }
            None => return c,
        }
    }
}

/// Receives every event until the exit.
pub async fn collect(events: &mut ProcessEvents) -> Collected {
    let c = collect_until(events, Duration::from_secs(30), |_| false).await;
    assert!(c.exit.is_some(), "events ended without an exit");
    c
}

/// Waits (with a deadline) until `pid` no longer exists (or is a zombie).
pub async fn wait_gone(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if matches!(state, None | Some("Z") | Some("X")) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// Does `path` exist on the host?
pub fn exists(path: &Path) -> bool {
    path.symlink_metadata().is_ok()
}
