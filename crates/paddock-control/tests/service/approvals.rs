//! Approval policies applied, and the approvals queue: an `ask` holds an exec unstarted until a
//! second key approves it (then it runs once, with the approval in its start row); a rejection,
//! the expiry or a wait that ends never run it; a pending answer names an approval a retry can run
//! under, only for the very request approved and only once; self-approval is refused unless the
//! tenant's policy allows it; `deny` refuses with its row; a sandbox's policy overrides its
//! tenant's; file-API writes are held the same way.

use std::time::Duration;

use paddock_control::{PolicyScope, Principal, WriteFileOptions};
use paddock_types::api::{
    ApprovalEvent, ApprovalState, DecideApprovalRequest, ErrorCode, ListApprovalsQuery,
    SetApprovalPolicyRequest,
};
use paddock_types::SandboxId;
use serde_json::{json, Value};

use crate::fixture::{body, bytes_body, code, error, Fixture, Output, DEADLINE};

/// A key of `tenant-a` the admin made, an approver or not.
async fn key(f: &Fixture, approver: bool) -> Principal {
    let made = f
        .service
        .create_key(
            &f.admin,
            body(json!({"tenant": "tenant-a", "approver": approver})),
        )
        .await
        .expect("key");
    f.service.authenticate(&made.key).await.expect("the key works")
}

async fn set_policy(f: &Fixture, by: &Principal, scope: &PolicyScope, policy: Value) {
    let req: SetApprovalPolicyRequest = body(json!({ "policy": policy }));
    f.service.set_policy(by, scope, req).await.expect("policy set");
}

/// Asks a person before any `touch`, allows the rest.
fn ask_touch() -> Value {
    json!({"default": "allow", "rules": [
        {"verdict": "ask", "reason": "touching needs a person", "exec": {"program": {"glob": "touch"}}}]})
}

/// The next queue change of `events` for which `pick` holds.
async fn next_event(
    events: &mut paddock_control::ApprovalStream,
    pick: impl Fn(&ApprovalEvent) -> bool,
) -> ApprovalEvent {
    loop {
        let event = tokio::time::timeout(DEADLINE, events.recv())
            .await
            .expect("a queue change in time")
            .expect("the stream lives");
        if pick(&event) {
            return event;
        }
    }
}

async fn exists(f: &Fixture, id: &SandboxId, path: &str) -> bool {
    f.sh(&f.a, id, &format!("test -e {path} && echo yes || echo no"))
        .await
        .trim()
        == "yes"
}

fn note(text: &str) -> DecideApprovalRequest {
    DecideApprovalRequest {
        note: Some(text.to_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asked_exec_waits_unstarted_until_a_second_key_approves_it_then_runs_once() {
    let f = Fixture::start().await;
    let approver = key(&f, true).await;
    let id = f.create(&f.a, json!({})).await.id;
    set_policy(&f, &approver, &PolicyScope::Tenant, ask_touch()).await;
    let mut events = f.service.approval_stream(&approver);
    let mut theirs = f.service.approval_stream(&f.b);

    let (service, a, sandbox) = (f.service.clone(), f.a.clone(), id.clone());
    let held = tokio::spawn(async move {
        let req = body(json!({"argv": ["touch", "/tmp/marker"], "approval_wait_ms": 60_000}));
        match service.exec(&a, &sandbox, req).await {
            Ok(stream) => Ok(crate::fixture::collect(stream).await),
            Err(e) => Err(e),
        }
    });
    let requested = next_event(&mut events, |e| e.event == "requested").await;
    let approval = requested.approval;
    assert_eq!(
        (
            approval.state,
            approval.summary.as_str(),
            approval.rule,
            approval.reason.as_deref()
        ),
        (
            ApprovalState::Pending,
            "touch /tmp/marker",
            Some(0),
            Some("touching needs a person")
        )
    );
    assert_eq!(approval.request["argv"], json!(["touch", "/tmp/marker"]));
    assert_eq!(approval.requested_by, f.a.key_id);
    assert_eq!(approval.sandbox_id.as_deref(), Some(id.as_str()));
    // Held: nothing started, no start row, and another tenant hears nothing of it.
    assert!(!exists(&f, &id, "/tmp/marker").await);
    assert!(f
        .rows("process.start")
        .await
        .iter()
        .all(|r| r.detail["argv"] != json!(["touch", "/tmp/marker"])));
    let pending = f
        .service
        .list_approvals(&approver, body(json!({"state": "pending"})))
        .await
        .expect("list");
    assert_eq!(pending.approvals.len(), 1);
    assert_eq!(
        code(f.service.get_approval(&f.b, &approval.id).await),
        ErrorCode::ApprovalNotFound
    );
    // The asking key is no approver; the approver approves.
    assert_eq!(
        code(f.service.approve(&f.a, &approval.id, note("mine")).await),
        ErrorCode::Forbidden
    );
    let decided = f
        .service
        .approve(&approver, &approval.id, note("looks fine"))
        .await
        .expect("approved");
    assert_eq!(decided.state, ApprovalState::Approved);
    assert_eq!(decided.decided_by.as_deref(), Some(approver.key_id.as_str()));
    let ran = tokio::time::timeout(DEADLINE, held)
        .await
        .expect("the held exec ends")
        .expect("joined")
        .expect("it ran");
    assert_eq!(ran.exit.map(|e| e.exit_code), Some(0), "{ran:?}");
    assert!(exists(&f, &id, "/tmp/marker").await);
    // Used once; a second decision is refused.
    let used = f
        .service
        .get_approval(&approver, &approval.id)
        .await
        .expect("get");
    assert!(used.used_at.is_some(), "{used:?}");
    assert_eq!(
        code(f.service.reject(&approver, &approval.id, note("late")).await),
        ErrorCode::ApprovalDecided
    );
    let start = f
        .rows("process.start")
        .await
        .into_iter()
        .find(|r| r.detail["argv"] == json!(["touch", "/tmp/marker"]))
        .expect("its start row");
    assert_eq!(start.detail["approval_id"], approval.id.as_str());
    let approve_row = f.rows("approval.approve").await.pop().expect("the approve row");
    assert_eq!(approve_row.key_id.as_deref(), Some(approver.key_id.as_str()));
    assert_eq!(approve_row.detail["note"], "looks fine");
    assert_eq!(approve_row.detail["requested_by"], f.a.key_id.as_str());
    assert_eq!(f.rows("approval.request").await.len(), 1);
    // Allowed commands never touch the queue.
    f.sh(&f.a, &id, "true").await;
    assert_eq!(f.rows("approval.request").await.len(), 1);
    assert!(
        futures_util::FutureExt::now_or_never(theirs.recv()).is_none(),
        "another tenant's queue change reached this stream"
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_or_expired_request_never_runs() {
    let f = Fixture::with(|c| c.approvals.ttl = Duration::from_millis(400)).await;
    let approver = key(&f, true).await;
    let id = f.create(&f.a, json!({})).await.id;
    set_policy(&f, &approver, &PolicyScope::Tenant, ask_touch()).await;
    let mut events = f.service.approval_stream(&approver);

    let (service, a, sandbox) = (f.service.clone(), f.a.clone(), id.clone());
    let held = tokio::spawn(async move {
        let req = body(json!({"argv": ["touch", "/tmp/rejected"], "approval_wait_ms": 60_000}));
        service.exec(&a, &sandbox, req).await.map(|_| ())
    });
    let requested = next_event(&mut events, |e| e.event == "requested").await;
    f.service
        .reject(&approver, &requested.approval.id, note("no"))
        .await
        .expect("rejected");
    let e = error(held.await.expect("joined"));
    assert_eq!(e.code, ErrorCode::ApprovalRejected);
    assert_eq!(e.approval_id.as_deref(), Some(requested.approval.id.as_str()));
    assert!(!exists(&f, &id, "/tmp/rejected").await);

    // No one decides: after the time-to-live it expires, and stays unrun and undecidable.
    let req = body(json!({"argv": ["touch", "/tmp/expired"], "approval_wait_ms": 60_000}));
    let e = error(f.service.exec(&f.a, &id, req).await);
    assert_eq!(e.code, ErrorCode::ApprovalExpired, "{e:?}");
    let expired_id = e.approval_id.expect("named");
    let expired = f.service.get_approval(&approver, &expired_id).await.expect("get");
    assert_eq!(expired.state, ApprovalState::Expired);
    assert_eq!(
        code(f.service.approve(&approver, &expired_id, note("too late")).await),
        ErrorCode::ApprovalDecided
    );
    assert!(!exists(&f, &id, "/tmp/expired").await);
    assert_eq!(f.rows("approval.expire").await.len(), 1);
    assert_eq!(f.rows("approval.reject").await.len(), 1);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_answer_names_an_approval_that_runs_only_its_request_and_only_once() {
    let f = Fixture::start().await;
    let approver = key(&f, true).await;
    let id = f.create(&f.a, json!({})).await.id;
    let other = f.create(&f.a, json!({})).await.id;
    set_policy(&f, &approver, &PolicyScope::Tenant, ask_touch()).await;

    let request = json!({"argv": ["touch", "/tmp/later"], "approval_wait_ms": 0});
    let e = error(f.exec(&f.a, &id, request.clone()).await);
    assert_eq!(e.code, ErrorCode::ApprovalPending, "{e:?}");
    let approval = e.approval_id.expect("the pending answer names its approval");
    assert!(e.message.contains(&approval), "{}", e.message);
    assert!(!exists(&f, &id, "/tmp/later").await);
    // Retried before a decision: still pending, nothing runs.
    let mut retry = request.clone();
    retry["approval_id"] = json!(approval);
    assert_eq!(
        code(f.exec(&f.a, &id, retry.clone()).await),
        ErrorCode::ApprovalPending
    );
    f.service
        .approve(&approver, &approval, DecideApprovalRequest::default())
        .await
        .expect("approved");
    // Not for another request, nor for the same one in another sandbox.
    let mut changed = retry.clone();
    changed["argv"] = json!(["touch", "/tmp/elsewhere"]);
    let e = error(f.exec(&f.a, &id, changed).await);
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::InvalidRequest, Some("approval_id"))
    );
    assert_eq!(
        error(f.exec(&f.a, &other, retry.clone()).await).code,
        ErrorCode::InvalidRequest
    );
    // The very request runs (its wait does not enter its hash), once.
    let mut same = retry.clone();
    same["approval_wait_ms"] = json!(5);
    let ran: Output = f.exec(&f.a, &id, same).await.expect("runs under the approval");
    assert_eq!(ran.exit.map(|e| e.exit_code), Some(0));
    assert!(exists(&f, &id, "/tmp/later").await);
    assert_eq!(code(f.exec(&f.a, &id, retry).await), ErrorCode::ApprovalExpired);
    // Another tenant's key cannot use or see it.
    let mut theirs = request;
    theirs["approval_id"] = json!(approval);
    assert_eq!(
        code(f.service.get_approval(&f.b, &approval).await),
        ErrorCode::ApprovalNotFound
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_approval_needs_the_tenants_policy_to_allow_it() {
    let f = Fixture::start().await;
    let asker = key(&f, true).await;
    let id = f.create(&asker, json!({})).await.id;
    set_policy(&f, &asker, &PolicyScope::Tenant, ask_touch()).await;
    let pending = |path: &str| json!({"argv": ["touch", path], "approval_wait_ms": 0});
    let first = error(f.exec(&asker, &id, pending("/tmp/one")).await)
        .approval_id
        .expect("pending");
    let e = error(f.service.approve(&asker, &first, note("me")).await);
    assert_eq!(e.code, ErrorCode::Forbidden);
    assert!(e.message.contains("another approver"), "{}", e.message);
    // Rejecting one's own request is always allowed.
    f.service
        .reject(&asker, &first, note("never mind"))
        .await
        .expect("rejected");
    // A sandbox's policy cannot grant it; the tenant's can.
    let mut own = ask_touch();
    own["self_approval"] = json!(true);
    set_policy(&f, &asker, &PolicyScope::Sandbox(id.clone()), own.clone()).await;
    let second = error(f.exec(&asker, &id, pending("/tmp/two")).await)
        .approval_id
        .expect("pending");
    assert_eq!(
        code(f.service.approve(&asker, &second, note("me")).await),
        ErrorCode::Forbidden
    );
    set_policy(&f, &asker, &PolicyScope::Tenant, own).await;
    f.service
        .approve(&asker, &second, note("me"))
        .await
        .expect("self-approved");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_refuses_with_its_row_and_a_sandbox_policy_overrides_the_tenants() {
    let f = Fixture::start().await;
    let approver = key(&f, true).await;
    let id = f.create(&f.a, json!({})).await.id;
    let other = f.create(&f.a, json!({})).await.id;
    set_policy(
        &f,
        &approver,
        &PolicyScope::Tenant,
        json!({"default": "allow", "rules": [
            {"verdict": "deny", "reason": "no curl", "exec": {"command": {"regex": "curl"}}}]}),
    )
    .await;
    let e = error(
        f.exec(&f.a, &id, json!({"shell": "echo curl > /tmp/denied"}))
            .await,
    );
    assert_eq!(e.code, ErrorCode::PolicyDenied);
    assert!(e.message.contains("no curl"), "{}", e.message);
    assert!(!exists(&f, &id, "/tmp/denied").await);
    let row = f.rows("policy.deny").await.pop().expect("the deny row");
    assert_eq!(
        (
            row.detail["scope"].as_str(),
            row.detail["rule"].as_u64(),
            row.outcome.as_str()
        ),
        (Some("tenant"), Some(0), "policy_denied")
    );
    // The sandbox's own policy replaces the tenant's (for it alone).
    set_policy(
        &f,
        &approver,
        &PolicyScope::Sandbox(id.clone()),
        json!({"default": "allow"}),
    )
    .await;
    f.sh(&f.a, &id, "echo curl > /tmp/allowed").await;
    assert_eq!(
        code(f.exec(&f.a, &other, json!({"shell": "echo curl"})).await),
        ErrorCode::PolicyDenied
    );
    // Deleted: the tenant's applies again.
    f.service
        .delete_policy(&approver, &PolicyScope::Sandbox(id.clone()))
        .await
        .expect("deleted");
    assert_eq!(
        code(f.exec(&f.a, &id, json!({"shell": "echo curl"})).await),
        ErrorCode::PolicyDenied
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_api_writes_and_deletes_are_held_the_same_way() {
    let f = Fixture::with(|c| c.approvals.wait = Duration::ZERO).await;
    let approver = key(&f, true).await;
    let id = f.create(&f.a, json!({})).await.id;
    f.sh(
        &f.a,
        &id,
        "mkdir -p /tmp/guarded && echo keep > /tmp/guarded/keep",
    )
    .await;
    set_policy(
        &f,
        &approver,
        &PolicyScope::Sandbox(id.clone()),
        json!({"default": "allow", "rules": [
            {"verdict": "ask", "file": {"path": {"glob": "/tmp/guarded/**"}}}]}),
    )
    .await;
    let write = |approval: Option<String>| WriteFileOptions {
        approval_id: approval,
        ..WriteFileOptions::default()
    };
    let e = error(
        f.service
            .write_file(&f.a, &id, "/tmp/guarded/new", write(None), bytes_body(b"x"))
            .await,
    );
    assert_eq!(e.code, ErrorCode::ApprovalPending);
    let approval = e.approval_id.expect("named");
    assert!(!exists(&f, &id, "/tmp/guarded/new").await);
    let info = f.service.get_approval(&approver, &approval).await.expect("get");
    assert_eq!(info.summary, "write /tmp/guarded/new");
    f.service
        .approve(&approver, &approval, DecideApprovalRequest::default())
        .await
        .expect("approved");
    f.service
        .write_file(
            &f.a,
            &id,
            "/tmp/guarded/new",
            write(Some(approval.clone())),
            bytes_body(b"x"),
        )
        .await
        .expect("written under the approval");
    assert!(exists(&f, &id, "/tmp/guarded/new").await);
    // A move out of the guarded tree is a delete there: held too; elsewhere, nothing is.
    let e = error(
        f.service
            .rename_file(
                &f.a,
                &id,
                body(json!({"from": "/tmp/guarded/keep", "to": "/tmp/out"})),
            )
            .await,
    );
    assert_eq!(e.code, ErrorCode::ApprovalPending);
    assert_eq!(
        code(
            f.service
                .remove_file(&f.a, &id, "/tmp/guarded/keep", false, None)
                .await
        ),
        ErrorCode::ApprovalPending
    );
    assert!(exists(&f, &id, "/tmp/guarded/keep").await);
    f.service
        .write_file(&f.a, &id, "/tmp/free", write(None), bytes_body(b"y"))
        .await
        .expect("not guarded");
    let listed = f
        .service
        .list_approvals(&approver, ListApprovalsQuery::default())
        .await
        .expect("list");
    assert_eq!(listed.approvals.len(), 3);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_request_is_kept_as_its_size_and_still_runs_only_as_itself() {
    let f = Fixture::with(|c| c.approvals.wait = Duration::ZERO).await;
    let approver = key(&f, true).await;
    let id = f.create(&f.a, json!({})).await.id;
    let ask_cat = json!({"default": "allow", "rules": [
        {"verdict": "ask", "exec": {"program": {"glob": "cat"}}}]});
    set_policy(&f, &approver, &PolicyScope::Tenant, ask_cat).await;
    let stdin = "x".repeat(200 * 1024);
    let request = json!({"argv": ["cat"], "stdin": stdin});
    let approval = error(f.exec(&f.a, &id, request.clone()).await)
        .approval_id
        .expect("pending");
    let info = f.service.get_approval(&approver, &approval).await.expect("get");
    assert_eq!(
        info.request["bytes"].as_u64().map(|b| b > 200 * 1024),
        Some(true),
        "{:?}",
        info.request
    );
    assert!(info.request.get("stdin").is_none());
    f.service
        .approve(&approver, &approval, DecideApprovalRequest::default())
        .await
        .expect("approved");
    // The same request with other stdin is another request.
    let mut other = request.clone();
    other["stdin"] = json!("y");
    other["approval_id"] = json!(approval);
    assert_eq!(code(f.exec(&f.a, &id, other).await), ErrorCode::InvalidRequest);
    let mut same = request;
    same["approval_id"] = json!(approval);
    let ran = f.exec(&f.a, &id, same).await.expect("runs");
    assert_eq!(ran.exit.map(|e| e.exit_code), Some(0));
    assert_eq!(ran.stdout.len(), 200 * 1024);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_approvals_are_bounded_per_sandbox_and_per_tenant() {
    let f = Fixture::with(|c| {
        c.approvals.wait = Duration::ZERO;
        c.approvals.max_pending_per_tenant = 40;
    })
    .await;
    let approver = key(&f, true).await;
    let id = f.create(&f.a, json!({})).await.id;
    let other = f.create(&f.a, json!({})).await.id;
    set_policy(&f, &approver, &PolicyScope::Tenant, ask_touch()).await;
    let touch = |n: usize| json!({"argv": ["touch", format!("/tmp/{n}")]});
    for n in 0..32 {
        assert_eq!(
            code(f.exec(&f.a, &id, touch(n)).await),
            ErrorCode::ApprovalPending
        );
    }
    let e = error(f.exec(&f.a, &id, touch(32)).await);
    assert_eq!(
        (e.code, e.field.as_deref()),
        (
            ErrorCode::QuotaExceeded,
            Some("max_pending_approvals_per_sandbox")
        )
    );
    for n in 0..8 {
        assert_eq!(
            code(f.exec(&f.a, &other, touch(n)).await),
            ErrorCode::ApprovalPending
        );
    }
    let e = error(f.exec(&f.a, &other, touch(8)).await);
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::QuotaExceeded, Some("max_pending_approvals"))
    );
    // Deciding one frees its place.
    let first = f
        .service
        .list_approvals(
            &approver,
            body(json!({"state": "pending", "sandbox_id": id.as_str()})),
        )
        .await
        .expect("list")
        .approvals
        .pop()
        .expect("one");
    f.service
        .reject(&approver, &first.id, DecideApprovalRequest::default())
        .await
        .expect("rejected");
    assert_eq!(
        code(f.exec(&f.a, &other, touch(9)).await),
        ErrorCode::ApprovalPending
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_callback_decides_for_the_named_person_and_nothing_else_does() {
    const KEY: &[u8] = b"the-approval-system-key-0123456789";
    let f = Fixture::with(|c| {
        c.approvals.wait = Duration::ZERO;
        c.approvals.callback_key = Some(paddock_control::CallbackKey(KEY.to_vec()));
    })
    .await;
    let approver = key(&f, true).await;
    let id = f.create(&f.a, json!({})).await.id;
    set_policy(&f, &approver, &PolicyScope::Tenant, ask_touch()).await;
    let request = json!({"argv": ["touch", "/tmp/called-back"]});
    let approval = error(f.exec(&f.a, &id, request.clone()).await)
        .approval_id
        .expect("pending");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs();
    let body =
        json!({"decision": "approve", "approver": "alice@example.com", "note": "ok from chat"}).to_string();
    let signed = paddock_control::sign_webhook(KEY, now, body.as_bytes());
    // Unsigned, signed with another key, over another body, or stale: refused, nothing decided.
    for (signature, what) in [
        (None, "no signature"),
        (
            Some(paddock_control::sign_webhook(
                b"another-key-0123456789",
                now,
                body.as_bytes(),
            )),
            "another key",
        ),
        (
            Some(paddock_control::sign_webhook(KEY, now - 3600, body.as_bytes())),
            "stale",
        ),
    ] {
        let e = error(
            f.service
                .decide_by_callback(&approval, signature.as_deref(), body.as_bytes())
                .await,
        );
        assert_eq!(e.code, ErrorCode::Unauthorized, "{what}: {e:?}");
    }
    let tampered = body.replace("approve", "reject");
    assert_eq!(
        code(
            f.service
                .decide_by_callback(&approval, Some(&signed), tampered.as_bytes())
                .await
        ),
        ErrorCode::Unauthorized
    );
    assert_eq!(
        f.service
            .get_approval(&approver, &approval)
            .await
            .expect("get")
            .state,
        ApprovalState::Pending
    );
    let decided = f
        .service
        .decide_by_callback(&approval, Some(&signed), body.as_bytes())
        .await
        .expect("decided");
    assert_eq!(decided.state, ApprovalState::Approved);
    assert_eq!(decided.decided_by.as_deref(), Some("webhook:alice@example.com"));
    // The same callback again (a replay) finds it decided.
    assert_eq!(
        code(
            f.service
                .decide_by_callback(&approval, Some(&signed), body.as_bytes())
                .await
        ),
        ErrorCode::ApprovalDecided
    );
    let mut retry = request;
    retry["approval_id"] = json!(approval);
    assert_eq!(
        f.exec(&f.a, &id, retry)
            .await
            .expect("runs")
            .exit
            .map(|e| e.exit_code),
        Some(0)
    );
    let row = f.rows("approval.approve").await.pop().expect("the row");
    assert_eq!(row.key_id.as_deref(), Some("webhook:alice@example.com"));
    assert_eq!(row.detail["note"], "ok from chat");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_webhook_key_callbacks_are_refused() {
    let f = Fixture::start().await;
    let e = error(
        f.service
            .decide_by_callback("apr_x", Some("t=1,v1=00"), b"{}")
            .await,
    );
    assert_eq!(e.code, ErrorCode::Unsupported);
    f.finish().await;
}
