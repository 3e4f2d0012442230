//! Approvals through the tools: under a tenant policy that asks a person before `touch`,
//! `run_command` and `process_start` fail with `approval_pending` naming the approval (nothing
//! runs); once an approver key approves it, the same call with `approval_id` runs it, once.
//!
//! The service answers `approval_pending` at once here (`[approvals] wait` zero) instead of
//! holding the call for a person.

use std::time::Duration;

use paddock_control::{ApprovalsConfig, PolicyScope, Principal, SandboxService, ServiceConfig};
use paddock_types::api::DecideApprovalRequest;
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::{json, Value};

use crate::support::{call, connect, failed, new_key, started, structured};

/// The service on the fake backend, answering a held request at once; a plain key and an
/// approver key of one tenant.
async fn service() -> (SandboxService, Principal, Principal) {
    let config = ServiceConfig {
        approvals: ApprovalsConfig {
            wait: Duration::ZERO,
            ..ApprovalsConfig::default()
        },
        ..ServiceConfig::default()
    };
    let (service, admin) = started(config).await;
    let plain = new_key(&service, &admin, json!({"tenant": "a", "approver": false})).await;
    let approver = new_key(&service, &admin, json!({"tenant": "a", "approver": true})).await;
    (service, plain, approver)
}

/// The approval id a failure's text names.
#[track_caller]
fn approval_id(text: &str) -> String {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.starts_with("apr_") && w.len() > 4)
        .unwrap_or_else(|| panic!("no approval id in {text:?}"))
        .to_owned()
}

/// Whether `path` exists in the sandbox (a command the policy lets run).
async fn exists(client: &RunningService<RoleClient, ()>, id: &str, path: &str) -> bool {
    let ran = structured(
        &call(
            client,
            "run_command",
            json!({"sandbox_id": id, "command": format!("test -e {path}")}),
        )
        .await,
    );
    ran["exit_code"] == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_command_runs_with_the_approval_its_failure_named() {
    let (service, plain, approver) = service().await;
    // A shell request's program is the shell: the rule matches the command line.
    let policy = json!({"default": "allow", "rules": [
        {"verdict": "ask", "exec": {"command": {"regex": "^touch( |$)"}}}]});
    service
        .set_policy(
            &approver,
            &PolicyScope::Tenant,
            serde_json::from_value(json!({ "policy": policy })).expect("request"),
        )
        .await
        .expect("the approver sets the policy");
    let client = connect(&service, plain).await;
    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();

    // Held: a tool error naming the code and the approval; nothing ran.
    let touch = json!({"sandbox_id": id, "command": "touch /tmp/x"});
    let held = failed(&call(&client, "run_command", touch.clone()).await);
    assert!(held.starts_with("approval_pending: "), "{held}");
    let apr = approval_id(&held);
    assert!(!exists(&client, &id, "/tmp/x").await, "nothing ran");
    // A made-up approval runs nothing either.
    let mut bogus = touch.clone();
    bogus["approval_id"] = json!("apr_0000000000000000");
    let refused = failed(&call(&client, "run_command", bogus).await);
    assert!(refused.starts_with("approval_not_found: "), "{refused}");
    assert!(!exists(&client, &id, "/tmp/x").await, "nothing ran");

    // Approved by a person: the same call with the approval runs it, once.
    service
        .approve(&approver, &apr, DecideApprovalRequest::default())
        .await
        .expect("approved");
    let mut approved = touch.clone();
    approved["approval_id"] = json!(apr);
    let ran = structured(&call(&client, "run_command", approved.clone()).await);
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert!(exists(&client, &id, "/tmp/x").await);
    let again = failed(&call(&client, "run_command", approved).await);
    assert!(
        again.starts_with("approval_expired: ") && again.contains(&apr),
        "{again}"
    );

    // process_start: held the same way, then started under its approval.
    let start = json!({"sandbox_id": id, "command": "touch /tmp/y"});
    let held = failed(&call(&client, "process_start", start.clone()).await);
    assert!(held.starts_with("approval_pending: "), "{held}");
    let apr = approval_id(&held);
    service
        .approve(&approver, &apr, DecideApprovalRequest::default())
        .await
        .expect("approved");
    let mut approved = start;
    approved["approval_id"] = json!(apr);
    let started: Value = structured(&call(&client, "process_start", approved).await);
    assert!(started["pid"].as_u64().is_some(), "{started}");

    client.cancel().await.expect("closed");
    service.shutdown().await;
}
