//! An approved execution end to end on a real server and the `sandbox` executor: proposed by one
//! key, held (nothing runs), approved by a second key, run once in a fresh sandbox with its logs
//! and exit code reported, the sandbox removed, and the audit chain verifying with the approver
//! in it; a failing one reports its exit code.

use std::time::Duration;

use serde_json::{json, Value};

use super::approver_key;
use crate::support::server::{wait_for, Api, Server};
use crate::support::TestEnv;

async fn ended(api: &Api, key: &str, id: &str) -> Value {
    let mut info = Value::Null;
    let done = wait_for(Duration::from_secs(60), async || {
        info = api.get(key, &format!("/v1/executions/{id}")).await;
        !matches!(info["state"].as_str(), Some("pending_approval" | "running"))
    })
    .await;
    assert!(done, "{info}");
    info
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_execution_approved_by_a_second_key_runs_in_a_sandbox_and_reports_its_logs() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let agent = api.create_key(&admin, "ops").await;
    let (person, person_id) = approver_key(&api, &admin, "ops").await;

    let asked = api
        .request(
            &agent,
            reqwest::Method::POST,
            "/v1/executions",
            Some(&json!({
                "id": "incident-7-restart",
                "session_id": "chat-1",
                "task_id": "incident-7",
                "command": ["sh", "-c"],
                "args": ["echo remediated; id -u; echo to-stderr >&2"],
                "env": {"INCIDENT": "7"},
                "timeout_secs": 60,
                "description": "restart the stuck worker (incident 7)"
            })),
            None,
        )
        .await;
    assert_eq!(asked.status, 202, "{}", asked.text());
    let asked = asked.json();
    assert_eq!(asked["state"], "pending_approval", "{asked}");
    let id = asked["id"].as_str().expect("id").to_owned();
    let approval = asked["approval_id"].as_str().expect("approval").to_owned();
    let queued = api.get(&person, "/v1/approvals?state=pending").await;
    assert_eq!(queued["approvals"][0]["kind"], "execution", "{queued}");
    assert_eq!(queued["approvals"][0]["id"], approval.as_str());
    assert!(api.get(&agent, "/v1/sandboxes").await["sandboxes"]
        .as_array()
        .is_some_and(Vec::is_empty));
    // The proposing key may not approve it.
    let refused = api
        .request(
            &agent,
            reqwest::Method::POST,
            &format!("/v1/approvals/{approval}/approve"),
            Some(&json!({})),
            None,
        )
        .await;
    assert_eq!(refused.status, 403, "{}", refused.text());

    api.post(
        &person,
        &format!("/v1/approvals/{approval}/approve"),
        &json!({"note": "ok, incident 7"}),
    )
    .await;
    let done = ended(&api, &agent, &id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["exit_code"], 0);
    let logs = done["logs"].as_str().unwrap_or_default();
    assert!(
        logs.contains("remediated") && logs.contains("to-stderr"),
        "{done}"
    );
    assert_eq!(done["approved_by"], person_id.as_str());
    assert_eq!(done["logs_truncated"], false);
    assert_eq!(done["executor"], "sandbox");
    let object = done["object"].as_str().expect("its sandbox").to_owned();
    let gone = wait_for(Duration::from_secs(30), async || {
        api.get(&agent, "/v1/sandboxes").await["sandboxes"]
            .as_array()
            .is_some_and(Vec::is_empty)
    })
    .await;
    assert!(gone, "the execution's sandbox {object} was not removed");

    // A failing command reports its exit code; the repeated client id answers the first.
    let again = api
        .request(
            &agent,
            reqwest::Method::POST,
            "/v1/executions",
            Some(&json!({"id": "incident-7-restart", "command": ["false"], "description": "x"})),
            None,
        )
        .await
        .json();
    assert_eq!(again["id"], id.as_str(), "{again}");
    let failing = api
        .post(
            &agent,
            "/v1/executions",
            &json!({"command": ["sh", "-c", "exit 3"], "description": "check"}),
        )
        .await;
    let failing_id = failing["id"].as_str().expect("id").to_owned();
    let failing_approval = failing["approval_id"].as_str().expect("approval").to_owned();
    api.post(
        &person,
        &format!("/v1/approvals/{failing_approval}/approve"),
        &json!({}),
    )
    .await;
    let failed = ended(&api, &agent, &failing_id).await;
    assert_eq!(
        (failed["state"].as_str(), failed["exit_code"].as_i64()),
        (Some("failed"), Some(3)),
        "{failed}"
    );

    // The audit log: every step, the approver on the approval row, the chain intact.
    let rows = api.audit_rows(&admin, "action=execution.").await;
    let ours: Vec<&str> = rows
        .iter()
        .filter(|r| r["detail"]["execution_id"] == id.as_str())
        .map(|r| r["action"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        ours,
        ["execution.request", "execution.start", "execution.finish"],
        "{rows:#?}"
    );
    let approved = api.audit_rows(&admin, "action=approval.approve").await;
    let row = approved
        .iter()
        .find(|r| r["detail"]["approval_id"] == approval.as_str())
        .expect("the approval row");
    assert_eq!(row["key_id"], person_id.as_str());
    assert_eq!(row["detail"]["note"], "ok, incident 7");
    let verified = api.verify_audit(&admin).await;
    assert_eq!(verified["ok"], true, "{verified}");
    server.stop();
}
