//! Approval policies through the service: set, read and delete for the tenant and for one of its
//! sandboxes; only approver and admin keys may change them; a faulty policy is refused whole,
//! naming its field, with nothing stored or recorded; another tenant's sandbox is not found; every
//! change has its audit row.

use paddock_control::{PolicyScope, Principal};
use paddock_types::api::{ErrorCode, SetApprovalPolicyRequest};
use serde_json::{json, Value};

use crate::fixture::{body, code, error, sid, Fixture};

fn set(policy: Value) -> SetApprovalPolicyRequest {
    body(json!({ "policy": policy }))
}

/// A key of `tenant` the admin made with `approver`.
async fn key(f: &Fixture, tenant: &str, approver: bool) -> Principal {
    let made = f
        .service
        .create_key(&f.admin, body(json!({"tenant": tenant, "approver": approver})))
        .await
        .expect("key");
    assert_eq!(made.approver, approver);
    f.service.authenticate(&made.key).await.expect("the key works")
}

const ASK_PUSH: &str = "^git push( |$)";

#[tokio::test]
async fn an_approver_sets_reads_and_deletes_a_tenant_and_a_sandbox_policy() {
    let f = Fixture::start().await;
    let approver = key(&f, "tenant-a", true).await;
    assert!(approver.approver && !approver.admin);
    let id = f.create(&f.a, json!({})).await.id;
    let tenant_policy = json!({"default": "allow", "rules": [
        {"verdict": "ask", "exec": {"command": {"regex": ASK_PUSH}}}]});
    let info = f
        .service
        .set_policy(&approver, &PolicyScope::Tenant, set(tenant_policy.clone()))
        .await
        .expect("set");
    assert_eq!(info.policy, tenant_policy);
    assert_eq!(info.sandbox_id, None);
    let sandbox = PolicyScope::Sandbox(id.clone());
    // Normalized: `rules` absent is stored as the empty list.
    let info = f
        .service
        .set_policy(&approver, &sandbox, set(json!({"default": "deny"})))
        .await
        .expect("set");
    assert_eq!(info.policy, json!({"default": "deny", "rules": []}));
    assert_eq!(info.sandbox_id.as_deref(), Some(id.as_str()));

    // Any key of the tenant reads them; they are kept apart.
    let read = f
        .service
        .get_policy(&f.a, &PolicyScope::Tenant)
        .await
        .expect("get");
    assert_eq!(read.policy, tenant_policy);
    let read = f.service.get_policy(&f.a, &sandbox).await.expect("get");
    assert_eq!(read.policy["default"], "deny");
    // Another tenant has none of its own.
    assert_eq!(
        code(f.service.get_policy(&f.b, &PolicyScope::Tenant).await),
        ErrorCode::PolicyNotFound
    );

    f.service
        .delete_policy(&approver, &sandbox)
        .await
        .expect("delete");
    assert_eq!(
        code(f.service.get_policy(&f.a, &sandbox).await),
        ErrorCode::PolicyNotFound
    );
    assert!(f.service.get_policy(&f.a, &PolicyScope::Tenant).await.is_ok());
    assert_eq!(
        code(f.service.delete_policy(&approver, &sandbox).await),
        ErrorCode::PolicyNotFound
    );

    let sets = f.rows("policy.set").await;
    assert_eq!(sets.len(), 2, "{sets:?}");
    assert_eq!(sets[0].detail["scope"], "tenant");
    assert_eq!(sets[0].detail["rules"], 1);
    assert_eq!(sets[0].sandbox_id, None);
    assert_eq!(sets[0].key_id.as_deref(), Some(approver.key_id.as_str()));
    let stored = serde_json::to_string(&tenant_policy).expect("json");
    assert_eq!(sets[0].detail["spec_bytes"], stored.len());
    assert_eq!(sets[0].detail["spec_sha256"].as_str().map(str::len), Some(64));
    assert_eq!(sets[1].detail["scope"], "sandbox");
    assert_eq!(sets[1].sandbox_id.as_deref(), Some(id.as_str()));
    let deletes = f.rows("policy.delete").await;
    assert_eq!(deletes.len(), 1, "only the delete that deleted: {deletes:?}");
    assert_eq!(deletes[0].detail["scope"], "sandbox");
    assert_eq!(deletes[0].sandbox_id.as_deref(), Some(id.as_str()));
    f.finish().await;
}

#[tokio::test]
async fn a_plain_key_may_read_but_not_change_a_policy_and_an_admin_may() {
    let f = Fixture::start().await;
    assert!(!f.a.approver, "keys are made without approver");
    let policy = || set(json!({"default": "ask"}));
    let e = error(f.service.set_policy(&f.a, &PolicyScope::Tenant, policy()).await);
    assert_eq!(e.code, ErrorCode::Forbidden, "{e:?}");
    assert!(e.message.contains("approver"), "{}", e.message);
    // Refused before any lookup: the same for a sandbox that does not exist.
    let missing = PolicyScope::Sandbox(sid("sb-00000000000000ff"));
    assert_eq!(
        code(f.service.set_policy(&f.a, &missing, policy()).await),
        ErrorCode::Forbidden
    );
    assert_eq!(
        code(f.service.get_policy(&f.a, &PolicyScope::Tenant).await),
        ErrorCode::PolicyNotFound,
        "nothing was stored"
    );

    // An admin key (tenant `admin`) sets its own tenant's policy, even one made before the
    // approver permission existed (stored `approver` 0); a plain key reads but cannot delete it.
    let old_admin = Principal {
        approver: false,
        ..f.admin.clone()
    };
    assert!(old_admin.admin);
    f.service
        .set_policy(&old_admin, &PolicyScope::Tenant, policy())
        .await
        .expect("an admin may");
    let admin_tenant_key = key(&f, &f.admin.tenant, false).await;
    assert!(f
        .service
        .get_policy(&admin_tenant_key, &PolicyScope::Tenant)
        .await
        .is_ok());
    assert_eq!(
        code(
            f.service
                .delete_policy(&admin_tenant_key, &PolicyScope::Tenant)
                .await
        ),
        ErrorCode::Forbidden
    );
    f.service
        .delete_policy(&old_admin, &PolicyScope::Tenant)
        .await
        .expect("an admin may");
    // Admin keys are made approvers.
    let made = f
        .service
        .create_key(&f.admin, body(json!({"tenant": "tenant-c", "admin": true})))
        .await
        .expect("key");
    assert!(made.admin && made.approver);
    assert_eq!(f.rows("policy.set").await.len(), 1);
    assert_eq!(f.rows("policy.delete").await.len(), 1);
    f.finish().await;
}

#[tokio::test]
async fn a_faulty_policy_is_refused_naming_its_field_and_nothing_is_stored() {
    let f = Fixture::start().await;
    let approver = key(&f, "tenant-a", true).await;
    let good = json!({"default": "allow", "rules": [
        {"verdict": "ask", "exec": {"command": {"regex": ASK_PUSH}}}]});
    f.service
        .set_policy(&approver, &PolicyScope::Tenant, set(good.clone()))
        .await
        .expect("set");
    let faulty = json!({"default": "allow", "rules": [
        {"verdict": "ask", "exec": {"program": {"glob": "ok"}}},
        {"verdict": "deny", "exec": {"args": {"regex": "(unclosed"}}}]});
    let e = error(
        f.service
            .set_policy(&approver, &PolicyScope::Tenant, set(faulty))
            .await,
    );
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::InvalidRequest, Some("policy.rules[1].exec.args")),
        "{e:?}"
    );
    // Not even parsable as a policy: refused on `policy`.
    let e = error(
        f.service
            .set_policy(&approver, &PolicyScope::Tenant, set(json!({"default": "maybe"})))
            .await,
    );
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::InvalidRequest, Some("policy")),
        "{e:?}"
    );
    // The policy before is kept, and only its own set was recorded.
    let read = f
        .service
        .get_policy(&approver, &PolicyScope::Tenant)
        .await
        .expect("get");
    assert_eq!(read.policy, good);
    assert_eq!(f.rows("policy.set").await.len(), 1);
    f.finish().await;
}

#[tokio::test]
async fn another_tenants_sandbox_is_not_found() {
    let f = Fixture::start().await;
    let approver_b = key(&f, "tenant-b", true).await;
    let id = f.create(&f.a, json!({})).await.id;
    let theirs = PolicyScope::Sandbox(id.clone());
    let policy = || set(json!({"default": "deny"}));
    assert_eq!(
        code(f.service.set_policy(&approver_b, &theirs, policy()).await),
        ErrorCode::SandboxNotFound
    );
    assert_eq!(
        code(f.service.get_policy(&approver_b, &theirs).await),
        ErrorCode::SandboxNotFound
    );
    assert_eq!(
        code(f.service.delete_policy(&approver_b, &theirs).await),
        ErrorCode::SandboxNotFound
    );
    let approver_a = key(&f, "tenant-a", true).await;
    assert_eq!(
        code(f.service.get_policy(&approver_a, &theirs).await),
        ErrorCode::PolicyNotFound,
        "nothing was stored for it"
    );
    assert!(f.rows("policy.").await.is_empty());
    f.finish().await;
}
