//! A real `paddock serve` for end-to-end tests that drive its REST API: start it on a free port, stop
//! it (SIGTERM) or kill it (SIGKILL), an HTTP client for its API, and the host-side views of what its
//! sandboxes hold (run directories, subvolumes, cgroups, the server's fds and threads, the store's
//! records). Declared by each test file that uses it with `#[path = "common/server.rs"] mod server;`
//! next to `mod common;`.

#![allow(dead_code, reason = "each test binary uses a different subset of the harness")]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::TestEnv;

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

    /// Starts a server with extra environment variables (a crash point, `PADDOCK_FAULT`), once it
    /// has recovered.
    pub fn restart_with_env(env: &TestEnv, args: &[&str], log: &str, vars: &[(&str, &str)]) -> Server {
        let server = Self::spawn_inner(env, &[], args, log, false, vars);
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
        assert_eq!(
            announced, first_start,
            "admin key announcement on this start: {seen:?}"
        );
        let admin_key = std::fs::read_to_string(env.state().join("admin.key"))
            .expect("admin.key")
            .trim()
            .to_owned();
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

/// An HTTP response: status and body.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON, asserting a 2xx status.
    #[track_caller]
    pub fn json(&self) -> Value {
        assert!(self.status.is_success(), "HTTP {}: {}", self.status, self.text());
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The lines of an NDJSON body.
    #[track_caller]
    pub fn ndjson(&self) -> Vec<Value> {
        assert!(self.status.is_success(), "HTTP {}: {}", self.status, self.text());
        self.text()
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad NDJSON line ({e}): {l}")))
            .collect()
    }
}

/// A client of a server's REST API (cheap to clone; clones share connections).
#[derive(Debug, Clone)]
pub struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    pub fn new(base: &str) -> Api {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .build()
            .expect("HTTP client");
        Api {
            base: base.to_owned(),
            http,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request whose body is `body` as `content_type` (an upload, an archive).
    pub async fn send_bytes(
        &self,
        key: &str,
        method: Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Reply {
        let resp = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key)
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: no answer: {e}"));
        let status = resp.status();
        let body = resp.bytes().await.expect("body").to_vec();
        Reply { status, body }
    }

    /// One request; `Err` only when no answer came (connection refused or broken, timeout).
    pub async fn try_request(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        accept: Option<&str>,
    ) -> Result<Reply, reqwest::Error> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(accept) = accept {
            req = req.header(reqwest::header::ACCEPT, accept);
        }
        let resp = req.send().await?;
        let status = resp.status();
        let body = resp.bytes().await?.to_vec();
        Ok(Reply { status, body })
    }

    pub async fn request(
        &self,
        key: &str,
        method: Method,
        path: &str,
        body: Option<&Value>,
        accept: Option<&str>,
    ) -> Reply {
        let shown = format!("{method} {path}");
        self.try_request(key, method, path, body, accept)
            .await
            .unwrap_or_else(|e| panic!("{shown}: {e}"))
    }

    /// `GET path` answered with JSON (asserting 2xx).
    pub async fn get(&self, key: &str, path: &str) -> Value {
        self.request(key, Method::GET, path, None, None).await.json()
    }

    /// `POST path` with a JSON body, answered with JSON (asserting 2xx).
    pub async fn post(&self, key: &str, path: &str, body: &Value) -> Value {
        self.request(key, Method::POST, path, Some(body), None)
            .await
            .json()
    }

    /// Creates an API key for `tenant` with `admin_key`; returns the key.
    pub async fn create_key(&self, admin_key: &str, tenant: &str) -> String {
        let created = self
            .post(admin_key, "/v1/keys", &json!({ "tenant": tenant, "name": "e2e" }))
            .await;
        created["key"].as_str().expect("key").to_owned()
    }

    /// Makes `tenant`'s quota unlimited.
    pub async fn unlimited_quota(&self, admin_key: &str, tenant: &str) {
        self.request(
            admin_key,
            Method::PUT,
            &format!("/v1/tenants/{tenant}/quota"),
            Some(&json!({})),
            None,
        )
        .await
        .json();
    }

    /// Creates a sandbox; returns its info.
    pub async fn create_sandbox(&self, key: &str, body: &Value) -> Value {
        let reply = self
            .request(key, Method::POST, "/v1/sandboxes", Some(body), None)
            .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());
        reply.json()
    }

    pub async fn sandbox(&self, key: &str, id: &str) -> Value {
        self.get(key, &format!("/v1/sandboxes/{id}")).await
    }

    /// Kills and removes a sandbox.
    pub async fn delete_sandbox(&self, key: &str, id: &str) {
        let reply = self
            .request(key, Method::DELETE, &format!("/v1/sandboxes/{id}"), None, None)
            .await;
        assert_eq!(reply.status, StatusCode::NO_CONTENT, "{}", reply.text());
    }

    /// A foreground exec answered in the `accept` format; `Err` when no answer came.
    pub async fn try_exec(&self, key: &str, id: &str, req: &Value, accept: &str) -> Result<Reply, String> {
        self.try_request(
            key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(req),
            Some(accept),
        )
        .await
        .map_err(|e| e.to_string())
    }

    /// A foreground exec answered as one JSON document (`ExecResult`).
    pub async fn exec_json(&self, key: &str, id: &str, req: &Value) -> Reply {
        self.request(
            key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(req),
            Some("application/json"),
        )
        .await
    }

    /// A foreground exec streamed as NDJSON events.
    pub async fn exec_ndjson(&self, key: &str, id: &str, req: &Value) -> Reply {
        self.request(
            key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(req),
            Some("application/x-ndjson"),
        )
        .await
    }

    /// Runs `script` with `sh -c` and returns its stdout, asserting exit status 0.
    pub async fn sh(&self, key: &str, id: &str, script: &str) -> String {
        let result = self.exec_json(key, id, &json!({ "shell": script })).await.json();
        assert_eq!(result["exit"]["exit_code"], 0, "`{script}` in {id}: {result}");
        result["stdout"].as_str().expect("stdout").to_owned()
    }

    /// Every audit row (admin key), oldest first.
    pub async fn audit_all(&self, admin_key: &str) -> Vec<Value> {
        self.audit_rows(admin_key, "").await
    }

    /// Every audit row matching `filter` (a query string without `limit`/`after_seq`, e.g.
    /// `action=process.`), oldest first.
    pub async fn audit_rows(&self, admin_key: &str, filter: &str) -> Vec<Value> {
        let mut rows = Vec::new();
        let mut after = None::<u64>;
        loop {
            let mut path = String::from("/v1/audit?limit=1000");
            if !filter.is_empty() {
                path.push('&');
                path.push_str(filter);
            }
            if let Some(a) = after {
                path.push_str(&format!("&after_seq={a}"));
            }
            let page = self.get(admin_key, &path).await;
            rows.extend(page["records"].as_array().expect("records").iter().cloned());
            match page["next_after_seq"].as_u64() {
                Some(next) => after = Some(next),
                None => return rows,
            }
        }
    }

    /// `GET /v1/audit/verify`.
    pub async fn verify_audit(&self, admin_key: &str) -> Value {
        self.get(admin_key, "/v1/audit/verify").await
    }

    /// The value of one metric series, e.g. `paddock_warm_pool_size{template="default"}`.
    pub async fn metric(&self, key: &str, series: &str) -> Option<f64> {
        let text = self
            .request(key, Method::GET, "/metrics", None, None)
            .await
            .text();
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(series)?;
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
    }

    /// Waits until the default template's warm pool holds `n` sandboxes.
    pub async fn wait_warm_pool(&self, key: &str, n: u32, deadline: Duration) {
        let series = "paddock_warm_pool_size{template=\"default\"}";
        let start = Instant::now();
        loop {
            let have = self.metric(key, series).await;
            if have == Some(f64::from(n)) {
                return;
            }
            assert!(
                start.elapsed() < deadline,
                "the warm pool did not reach {n} within {deadline:?} (it holds {have:?})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Waits for `cond` with a deadline (async).
pub async fn wait_for(deadline: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < deadline {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cond().await
}

/// A sandbox as the store records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSandbox {
    pub id: String,
    pub state: String,
    pub tenant: Option<String>,
    pub end_reason: Option<String>,
}

/// Rows of a read-only query on the store, each row a list of JSON values. Read through the store
/// crate opened read-only (no SQL outside it is run by paddock's code; an outside SQLite cannot read a
/// database paddock has open, see `paddock_store::SHM_DIRECTORY`).
pub fn store_query(env: &TestEnv, sql: &str) -> Vec<Vec<Value>> {
    let db = env.state().join("paddock.db");
    let store = paddock_store::Store::open_read_only(&db).expect("open the store read-only");
    store
        .inspect(sql)
        .unwrap_or_else(|e| panic!("query {sql:?} failed: {e:#}"))
}

/// Every sandbox the store records.
pub fn store_sandboxes(env: &TestEnv) -> Vec<StoredSandbox> {
    let text = |v: &Value| v.as_str().map(str::to_owned);
    store_query(
        env,
        "SELECT id, state, tenant, end_reason FROM sandboxes ORDER BY created_at_ms",
    )
    .into_iter()
    .map(|row| StoredSandbox {
        id: text(&row[0]).expect("id"),
        state: text(&row[1]).expect("state"),
        tenant: text(&row[2]),
        end_reason: text(&row[3]),
    })
    .collect()
}

/// Ids of the store's sandboxes in one of `states`.
pub fn store_ids(env: &TestEnv, states: &[&str]) -> BTreeSet<String> {
    store_sandboxes(env)
        .into_iter()
        .filter(|s| states.contains(&s.state.as_str()))
        .map(|s| s.id)
        .collect()
}

fn dir_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Entries of `<state>/run`.
pub fn run_dirs(env: &TestEnv) -> BTreeSet<String> {
    dir_names(&env.state().join("run"))
}

/// Entries of `<state>/pool/sandboxes` (one subvolume each).
pub fn subvolumes(env: &TestEnv) -> BTreeSet<String> {
    dir_names(&env.state().join("pool/sandboxes"))
}

/// The sandbox cgroups under the environment's parent, per mounted hierarchy that has the parent.
pub fn cgroups(env: &TestEnv) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    let mut roots: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    roots.push("/sys/fs/cgroup".into());
    for root in roots {
        let parent = root.join(&env.cgroup_parent);
        if !parent.is_dir() {
            continue;
        }
        let ids = std::fs::read_dir(&parent)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().is_dir())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        out.insert(root.display().to_string(), ids);
    }
    out
}

/// Asserts every hierarchy holds exactly the cgroups of `ids`.
#[track_caller]
pub fn assert_cgroups_are(env: &TestEnv, ids: &BTreeSet<String>) {
    let all = cgroups(env);
    assert!(
        !all.is_empty() || ids.is_empty(),
        "no cgroup hierarchy has the parent"
    );
    for (hierarchy, have) in all {
        assert_eq!(&have, ids, "cgroups under {hierarchy}/{}", env.cgroup_parent);
    }
}

/// Sandbox ids of the environment's host processes (from their cgroup paths), with (pid, cmdline).
/// Zombies are left out: they hold nothing but a pid, and the host's init reaps them late.
pub fn sandbox_processes(env: &TestEnv) -> BTreeMap<String, Vec<(i32, String)>> {
    let marker = format!("/{}/", env.cgroup_parent);
    let mut out: BTreeMap<String, Vec<(i32, String)>> = BTreeMap::new();
    for (pid, cmdline) in env.processes() {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if zombie {
            continue;
        }
        let Ok(cg) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            continue;
        };
        let id = cg.lines().find_map(|l| {
            let (_, after) = l.split_once(&marker)?;
            Some(after.split('/').next().unwrap_or(after).to_owned())
        });
        if let Some(id) = id {
            out.entry(id).or_default().push((pid, cmdline));
        }
    }
    out
}

/// Open file descriptors of process `pid`.
pub fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("/proc/<pid>/fd")
        .count()
}

/// The server's open file descriptors by kind (`socket`, `anon_inode:[pidfd]`, a path ...), to show
/// what leaked.
pub fn fd_kinds(pid: i32) -> BTreeMap<String, usize> {
    let mut kinds = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for e in rd.flatten() {
            let target = std::fs::read_link(e.path())
                .map(|t| t.display().to_string())
                .unwrap_or_default();
            let kind = match target.split_once(':') {
                Some((k, _)) if !target.starts_with('/') && k != "anon_inode" => k.to_owned(),
                _ => target,
            };
            *kinds.entry(kind).or_default() += 1;
        }
    }
    kinds
}

/// Threads of process `pid`.
pub fn threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("/proc/<pid>/task")
        .count()
}

/// Lines of this process's mount table that mention the state directory.
pub fn state_mounts(env: &TestEnv) -> Vec<String> {
    let state = env.state().to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&state))
        .map(str::to_owned)
        .collect()
}

/// `paddock audit verify` on the state directory: exits 0 and says the log is intact.
#[track_caller]
pub fn cli_audit_verify(env: &TestEnv) -> String {
    let o = env
        .cmd()
        .args(["audit", "verify"])
        .output()
        .expect("paddock runs");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "paddock audit verify: {:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.starts_with("audit log intact: "), "{out}");
    out
}

/// `paddock gc` on the state directory (after the server stopped): reclaims what no process owns.
#[track_caller]
pub fn cli_gc(env: &TestEnv) -> String {
    let o = env.cmd().arg("gc").output().expect("paddock runs");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "paddock gc: {:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out
}
