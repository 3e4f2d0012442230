//! Human approval end to end, on a real `paddock serve`: the queue's changes reach a signed
//! webhook (retried until it answers) and the SSE stream; a pending approval survives a `kill -9`
//! and restart with nothing run on its own; a workload inside the sandbox cannot change or bypass
//! its policy.

mod executions;
mod restart;
mod webhook;

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::server::Api;

/// How long an expected webhook delivery may take (a safety net; deliveries come in milliseconds).
pub const DELIVERY_DEADLINE: Duration = Duration::from_secs(60);

/// Asks a person before any `touch`, allows everything else.
pub fn ask_touch() -> Value {
    json!({"default": "allow", "rules": [
        {"verdict": "ask", "reason": "touch needs a person", "exec": {"program": {"glob": "touch"}}}]})
}

/// A key of `tenant` made with the approver permission.
pub async fn approver_key(api: &Api, admin: &str, tenant: &str) -> (String, String) {
    let made = api
        .post(
            admin,
            "/v1/keys",
            &json!({"tenant": tenant, "name": "approver", "approver": true}),
        )
        .await;
    (
        made["key"].as_str().expect("key").to_owned(),
        made["id"].as_str().expect("id").to_owned(),
    )
}

/// A tenant whose policy asks before any `touch`: a plain key with a sandbox, and an approver.
pub struct Asking {
    pub plain: String,
    pub approver: String,
    pub approver_id: String,
    pub sandbox: String,
}

/// Makes [`Asking`] for `tenant`: its keys, the tenant policy [`ask_touch`], the plain key's sandbox.
pub async fn asking_tenant(api: &Api, admin: &str, tenant: &str) -> Asking {
    let plain = api.create_key(admin, tenant).await;
    let (approver, approver_id) = approver_key(api, admin, tenant).await;
    api.request(
        &approver,
        Method::PUT,
        "/v1/policy",
        Some(&json!({"policy": ask_touch()})),
        None,
    )
    .await
    .json();
    let sandbox = api.create_sandbox(&plain, &json!({})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    Asking {
        plain,
        approver,
        approver_id,
        sandbox,
    }
}

/// An exec request answered as one JSON document: its status and body.
pub async fn exec(api: &Api, key: &str, id: &str, req: &Value) -> (u16, Value) {
    let reply = api
        .request(
            key,
            Method::POST,
            &format!("/v1/sandboxes/{id}/exec"),
            Some(req),
            Some("application/json"),
        )
        .await;
    (reply.status.as_u16(), reply.json_any())
}

/// Whether `path` exists in sandbox `id`.
pub async fn exists(api: &Api, key: &str, id: &str, path: &str) -> bool {
    api.sh(key, id, &format!("test -e {path} && echo yes || echo no"))
        .await
        .trim()
        == "yes"
}

/// The webhook receiver (`webhook_receiver.py`), a real HTTP server on 127.0.0.1, and the JSON
/// lines it prints for each request it gets.
pub struct Receiver {
    child: Child,
    pub port: u16,
    lines: mpsc::Receiver<String>,
}

impl Receiver {
    /// Starts it with the key in `key_file`, answering the first `failures` requests with 503.
    pub fn start(key_file: &std::path::Path, failures: u32) -> Receiver {
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/e2e/approvals/webhook_receiver.py"
        );
        let mut child = Command::new("python3")
            .arg(script)
            .arg(key_file)
            .arg(failures.to_string())
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("python3 runs the receiver");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let first = lines
            .recv_timeout(DELIVERY_DEADLINE)
            .expect("the receiver starts");
        let port = first
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("not a listening line: {first}"));
        Receiver { child, port, lines }
    }

    /// The next request it got.
    pub fn next(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(DELIVERY_DEADLINE)
            .expect("a webhook request in time");
        serde_json::from_str(&line).expect("a JSON line")
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
