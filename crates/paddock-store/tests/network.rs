//! Egress state: a sandbox's policy, secret names and CA, and a tenant's secrets, whose values only
//! `secret_values` returns.

mod support;

use paddock_store::{SandboxNetworkRecord, SandboxState, SecretInfo, Store, StoreError};
use support::new_sandbox;

fn store() -> Store {
    let store = Store::open_in_memory().expect("open");
    store.ensure_tenant("acme", 0).expect("tenant");
    store.ensure_tenant("beta", 0).expect("tenant");
    store
}

fn net(id: &str, policy: serde_json::Value) -> SandboxNetworkRecord {
    SandboxNetworkRecord {
        sandbox_id: id.to_owned(),
        policy,
        secrets: vec!["GH".into()],
        ca_cert_pem: "CERT".into(),
        ca_key_pem: "KEY".into(),
        updated_at_ms: 5,
    }
}

#[test]
fn a_sandbox_network_is_written_replaced_and_purged_with_its_sandbox() {
    let s = store();
    s.insert_sandbox(&new_sandbox("sb-1", Some("acme"), SandboxState::Running))
        .expect("sandbox");
    assert_eq!(s.get_sandbox_network("sb-1").expect("get"), None);
    let first = net("sb-1", serde_json::json!({"allow":[{"domain":"a.test"}]}));
    s.transaction(|tx| tx.put_sandbox_network(&first)).expect("put");
    assert_eq!(s.get_sandbox_network("sb-1").expect("get"), Some(first.clone()));
    let second = SandboxNetworkRecord {
        policy: serde_json::json!({}),
        secrets: vec![],
        updated_at_ms: 9,
        ..first
    };
    s.transaction(|tx| tx.put_sandbox_network(&second))
        .expect("replace");
    assert_eq!(s.get_sandbox_network("sb-1").expect("get"), Some(second.clone()));
    // The CA key never shows in a debug print (logs).
    assert!(!format!("{second:?}").contains("KEY"));
    // A network row for a sandbox that does not exist is refused.
    assert!(s
        .transaction(|tx| tx.put_sandbox_network(&net("sb-none", serde_json::json!({}))))
        .is_err());
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
    assert_eq!(s.get_sandbox_network("sb-1").expect("get"), None);
}

#[test]
fn secrets_are_per_tenant_and_only_values_returns_the_value() {
    let s = store();
    let info = |tenant: &str, name: &str| SecretInfo {
        tenant: tenant.into(),
        name: name.into(),
        hosts: vec!["api.test".into()],
        headers: vec!["authorization".into()],
        query: false,
        created_at_ms: 7,
    };
    s.transaction(|tx| tx.insert_secret(&info("acme", "GH"), b"ghp_real"))
        .expect("insert");
    let bound = SecretInfo {
        headers: vec!["x-api-key".into(), "cookie".into()],
        query: true,
        ..info("beta", "GH")
    };
    s.transaction(|tx| tx.insert_secret(&bound, b"other"))
        .expect("same name, other tenant");
    assert_eq!(s.list_secrets("beta").expect("list"), vec![bound.clone()]);
    assert_eq!(
        s.secret_values("beta", &["GH".into()]).expect("values")[0].info,
        bound
    );
    assert!(matches!(
        s.transaction(|tx| tx.insert_secret(&info("acme", "GH"), b"again")),
        Err(StoreError::Conflict {
            what: "secret name",
            ..
        })
    ));
    assert_eq!(s.list_secrets("acme").expect("list"), vec![info("acme", "GH")]);
    let values = s
        .secret_values("acme", &["GH".into(), "MISSING".into(), "GH".into()])
        .expect("values");
    assert_eq!(values.len(), 1);
    assert_eq!(values[0].value, b"ghp_real");
    assert!(!format!("{values:?}").contains("ghp_real"));
    assert!(s
        .transaction(|tx| tx.delete_secret("acme", "GH"))
        .expect("delete"));
    assert!(!s.transaction(|tx| tx.delete_secret("acme", "GH")).expect("again"));
    assert!(s
        .secret_values("acme", &["GH".into()])
        .expect("values")
        .is_empty());
    assert_eq!(s.list_secrets("beta").expect("list").len(), 1);
}
