//! The approvals webhook and event stream: a held exec's `requested` change reaches the
//! operator's receiver (a real HTTP server on 127.0.0.1) signed with HMAC-SHA256 (verified by the
//! receiver with Python's own hmac), retried after the receiver's 503s with the same delivery id,
//! and recorded (`approval.webhook`, attempts and status); the approval and its use follow; the
//! SSE stream `GET /v1/approvals/events` tells the tenant's approver the same; and the approval
//! system's signed callback decides for a person (a forged one is refused).

use futures_util::StreamExt as _;
use serde_json::json;

use super::{asking_tenant, exec, exists, Asking, Receiver, DELIVERY_DEADLINE};
use crate::support::server::{wait_for, Server};
use crate::support::TestEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_changes_reach_a_signed_webhook_retried_until_it_answers_and_the_event_stream() {
    let env = TestEnv::new();
    let outside = tempfile::tempdir().expect("a directory for the key and config");
    let key_file = outside.path().join("webhook.key");
    std::fs::write(&key_file, "e2e-webhook-key-0123456789abcdef\n").expect("key");
    let receiver = Receiver::start(&key_file, 2);
    let config = outside.path().join("paddock.toml");
    std::fs::write(
        &config,
        format!(
            "[approvals]\nwebhook_url = \"http://127.0.0.1:{}/hook\"\nwebhook_secret_file = \"{}\"\n\
             webhook_attempts = 5\nwebhook_backoff = \"20ms\"\n",
            receiver.port,
            key_file.display()
        ),
    )
    .expect("config");
    let server = Server::start(&env, &["--config", config.to_str().expect("utf-8")], "info");
    let api = server.api();
    let admin = server.admin_key.clone();
    let Asking {
        plain,
        approver,
        approver_id,
        sandbox: id,
    } = asking_tenant(&api, &admin, "hooked").await;

    // The approver listens to the queue before anything is asked.
    let events = reqwest::Client::new()
        .get(format!("{}/v1/approvals/events", api.base()))
        .bearer_auth(&approver)
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .send()
        .await
        .expect("the event stream opens");
    assert_eq!(events.status(), 200);
    let mut events = events.bytes_stream();

    let (status, pending) = exec(
        &api,
        &plain,
        &id,
        &json!({"argv": ["touch", "/tmp/hooked"], "approval_wait_ms": 0}),
    )
    .await;
    assert_eq!(
        (status, pending["code"].as_str()),
        (409, Some("approval_pending")),
        "{pending}"
    );
    let approval = pending["approval_id"].as_str().expect("named").to_owned();

    // Two 503s, then delivered: one delivery id, every attempt signed, a tampered body would not be.
    let attempts: Vec<_> = (0..3).map(|_| receiver.next()).collect();
    for (n, a) in attempts.iter().enumerate() {
        assert_eq!(a["n"], n as u64 + 1, "{a}");
        assert_eq!(a["status"], if n < 2 { 503 } else { 200 }, "{a}");
        assert_eq!(
            (a["valid"].as_bool(), a["tampered_valid"].as_bool()),
            (Some(true), Some(false)),
            "{a}"
        );
        assert_eq!(a["event"], "requested", "{a}");
        assert_eq!(a["path"], "/hook", "{a}");
        assert_eq!(a["delivery"], attempts[0]["delivery"], "{a}");
        assert_eq!(a["body"]["approval"]["id"], approval.as_str(), "{a}");
        assert_eq!(a["body"]["approval"]["state"], "pending", "{a}");
        assert_eq!(a["body"]["approval"]["summary"], "touch /tmp/hooked", "{a}");
        assert_eq!(a["body"]["tenant"], "hooked", "{a}");
    }
    // The stream said the same.
    let mut seen = String::new();
    let heard = tokio::time::timeout(DELIVERY_DEADLINE, async {
        while let Some(chunk) = events.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk.expect("a chunk")));
            if seen.contains("event: requested") && seen.contains(&approval) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(heard, Ok(true), "the event stream: {seen}");

    api.post(
        &approver,
        &format!("/v1/approvals/{approval}/approve"),
        &json!({"note": "fine"}),
    )
    .await;
    let approved = receiver.next();
    assert_eq!(
        (approved["event"].as_str(), approved["status"].as_u64()),
        (Some("approved"), Some(200))
    );
    assert_eq!(approved["body"]["approval"]["decided_by"], approver_id.as_str());
    assert_eq!(approved["body"]["approval"]["note"], "fine");
    let (status, ran) = exec(
        &api,
        &plain,
        &id,
        &json!({"argv": ["touch", "/tmp/hooked"], "approval_id": approval}),
    )
    .await;
    assert_eq!(
        (status, ran["exit"]["exit_code"].as_i64()),
        (200, Some(0)),
        "{ran}"
    );
    assert!(exists(&api, &plain, &id, "/tmp/hooked").await);
    assert_eq!(receiver.next()["event"], "used");

    // The approval system answers: a decision signed with the same key, no API key.
    let (status, pending) = exec(
        &api,
        &plain,
        &id,
        &json!({"argv": ["touch", "/tmp/called-back"], "approval_wait_ms": 0}),
    )
    .await;
    assert_eq!(status, 409, "{pending}");
    let second = pending["approval_id"].as_str().expect("named").to_owned();
    assert_eq!(receiver.next()["event"], "requested");
    let body = json!({"decision": "approve", "approver": "alice@example.com"}).to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs();
    let key = std::fs::read_to_string(&key_file).expect("key");
    let callback = |signature: String| {
        reqwest::Client::new()
            .post(format!("{}/v1/approvals/{second}/callback", api.base()))
            .header("Paddock-Signature", signature)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone())
            .send()
    };
    let forged = callback(paddock_control::sign_webhook(
        b"not-the-key-0123456789",
        now,
        body.as_bytes(),
    ))
    .await
    .expect("answered");
    assert_eq!(forged.status(), 401);
    let decided = callback(paddock_control::sign_webhook(
        key.trim().as_bytes(),
        now,
        body.as_bytes(),
    ))
    .await
    .expect("answered");
    assert_eq!(decided.status(), 200);
    let decided: serde_json::Value = decided.json().await.expect("json");
    assert_eq!(decided["decided_by"], "webhook:alice@example.com", "{decided}");
    assert_eq!(receiver.next()["event"], "approved");
    let (status, ran) = exec(
        &api,
        &plain,
        &id,
        &json!({"argv": ["touch", "/tmp/called-back"], "approval_id": second}),
    )
    .await;
    assert_eq!(
        (status, ran["exit"]["exit_code"].as_i64()),
        (200, Some(0)),
        "{ran}"
    );
    assert_eq!(receiver.next()["event"], "used");

    // Every delivery is recorded, with its attempts.
    let mut rows = Vec::new();
    let recorded = wait_for(DELIVERY_DEADLINE, async || {
        rows = api.audit_rows(&admin, "action=approval.webhook").await;
        rows.len() == 6
    })
    .await;
    assert!(recorded, "{rows:#?}");
    let requested = rows
        .iter()
        .find(|r| r["detail"]["event"] == "requested" && r["detail"]["approval_id"] == approval.as_str())
        .expect("the requested delivery's row");
    assert_eq!(
        (
            requested["detail"]["attempts"].as_u64(),
            requested["detail"]["status"].as_u64(),
            requested["outcome"].as_str()
        ),
        (Some(3), Some(200), Some("ok")),
        "{requested}"
    );
    assert_eq!(requested["tenant"], "hooked");
    assert_eq!(api.verify_audit(&admin).await["ok"], true);
    // An open stream would hold the server's graceful stop for its grace period.
    drop(events);
    server.stop();
}
