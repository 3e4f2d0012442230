//! Approved executions on the built-in sandbox executor: proposed, nothing runs until a second key
//! approves; approved, it runs once in a fresh sandbox (removed afterwards) and its exit code,
//! capped logs and approver are recorded, each step with its audit row; rejected or cancelled
//! before approval it never runs; cancelled while running it is ended; past its timeout it is
//! `timed_out`; a repeated client id answers the first execution.

use std::time::Duration;

use paddock_control::Principal;
use paddock_types::api::{
    CreateExecutionRequest, DecideApprovalRequest, ErrorCode, ExecutionInfo, ExecutionState,
    ListExecutionsQuery,
};
use serde_json::json;

use crate::fixture::{body, code, poll, Fixture};

async fn approver(f: &Fixture) -> Principal {
    let made = f
        .service
        .create_key(&f.admin, body(json!({"tenant": "tenant-a", "approver": true})))
        .await
        .expect("key");
    f.service.authenticate(&made.key).await.expect("the key works")
}

fn request(command: &[&str]) -> CreateExecutionRequest {
    body(json!({
        "command": command,
        "description": "restart the worker that leaks memory",
        "session_id": "s-1",
        "task_id": "t-9",
    }))
}

/// Waits for execution `id` to reach a final state.
async fn ended(f: &Fixture, p: &Principal, id: &str) -> ExecutionInfo {
    poll(&format!("execution {id} ends"), || async {
        let info = f.service.get_execution(p, id).await.expect("get");
        info.state.is_final().then_some(info)
    })
    .await
}

/// How many sandboxes tenant-a has running.
async fn running_sandboxes(f: &Fixture) -> usize {
    f.service
        .list_sandboxes(&f.a, body(json!({})))
        .await
        .expect("list")
        .sandboxes
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_execution_runs_once_in_a_fresh_sandbox_with_its_logs_and_approver() {
    let f = Fixture::start().await;
    let approver = approver(&f).await;
    let asked = f
        .service
        .create_execution(&f.a, request(&["sh", "-c", "echo fixed; echo warn >&2; exit 0"]))
        .await
        .expect("asked");
    assert_eq!(asked.state, ExecutionState::PendingApproval);
    assert_eq!(asked.executor, "sandbox");
    assert_eq!(running_sandboxes(&f).await, 0, "nothing runs before the approval");
    let approval = f
        .service
        .get_approval(&approver, &asked.approval_id)
        .await
        .expect("its approval");
    assert_eq!(approval.summary, "sh -c echo fixed; echo warn >&2; exit 0");
    assert_eq!(
        approval.request["description"],
        "restart the worker that leaks memory"
    );
    // The asking key cannot approve it; another tenant cannot see it.
    assert_eq!(
        code(
            f.service
                .approve(&f.a, &asked.approval_id, DecideApprovalRequest::default())
                .await
        ),
        ErrorCode::Forbidden
    );
    assert_eq!(
        code(f.service.get_execution(&f.b, &asked.id).await),
        ErrorCode::ExecutionNotFound
    );
    f.service
        .approve(&approver, &asked.approval_id, body(json!({"note": "go"})))
        .await
        .expect("approved");
    let done = ended(&f, &f.a, &asked.id).await;
    assert_eq!(done.state, ExecutionState::Succeeded, "{done:?}");
    assert_eq!(done.exit_code, Some(0));
    let logs = done.logs.clone().unwrap_or_default();
    assert!(logs.contains("fixed") && logs.contains("warn"), "{logs:?}");
    assert!(!done.logs_truncated);
    assert_eq!(done.approved_by.as_deref(), Some(approver.key_id.as_str()));
    assert!(
        done.object.as_deref().is_some_and(|o| o.starts_with("sb-")),
        "{done:?}"
    );
    assert!(done.started_at.is_some() && done.finished_at.is_some());
    poll("the execution's sandbox is removed", || async {
        (running_sandboxes(&f).await == 0).then_some(())
    })
    .await;
    // Every step, in order, with the approver and the approval in the start row.
    let actions: Vec<String> = f
        .audit(Default::default())
        .await
        .into_iter()
        .map(|r| r.action)
        .filter(|a| a.starts_with("execution.") || a.starts_with("approval."))
        .collect();
    assert_eq!(
        actions,
        [
            "approval.request",
            "execution.request",
            "approval.approve",
            "execution.start",
            "execution.finish"
        ]
    );
    let start = f.rows("execution.start").await.pop().expect("start row");
    assert_eq!(start.detail["approved_by"], approver.key_id.as_str());
    let process = f
        .rows("process.start")
        .await
        .into_iter()
        .find(|r| r.detail["approval_id"] == asked.approval_id.as_str())
        .expect("the process's start row names the approval");
    assert_eq!(
        process.key_id.as_deref(),
        Some(format!("execution:{}", asked.id).as_str())
    );
    let finish = f.rows("execution.finish").await.pop().expect("finish row");
    assert_eq!(
        (finish.detail["exit_code"].as_i64(), finish.outcome.as_str()),
        (Some(0), "succeeded")
    );
    let listed = f
        .service
        .list_executions(&f.a, ListExecutionsQuery::default())
        .await
        .expect("list");
    assert_eq!(listed.executions.len(), 1);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_or_cancelled_before_approval_it_never_runs_and_a_repeated_id_is_one_execution() {
    let f = Fixture::start().await;
    let approver = approver(&f).await;
    let rejected = f
        .service
        .create_execution(&f.a, request(&["touch", "/tmp/never"]))
        .await
        .expect("asked");
    f.service
        .reject(&approver, &rejected.approval_id, DecideApprovalRequest::default())
        .await
        .expect("rejected");
    let done = ended(&f, &f.a, &rejected.id).await;
    assert_eq!(done.state, ExecutionState::Rejected, "{done:?}");
    assert_eq!(done.object, None);

    let mut with_id = request(&["touch", "/tmp/never"]);
    with_id.id = Some("remediation-42".into());
    let first = f
        .service
        .create_execution(&f.a, with_id.clone())
        .await
        .expect("asked");
    let again = f.service.create_execution(&f.a, with_id).await.expect("answered");
    assert_eq!(
        (again.id.as_str(), again.approval_id.as_str()),
        (first.id.as_str(), first.approval_id.as_str())
    );
    let cancelled = f
        .service
        .cancel_execution(&f.a, &first.id)
        .await
        .expect("cancelled");
    assert_eq!(cancelled.state, ExecutionState::Cancelled);
    assert_eq!(
        code(
            f.service
                .approve(&approver, &first.approval_id, DecideApprovalRequest::default())
                .await
        ),
        ErrorCode::ApprovalDecided
    );
    assert_eq!(running_sandboxes(&f).await, 0);
    assert!(f.rows("execution.start").await.is_empty());
    assert_eq!(f.rows("execution.cancel").await.len(), 1);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_execution_is_cancelled_or_timed_out_and_its_logs_are_capped() {
    let f = Fixture::with(|c| {
        c.executions.log_limit = 64;
        c.executions.poll_interval = Duration::from_millis(20);
    })
    .await;
    let approver = approver(&f).await;
    // Cancelled while it runs (it would run for ten minutes).
    let long = f
        .service
        .create_execution(&f.a, request(&["sh", "-c", "echo started; sleep 600"]))
        .await
        .expect("asked");
    f.service
        .approve(&approver, &long.approval_id, DecideApprovalRequest::default())
        .await
        .expect("approved");
    poll("the long execution runs", || async {
        let info = f.service.get_execution(&f.a, &long.id).await.expect("get");
        (info.state == ExecutionState::Running && info.object.is_some()).then_some(())
    })
    .await;
    let cancelled = f
        .service
        .cancel_execution(&f.a, &long.id)
        .await
        .expect("cancelled");
    assert_eq!(cancelled.state, ExecutionState::Cancelled, "{cancelled:?}");
    poll("the cancelled execution's sandbox is removed", || async {
        (running_sandboxes(&f).await == 0).then_some(())
    })
    .await;

    // Past its timeout: ended, timed_out; its output cut at the limit, and saying so.
    let long_line = format!("echo {}; sleep 600", "paddock ".repeat(40));
    let mut slow = request(&["sh", "-c", &long_line]);
    slow.timeout_secs = Some(1);
    let slow = f.service.create_execution(&f.a, slow).await.expect("asked");
    f.service
        .approve(&approver, &slow.approval_id, DecideApprovalRequest::default())
        .await
        .expect("approved");
    let done = ended(&f, &f.a, &slow.id).await;
    assert_eq!(done.state, ExecutionState::TimedOut, "{done:?}");
    assert!(done.logs_truncated);
    assert_eq!(done.logs.as_deref().map(str::len), Some(64));
    let finish = f
        .rows("execution.finish")
        .await
        .into_iter()
        .find(|r| r.detail["execution_id"] == slow.id.as_str())
        .expect("its finish row");
    assert_eq!(finish.outcome, "timed_out");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_naming_their_field() {
    let f = Fixture::start().await;
    for (req, field) in [
        (json!({"command": [], "description": "x"}), "command"),
        (json!({"command": ["true"], "description": " "}), "description"),
        (
            json!({"command": ["true"], "description": "x", "timeout_secs": 0}),
            "timeout_secs",
        ),
        (
            json!({"command": ["true"], "description": "x", "timeout_secs": 999_999_999u64}),
            "timeout_secs",
        ),
        (
            json!({"command": ["true"], "description": "x", "id": "x".repeat(200)}),
            "id",
        ),
    ] {
        let e = f
            .service
            .create_execution(&f.a, body(req.clone()))
            .await
            .expect_err("refused");
        assert_eq!(
            (e.code, e.field.as_deref()),
            (ErrorCode::InvalidRequest, Some(field)),
            "{req}"
        );
    }
    assert!(f.rows("execution.request").await.is_empty());
    f.finish().await;
}
