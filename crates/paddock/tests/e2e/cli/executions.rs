//! Approved executions from the command line, against the in-process service and its `sandbox`
//! executor: a plain key's `paddock execution propose --wait` names the execution and its approval
//! and waits; an approver key approves it with `paddock approvals approve`; the waiting command
//! prints the logs and exits with the command's exit code; `ls` and `show` report it. A second
//! waiting proposal is cancelled: it never runs, and its waiter says so in one line.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{harness_client, harness_run, ok};
use crate::support::harness::Harness;
use crate::support::{assert_code, stderr, wait_until};

/// Safety nets only: a line is expected within moments, an approved execution within seconds.
const LINE_DEADLINE: Duration = Duration::from_secs(60);
const RUN_DEADLINE: Duration = Duration::from_secs(180);

#[track_caller]
fn ok_json(o: &Output) -> Value {
    let text = ok(o);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// A `paddock execution propose --wait` running in the background: its stderr read line by line
/// on a thread, its stdout collected at its end.
struct Waiter {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Waiter {
    fn start(h: &Harness, key: &str, args: &[&str]) -> Waiter {
        let mut child = harness_client(h, key)
            .args(["execution", "propose", "--wait"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("paddock runs");
        let err = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Waiter { child, lines }
    }

    /// The first line: `execution ex-... is pending approval apr_...: ...`; the two ids.
    fn proposed(&self) -> (String, String) {
        let line = self
            .lines
            .recv_timeout(LINE_DEADLINE)
            .expect("the waiter names the execution");
        ids(&line)
    }

    /// Waits for it to end: its exit status, stdout, and the rest of its stderr.
    fn end(mut self) -> (Option<i32>, String, Vec<String>) {
        let mut status = None;
        let ended = wait_until(RUN_DEADLINE, || {
            status = self.child.try_wait().expect("try_wait");
            status.is_some()
        });
        assert!(ended, "the waiting paddock did not end");
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut out)
            .expect("read stdout");
        // Its stderr ends with it: the reader thread sends what is left and hangs up.
        let rest = self.lines.iter().collect();
        (status.and_then(|s| s.code()), out, rest)
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The execution and approval ids a proposal line names.
#[track_caller]
fn ids(line: &str) -> (String, String) {
    let word = |prefix: &str| {
        line.split(|c: char| c.is_whitespace() || c == ':' || c == '`')
            .find(|w| w.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} id in {line:?}"))
            .to_owned()
    };
    assert!(line.starts_with("execution ex-"), "{line}");
    assert!(line.contains("pending approval"), "{line}");
    (word("ex-"), word("apr_"))
}

#[test]
fn a_proposed_execution_runs_once_approved_and_the_waiter_exits_with_its_code() {
    let h = Harness::start();
    let (plain, approver) = h.block_on(async {
        let plain = h.admin.new_tenant("cli-executions").await;
        let approver = h
            .admin
            .new_tenant_with("cli-executions", json!({"approver": true}))
            .await;
        (plain, approver)
    });
    let plain_key = plain.key.clone().expect("key");
    let plain_id = plain.key_id.clone().expect("key id");
    let approver_key = approver.key.clone().expect("key");
    let approver_id = approver.key_id.clone().expect("key id");

    // Proposed and waited on; nothing runs until a person approves.
    let waiter = Waiter::start(
        &h,
        &plain_key,
        &[
            "--description",
            "print a greeting, then fail",
            "--task",
            "t-1",
            "--timeout",
            "2m",
            "--",
            "sh",
            "-c",
            "echo hello; exit 4",
        ],
    );
    let (ex, apr) = waiter.proposed();
    let listed = ok_json(&harness_run(&h, &plain_key, &["execution", "ls", "--json"]));
    let ours = &listed["executions"][0];
    assert_eq!(
        (&ours["id"], &ours["approval_id"], &ours["state"]),
        (&json!(ex), &json!(apr), &json!("pending_approval")),
        "{listed}"
    );
    assert_eq!(
        ours["request"]["command"],
        json!(["sh", "-c", "echo hello; exit 4"]),
        "{listed}"
    );
    assert_eq!(ours["request"]["timeout_secs"], 120, "{listed}");
    let table = ok(&harness_run(&h, &plain_key, &["execution", "ls"]));
    let mut lines = table.lines();
    let header = lines.next().expect("header");
    for column in [
        "ID",
        "STATE",
        "EXECUTOR",
        "COMMAND",
        "REQUESTED BY",
        "APPROVED BY",
        "AGE",
    ] {
        assert!(header.contains(column), "{table}");
    }
    let row = lines.next().expect("a row");
    assert!(
        row.starts_with(&ex)
            && row.contains("pending_approval")
            && row.contains("sandbox")
            && row.contains("sh -c 'echo hello; exit 4'")
            && row.contains(&plain_id),
        "{table}"
    );

    // The approver approves it; the waiter prints the logs and exits with the command's code.
    let o = harness_run(&h, &approver_key, &["approvals", "approve", &apr, "--note", "ok"]);
    assert_eq!(ok(&o), format!("approved {apr}\n"));
    let (code, out, err) = waiter.end();
    assert_eq!((code, out.as_str()), (Some(4), "hello\n"), "stderr: {err:?}");
    assert!(err.is_empty(), "nothing more on stderr: {err:?}");

    let shown = ok_json(&harness_run(
        &h,
        &plain_key,
        &["execution", "show", &ex, "--json"],
    ));
    assert_eq!(
        (
            &shown["state"],
            &shown["exit_code"],
            &shown["approved_by"],
            &shown["requested_by"]
        ),
        (&json!("failed"), &json!(4), &json!(approver_id), &json!(plain_id)),
        "{shown}"
    );
    assert_eq!(
        (&shown["task_id"], &shown["logs"], &shown["executor"]),
        (&json!("t-1"), &json!("hello\n"), &json!("sandbox")),
        "{shown}"
    );
    let text = ok(&harness_run(&h, &plain_key, &["execution", "show", &ex]));
    for needle in [
        format!("id             {ex}\n"),
        "state          failed\n".to_owned(),
        "command        sh -c 'echo hello; exit 4'\n".to_owned(),
        format!("approved by    {approver_id}\n"),
        "exit code      4\n".to_owned(),
    ] {
        assert!(text.contains(&needle), "expected {needle:?} in {text}");
    }
    assert!(text.ends_with("logs:\nhello\n"), "{text}");

    // A second waiting proposal is cancelled: it never runs; its waiter says so in one line.
    let waiter = Waiter::start(
        &h,
        &plain_key,
        &["-d", "never approved", "--", "sh", "-c", "echo never"],
    );
    let (second, second_apr) = waiter.proposed();
    assert_ne!(second, ex);
    assert_eq!(
        ok(&harness_run(&h, &plain_key, &["execution", "cancel", &second])),
        format!("cancelled {second}\n")
    );
    let (code, out, err) = waiter.end();
    assert_eq!((code, out.as_str()), (Some(1), ""), "stderr: {err:?}");
    assert_eq!(err.len(), 1, "one line: {err:?}");
    assert!(
        err[0].starts_with(&format!("paddock: execution {second} was cancelled")),
        "{err:?}"
    );
    let shown = ok_json(&harness_run(
        &h,
        &plain_key,
        &["execution", "show", &second, "--json"],
    ));
    assert_eq!(shown["state"], "cancelled", "{shown}");
    assert!(shown.get("exit_code").is_none(), "{shown}");
    let approval = ok_json(&harness_run(
        &h,
        &approver_key,
        &["approvals", "show", &second_apr, "--json"],
    ));
    assert_eq!(approval["state"], "rejected", "{approval}");
    // Cancelling an ended one leaves it as it is; an unknown one is an error in one line.
    assert_eq!(
        ok(&harness_run(&h, &plain_key, &["execution", "cancel", &ex])),
        format!("execution {ex} had already ended: failed\n")
    );
    let o = harness_run(&h, &plain_key, &["execution", "show", "ex-missing"]);
    assert_code(&o, 1);
    assert!(stderr(&o).contains("(execution_not_found)"), "{}", stderr(&o));
}
