//! Approval policies: one per tenant and one per sandbox, set with their audit row in one
//! transaction, replaced, read back and deleted.

mod support;

use paddock_store::{ApprovalPolicyRecord, AuditFilter, NewAuditEntry, SandboxState, Store, StoreError};
use support::new_sandbox;

fn store() -> Store {
    let store = Store::open_in_memory().expect("open");
    store.ensure_tenant("acme", 0).expect("tenant");
    store.ensure_tenant("beta", 0).expect("tenant");
    store
}

fn policy(tenant: &str, sandbox_id: Option<&str>, spec: &str, at: i64) -> ApprovalPolicyRecord {
    ApprovalPolicyRecord {
        tenant: tenant.to_owned(),
        sandbox_id: sandbox_id.map(str::to_owned),
        spec: spec.to_owned(),
        updated_at_ms: at,
    }
}

fn row(action: &str) -> NewAuditEntry {
    NewAuditEntry {
        ts_ms: 1,
        tenant: Some("acme".into()),
        key_id: None,
        action: action.into(),
        sandbox_id: None,
        outcome: "ok".into(),
        detail: serde_json::json!({}),
    }
}

fn put(s: &Store, record: &ApprovalPolicyRecord) {
    s.transaction(|tx| {
        tx.put_approval_policy(record)?;
        tx.append_audit(&row("policy.set"))?;
        Ok::<_, StoreError>(())
    })
    .expect("put");
}

#[test]
fn a_tenant_and_a_sandbox_policy_are_kept_apart_replaced_and_read_back() {
    let s = store();
    let tenant = policy("acme", None, r#"{"default":"allow","rules":[]}"#, 5);
    let sandbox = policy("acme", Some("sb-1"), r#"{"default":"ask","rules":[]}"#, 6);
    put(&s, &tenant);
    put(&s, &sandbox);
    assert_eq!(s.get_approval_policy("acme", None).expect("get"), Some(tenant));
    assert_eq!(
        s.get_approval_policy("acme", Some("sb-1")).expect("get"),
        Some(sandbox)
    );
    assert_eq!(s.get_approval_policy("beta", None).expect("get"), None);
    assert_eq!(s.get_approval_policy("acme", Some("sb-2")).expect("get"), None);
    let replaced = policy("acme", None, r#"{"default":"deny","rules":[]}"#, 9);
    put(&s, &replaced);
    assert_eq!(s.get_approval_policy("acme", None).expect("get"), Some(replaced));
    let filter = AuditFilter {
        limit: 100,
        ..Default::default()
    };
    let rows = s.query_audit(&filter).expect("audit");
    assert_eq!(rows.iter().filter(|r| r.action == "policy.set").count(), 3);
}

#[test]
fn a_policy_for_a_new_tenant_creates_the_tenant() {
    let s = store();
    put(&s, &policy("gamma", None, r#"{"default":"allow"}"#, 5));
    assert!(s.get_approval_policy("gamma", None).expect("get").is_some());
}

#[test]
fn deleting_a_policy_removes_that_scope_only_and_says_whether_it_existed() {
    let s = store();
    put(&s, &policy("acme", None, r#"{"default":"allow"}"#, 5));
    put(&s, &policy("acme", Some("sb-1"), r#"{"default":"ask"}"#, 5));
    let deleted = s
        .transaction(|tx| tx.delete_approval_policy("acme", Some("sb-1")))
        .expect("delete");
    assert!(deleted);
    assert_eq!(s.get_approval_policy("acme", Some("sb-1")).expect("get"), None);
    assert!(s.get_approval_policy("acme", None).expect("get").is_some());
    let again = s
        .transaction(|tx| tx.delete_approval_policy("acme", Some("sb-1")))
        .expect("delete");
    assert!(!again);
}

#[test]
fn a_failed_transaction_stores_no_policy() {
    let s = store();
    let failed = s.transaction(|tx| {
        tx.put_approval_policy(&policy("acme", None, r#"{"default":"allow"}"#, 5))?;
        Err::<(), _>(StoreError::Corrupt {
            what: "test",
            detail: "abandoned".into(),
        })
    });
    assert!(failed.is_err());
    assert_eq!(s.get_approval_policy("acme", None).expect("get"), None);
}

#[test]
fn a_spec_that_is_not_json_is_refused() {
    let s = store();
    let refused = s.transaction(|tx| tx.put_approval_policy(&policy("acme", None, "not json", 5)));
    assert!(refused.is_err());
}

#[test]
fn a_sandbox_policy_is_purged_with_its_sandbox_and_the_tenant_policy_stays() {
    let s = store();
    s.insert_sandbox(&new_sandbox("sb-1", Some("acme"), SandboxState::Running))
        .expect("sandbox");
    put(&s, &policy("acme", None, r#"{"default":"allow"}"#, 1));
    put(&s, &policy("acme", Some("sb-1"), r#"{"default":"deny"}"#, 2));
    assert_eq!(s.purge_ended_sandboxes(100).expect("purge"), 0);
    assert!(s
        .get_approval_policy("acme", Some("sb-1"))
        .expect("get")
        .is_some());
    assert!(s
        .transition_sandbox(
            "sb-1",
            &[SandboxState::Running],
            SandboxState::Killed,
            10,
            Some("test")
        )
        .expect("end"));
    assert_eq!(s.purge_ended_sandboxes(100).expect("purge"), 1);
    assert_eq!(s.get_approval_policy("acme", Some("sb-1")).expect("get"), None);
    assert!(s.get_approval_policy("acme", None).expect("get").is_some());
}
