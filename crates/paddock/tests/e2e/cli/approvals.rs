//! The approvals queue from the command line, against the in-process service: an approver key sets
//! the tenant's policy (`paddock policy set -`); a plain key's `paddock sandbox exec` of a command
//! the policy asks about fails at once with `approval_pending`, naming the approval and how to run
//! it; the approver lists, watches and approves it; the plain key's rerun with `--approval` runs the
//! command once, and a second rerun is refused with `approval_expired`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{harness_client, harness_run, ok};
use crate::support::harness::Harness;
use crate::support::{assert_code, stderr};

/// A safety net only: each awaited line is expected within moments.
const LINE_DEADLINE: Duration = Duration::from_secs(60);

/// The one-line error of a failed client command (exit status 1).
#[track_caller]
fn fails(o: &Output, needles: &[&str]) -> String {
    assert_code(o, 1);
    let err = stderr(o);
    assert!(err.starts_with("paddock: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for needle in needles {
        assert!(err.contains(needle), "expected {needle:?} in {err}");
    }
    err
}

/// `paddock approvals ls --watch --json`, its stdout read line by line on a thread.
struct Watcher {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watcher {
    fn start(h: &Harness, key: &str) -> Watcher {
        let mut child = harness_client(h, key)
            .args(["approvals", "ls", "--watch", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("paddock runs");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Watcher { child, lines }
    }

    /// The next line, as JSON.
    fn next(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(LINE_DEADLINE)
            .expect("the watcher prints its next line");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not one JSON object ({e}): {line}"))
    }

    /// Reads events until `event` about approval `id`; returns that approval.
    fn until(&self, event: &str, id: &str) -> Value {
        loop {
            let e = self.next();
            if e["event"] == event && e["approval"]["id"] == id {
                return e["approval"].clone();
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn an_approver_approves_a_held_exec_and_the_rerun_runs_it_once() {
    let h = Harness::start();
    let (plain, approver, id) = h.block_on(async {
        let plain = h.admin.new_tenant("cli-approvals").await;
        let approver = h
            .admin
            .new_tenant_with("cli-approvals", json!({"approver": true}))
            .await;
        let id = plain.create_sandbox(json!({})).await;
        (plain, approver, id)
    });
    let plain_key = plain.key.clone().expect("key");
    let approver_key = approver.key.clone().expect("key");
    let approver_id = approver.key_id.clone().expect("key id");

    // The approver sets the tenant's policy from stdin; a plain key may read it.
    let policy = json!({"default": "allow", "rules": [
        {"verdict": "ask", "exec": {"program": {"glob": "touch"}}}]});
    let mut set = harness_client(&h, &approver_key)
        .args(["policy", "set", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("paddock runs");
    set.stdin
        .take()
        .expect("stdin")
        .write_all(policy.to_string().as_bytes())
        .expect("write the policy");
    let o = set.wait_with_output().expect("wait");
    assert_eq!(ok(&o), "policy of the tenant set\n");
    let shown: Value =
        serde_json::from_str(&ok(&harness_run(&h, &plain_key, &["policy", "get"]))).expect("JSON");
    assert_eq!(shown, policy);
    fails(
        &harness_run(&h, &plain_key, &["policy", "delete"]),
        &["(forbidden)"],
    );

    // Watching first: its first line (the list) is printed once it listens.
    let watcher = Watcher::start(&h, &approver_key);
    assert_eq!(watcher.next(), json!({"approvals": []}));

    // The plain key's exec is held: nothing runs, and the error says how to go on.
    let exec = [
        "sandbox",
        "exec",
        id.as_str(),
        "--approval-wait",
        "0s",
        "--",
        "touch",
        "/tmp/x",
    ];
    let err = fails(&harness_run(&h, &plain_key, &exec), &["(approval_pending)"]);
    let listed: Value = serde_json::from_str(&ok(&harness_run(
        &h,
        &approver_key,
        &["approvals", "ls", "--state", "pending", "--json"],
    )))
    .expect("JSON");
    let pending = listed["approvals"].as_array().expect("approvals");
    assert_eq!(pending.len(), 1, "{listed}");
    let apr = pending[0]["id"].as_str().expect("id").to_owned();
    assert!(apr.starts_with("apr_"), "{apr}");
    assert_eq!(
        (&pending[0]["state"], &pending[0]["kind"], &pending[0]["summary"]),
        (&json!("pending"), &json!("exec"), &json!("touch /tmp/x")),
        "{listed}"
    );
    assert_eq!(pending[0]["sandbox_id"], id.as_str(), "{listed}");
    for needle in [
        format!("approval {apr} is pending"),
        format!("paddock approvals approve {apr}"),
        format!("--approval {apr}"),
    ] {
        assert!(err.contains(&needle), "expected {needle:?} in {err}");
    }
    let requested = watcher.until("requested", &apr);
    assert_eq!(requested["summary"], "touch /tmp/x", "{requested}");
    let o = harness_run(
        &h,
        &plain_key,
        &["sandbox", "exec", &id, "--", "test", "-e", "/tmp/x"],
    );
    assert_code(&o, 1);

    // The table, for a person.
    let table = ok(&harness_run(&h, &approver_key, &["approvals", "ls"]));
    let mut lines = table.lines();
    let header = lines.next().expect("header");
    for column in [
        "ID",
        "STATE",
        "KIND",
        "SANDBOX",
        "SUMMARY",
        "REQUESTED BY",
        "AGE",
        "EXPIRES",
    ] {
        assert!(header.contains(column), "{table}");
    }
    let row = lines.next().expect("a row");
    assert!(
        row.starts_with(&apr)
            && row.contains("pending")
            && row.contains("touch /tmp/x")
            && row.contains("in "),
        "{table}"
    );

    // The approver approves it; a second decision is refused in one line.
    let o = harness_run(&h, &approver_key, &["approvals", "approve", &apr, "--note", "ok"]);
    assert_eq!(ok(&o), format!("approved {apr}\n"));
    let approved = watcher.until("approved", &apr);
    assert_eq!(
        (&approved["decided_by"], &approved["note"]),
        (&json!(approver_id), &json!("ok")),
        "{approved}"
    );
    fails(
        &harness_run(&h, &approver_key, &["approvals", "reject", &apr]),
        &["(approval_decided)"],
    );

    // The rerun under the approval runs the command, once.
    let rerun = [
        "sandbox",
        "exec",
        id.as_str(),
        "--approval",
        apr.as_str(),
        "--",
        "touch",
        "/tmp/x",
    ];
    ok(&harness_run(&h, &plain_key, &rerun));
    ok(&harness_run(
        &h,
        &plain_key,
        &["sandbox", "exec", &id, "--", "test", "-e", "/tmp/x"],
    ));
    watcher.until("used", &apr);
    fails(
        &harness_run(&h, &plain_key, &rerun),
        &["(approval_expired)", &apr],
    );

    // Every field of it, as JSON and for a person.
    let shown: Value = serde_json::from_str(&ok(&harness_run(
        &h,
        &plain_key,
        &["approvals", "show", &apr, "--json"],
    )))
    .expect("JSON");
    assert_eq!(shown["state"], "approved", "{shown}");
    assert!(shown["used_at"].is_string(), "{shown}");
    assert_eq!(shown["request"]["argv"], json!(["touch", "/tmp/x"]), "{shown}");
    let text = ok(&harness_run(&h, &plain_key, &["approvals", "show", &apr]));
    for needle in [
        format!("id             {apr}"),
        "note           ok".to_owned(),
        "request:".to_owned(),
    ] {
        assert!(text.contains(&needle), "expected {needle:?} in {text}");
    }
    assert!(!text.contains("used           -"), "used is shown: {text}");
    fails(
        &harness_run(&h, &plain_key, &["approvals", "show", "apr_missing"]),
        &["(approval_not_found)"],
    );

    // The policy goes; nothing is held any more.
    assert_eq!(
        ok(&harness_run(&h, &approver_key, &["policy", "delete"])),
        "policy of the tenant deleted\n"
    );
    fails(
        &harness_run(&h, &plain_key, &["policy", "get"]),
        &["(policy_not_found)"],
    );
    ok(&harness_run(&h, &plain_key, &exec));
    drop(watcher);
}
