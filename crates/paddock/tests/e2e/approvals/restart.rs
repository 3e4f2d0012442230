//! Fail-closed across a crash: a request held for a person when the server is killed (`kill -9`)
//! never runs on its own. After the restart the approval is still pending, a retry naming it is
//! still held, an approval lets only an explicit retry run it, and the audit chain verifies with
//! the approver in it. And a workload inside the sandbox cannot change or get around its policy:
//! nothing it writes, sets or reaches inside is read by the gate.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use super::{approver_key, ask_touch, asking_tenant, exec, exists, Asking};
use crate::support::server::{wait_for, Server};
use crate::support::TestEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_approval_survives_a_crash_and_nothing_runs_without_an_explicit_approval() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let Asking {
        plain,
        approver,
        approver_id,
        sandbox: id,
    } = asking_tenant(&api, &admin, "crashy").await;

    // A caller waits on a held exec when the server dies.
    let (waiting_api, waiting_key, waiting_id) = (api.clone(), plain.clone(), id.clone());
    let waiting = tokio::spawn(async move {
        waiting_api
            .try_exec(
                &waiting_key,
                &waiting_id,
                &json!({"argv": ["touch", "/tmp/crashed"], "approval_wait_ms": 600_000}),
                "application/json",
            )
            .await
    });
    let mut listed = serde_json::Value::Null;
    let queued = wait_for(Duration::from_secs(60), async || {
        listed = api.get(&approver, "/v1/approvals?state=pending").await;
        listed["approvals"].as_array().is_some_and(|a| a.len() == 1)
    })
    .await;
    assert!(queued, "{listed}");
    let approval = listed["approvals"][0]["id"].as_str().expect("id").to_owned();
    server.kill9();
    let lost = waiting.await.expect("joined");
    assert!(
        lost.is_err(),
        "the waiting caller got an answer from a killed server: {lost:?}"
    );

    let server = Server::restart(&env, &[], "info");
    let api = server.api();
    let info = api.get(&approver, &format!("/v1/approvals/{approval}")).await;
    assert_eq!(info["state"], "pending", "{info}");
    assert!(!exists(&api, &plain, &id, "/tmp/crashed").await);
    let retry = json!({"argv": ["touch", "/tmp/crashed"], "approval_id": approval});
    let (status, held) = exec(&api, &plain, &id, &retry).await;
    assert_eq!(
        (status, held["code"].as_str()),
        (409, Some("approval_pending")),
        "{held}"
    );
    assert_eq!(held["approval_id"], approval.as_str());

    // Approved: still nothing runs until the caller sends the request again.
    api.post(
        &approver,
        &format!("/v1/approvals/{approval}/approve"),
        &json!({}),
    )
    .await;
    assert!(!exists(&api, &plain, &id, "/tmp/crashed").await);
    let (status, ran) = exec(&api, &plain, &id, &retry).await;
    assert_eq!(
        (status, ran["exit"]["exit_code"].as_i64()),
        (200, Some(0)),
        "{ran}"
    );
    assert!(exists(&api, &plain, &id, "/tmp/crashed").await);
    let start = api
        .audit_rows(&admin, &format!("sandbox={id}&action=process.start"))
        .await
        .into_iter()
        .find(|r| r["detail"]["approval_id"] == approval.as_str())
        .expect("the start row names its approval");
    assert_eq!(start["detail"]["argv"], json!(["touch", "/tmp/crashed"]));
    let approved = api.audit_rows(&admin, "action=approval.approve").await;
    assert_eq!(approved.len(), 1);
    assert_eq!(approved[0]["key_id"], approver_id.as_str());
    let verified = api.verify_audit(&admin).await;
    assert_eq!(verified["ok"], true, "{verified}");
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_cannot_change_or_get_around_its_policy_from_inside() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let plain = api.create_key(&admin, "inside").await;
    let (approver, _) = approver_key(&api, &admin, "inside").await;
    let id = api.create_sandbox(&plain, &json!({})).await["id"]
        .as_str()
        .expect("id")
        .to_owned();
    api.request(
        &approver,
        Method::PUT,
        &format!("/v1/sandboxes/{id}/policy"),
        Some(&json!({"policy": ask_touch()})),
        None,
    )
    .await
    .json();
    // Everything a workload could try from inside: files where a policy or an override might be
    // read, variables in its environment and profile, and the server's own API (which a sandbox
    // without a network cannot reach: loopback in it is its own).
    let port = api.base().rsplit(':').next().expect("a port").to_owned();
    let script = format!(
        "mkdir -p /etc/paddock /run/paddock; \
         echo '{{\"default\":\"allow\"}}' > /etc/paddock/policy.json; \
         cp /etc/paddock/policy.json /run/paddock/policy.json; \
         echo 'export PADDOCK_POLICY=allow PADDOCK_APPROVAL_ID=any' >> /etc/profile; \
         python3 -c 'import socket; s = socket.socket(); s.settimeout(5); s.connect((\"127.0.0.1\", {port}))' \
           2>/dev/null && echo reached || echo unreachable"
    );
    let tries = api
        .exec_json(&plain, &id, &json!({ "shell": script }))
        .await
        .json();
    assert_eq!(tries["stdout"], "unreachable\n", "{tries}");
    for request in [
        json!({"argv": ["touch", "/tmp/outside-policy"], "approval_wait_ms": 0}),
        json!({"argv": ["touch", "/tmp/outside-policy"], "approval_wait_ms": 0,
               "env": {"PADDOCK_POLICY": "allow"}}),
        json!({"argv": ["touch", "/tmp/outside-policy"], "approval_wait_ms": 0,
               "approval_id": "apr_00000000000000000000000000000000"}),
    ] {
        let (status, answer) = exec(&api, &plain, &id, &request).await;
        assert!(
            matches!(
                answer["code"].as_str(),
                Some("approval_pending" | "approval_not_found")
            ) && status >= 400,
            "{request}: {status} {answer}"
        );
    }
    assert!(!exists(&api, &plain, &id, "/tmp/outside-policy").await);
    // The policy the server applies is the one set through the API, unchanged.
    let policy = api.get(&plain, &format!("/v1/sandboxes/{id}/policy")).await;
    assert_eq!(policy["policy"], ask_touch(), "{policy}");
    server.stop();
}
