//! Sandbox records: inserts, compare-and-set transitions, listing and housekeeping.

mod support;

use paddock_store::QuotaDefaults;
use paddock_store::{NewAuditEntry, NewSandbox, SandboxFilter, SandboxState, Store, StoreError};
use support::{labels, new_sandbox};
use SandboxState::{Creating, Expired, Failed, Killed, Running, Warm};

fn store_with_tenants() -> Store {
    let store = Store::open_in_memory().expect("open");
    store.ensure_tenant("acme", 0).expect("tenant");
    store.ensure_tenant("beta", 0).expect("tenant");
    store
}

#[test]
fn insert_and_get_round_trip() {
    let store = store_with_tenants();
    let new = NewSandbox {
        labels: labels(&[("a", "1"), ("weird key \"x\"", "ü")]),
        expires_at_ms: Some(9_000),
        ..new_sandbox("sb-1", Some("acme"), Creating)
    };
    store.insert_sandbox(&new).expect("insert");
    let got = store.get_sandbox("sb-1").expect("get").expect("present");
    assert_eq!(got.id, new.id);
    assert_eq!(got.tenant, new.tenant);
    assert_eq!(got.state, Creating);
    assert_eq!(got.profile, new.profile);
    assert_eq!(got.spec_json, new.spec_json);
    assert_eq!(got.labels, new.labels);
    assert_eq!(
        (got.memory_bytes, got.cpu_millis),
        (new.memory_bytes, new.cpu_millis)
    );
    assert_eq!(got.created_at_ms, 1_000);
    assert_eq!(got.expires_at_ms, Some(9_000));
    assert_eq!(
        (got.claimed_at_ms, got.ended_at_ms, got.end_reason),
        (None, None, None)
    );
    assert_eq!(store.get_sandbox("sb-2").expect("get"), None);
}

#[test]
fn duplicate_id_is_a_conflict() {
    let store = store_with_tenants();
    store
        .insert_sandbox(&new_sandbox("sb-1", Some("acme"), Creating))
        .expect("insert");
    let err = store
        .insert_sandbox(&new_sandbox("sb-1", Some("beta"), Running))
        .expect_err("duplicate");
    assert!(
        matches!(&err, StoreError::Conflict { id, .. } if id == "sb-1"),
        "{err:?}"
    );
    let err = store
        .insert_sandbox_checked(
            &new_sandbox("sb-1", Some("acme"), Creating),
            &QuotaDefaults::default(),
        )
        .expect_err("duplicate, checked");
    assert!(matches!(err, StoreError::Conflict { .. }), "{err:?}");
}

#[test]
fn schema_refuses_a_warm_sandbox_with_an_owner_and_invalid_json() {
    let store = store_with_tenants();
    let err = store
        .insert_sandbox(&new_sandbox("sb", Some("acme"), Warm))
        .expect_err("warm sandboxes belong to nobody");
    assert!(matches!(err, StoreError::Write { .. }), "{err:?}");
    let err = store
        .insert_sandbox(&NewSandbox {
            spec_json: "{not json".to_owned(),
            ..new_sandbox("sb", Some("acme"), Creating)
        })
        .expect_err("spec must be JSON");
    assert!(matches!(err, StoreError::Write { .. }), "{err:?}");
}

#[test]
fn transitions_are_compare_and_set() {
    let store = store_with_tenants();
    store
        .insert_sandbox(&new_sandbox("sb", Some("acme"), Creating))
        .expect("insert");

    assert!(
        !store
            .transition_sandbox("sb", &[Running], Killed, 5, None)
            .expect("cas"),
        "not running yet"
    );
    assert_eq!(
        store.get_sandbox("sb").expect("get").expect("present").state,
        Creating
    );
    assert!(
        !store
            .transition_sandbox("sb", &[], Running, 5, None)
            .expect("cas"),
        "empty from"
    );
    assert!(
        !store
            .transition_sandbox("nope", &[Creating], Running, 5, None)
            .expect("cas"),
        "unknown id"
    );

    assert!(store
        .transition_sandbox("sb", &[Creating], Running, 10, Some("ignored"))
        .expect("cas"));
    let running = store.get_sandbox("sb").expect("get").expect("present");
    assert_eq!(running.state, Running);
    assert_eq!(
        (running.ended_at_ms, running.end_reason),
        (None, None),
        "not ended yet"
    );

    assert!(store
        .transition_sandbox("sb", &[Creating, Running], Killed, 20, Some("user request"))
        .expect("cas"));
    let stopped = store.get_sandbox("sb").expect("get").expect("present");
    assert_eq!(stopped.state, Killed);
    assert_eq!(stopped.ended_at_ms, Some(20));
    assert_eq!(stopped.end_reason.as_deref(), Some("user request"));

    // A second stopper loses the race and changes nothing.
    assert!(!store
        .transition_sandbox("sb", &[Creating, Running], Failed, 30, Some("late"))
        .expect("cas"));
    let still = store.get_sandbox("sb").expect("get").expect("present");
    assert_eq!((still.state, still.ended_at_ms), (Killed, Some(20)));
}

#[test]
fn concurrent_transitions_have_one_winner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("state.db");
    let store = Store::open(&path).expect("open");
    store.ensure_tenant("acme", 0).expect("tenant");
    store
        .insert_sandbox(&new_sandbox("sb", Some("acme"), Running))
        .expect("insert");
    let wins: usize = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let path = &path;
                s.spawn(move || {
                    Store::open(path)
                        .expect("open")
                        .transition_sandbox("sb", &[Running], Killed, i, None)
                        .expect("cas")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| usize::from(h.join().expect("thread")))
            .sum()
    });
    assert_eq!(wins, 1);
}

#[test]
fn expiry_and_expired_sandboxes() {
    let store = store_with_tenants();
    for (id, state, expires) in [
        ("a", Running, Some(100)),
        ("b", Running, Some(200)),
        ("c", Running, None),
        ("d", Creating, Some(50)),
        ("e", Killed, Some(50)),
    ] {
        store
            .insert_sandbox(&NewSandbox {
                expires_at_ms: expires,
                ..new_sandbox(id, Some("acme"), state)
            })
            .expect("insert");
    }
    let ids = |v: Vec<paddock_store::SandboxRecord>| v.into_iter().map(|s| s.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.expired_sandboxes(99).expect("expired")),
        Vec::<String>::new()
    );
    assert_eq!(ids(store.expired_sandboxes(100).expect("expired")), ["a"]);
    assert_eq!(ids(store.expired_sandboxes(1_000).expect("expired")), ["a", "b"]);

    assert!(store.set_sandbox_expiry("a", Some(500)).expect("extend"));
    assert!(store.set_sandbox_expiry("b", None).expect("clear"));
    assert!(!store.set_sandbox_expiry("zzz", None).expect("unknown"));
    assert_eq!(ids(store.expired_sandboxes(1_000).expect("expired")), ["a"]);
    assert!(store
        .transition_sandbox("a", &[Running], Expired, 1_000, Some("ttl"))
        .expect("cas"));
    assert!(store.expired_sandboxes(1_000).expect("expired").is_empty());
}

#[test]
fn live_sandboxes_and_purge() {
    let store = store_with_tenants();
    store
        .insert_sandbox(&NewSandbox {
            created_at_ms: 3,
            ..new_sandbox("w", None, Warm)
        })
        .expect("insert");
    store
        .insert_sandbox(&NewSandbox {
            created_at_ms: 1,
            ..new_sandbox("c", Some("acme"), Creating)
        })
        .expect("insert");
    store
        .insert_sandbox(&NewSandbox {
            created_at_ms: 2,
            ..new_sandbox("r", Some("beta"), Running)
        })
        .expect("insert");
    store
        .insert_sandbox(&new_sandbox("old", Some("acme"), Running))
        .expect("insert");
    store
        .insert_sandbox(&new_sandbox("new", Some("acme"), Running))
        .expect("insert");
    store
        .transition_sandbox("old", &[Running], Killed, 100, None)
        .expect("end");
    store
        .transition_sandbox("new", &[Running], Failed, 300, Some("oom"))
        .expect("end");

    let live: Vec<String> = store
        .live_sandboxes()
        .expect("live")
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(live, ["c", "r", "w"], "live ones, oldest first");

    assert_eq!(
        store.purge_ended_sandboxes(100).expect("purge"),
        0,
        "ended at 100 is not before 100"
    );
    assert_eq!(store.purge_ended_sandboxes(200).expect("purge"), 1);
    assert!(store.get_sandbox("old").expect("get").is_none());
    assert!(store.get_sandbox("new").expect("get").is_some());
    assert_eq!(
        store.live_sandboxes().expect("live").len(),
        3,
        "live ones are never purged"
    );
}

#[test]
fn list_filters_and_paginates() {
    let store = store_with_tenants();
    for i in 0..25 {
        let tenant = if i % 5 == 0 { "beta" } else { "acme" };
        let state = if i % 3 == 0 { Killed } else { Running };
        let team = if i % 2 == 0 { "even" } else { "odd" };
        store
            .insert_sandbox(&NewSandbox {
                labels: labels(&[("team", team), ("env", "ci")]),
                ..new_sandbox(&format!("sb-{i:02}"), Some(tenant), state)
            })
            .expect("insert");
    }
    let expected: Vec<String> = (0..25)
        .filter(|i| i % 5 != 0 && i % 3 != 0 && i % 2 == 0)
        .map(|i| format!("sb-{i:02}"))
        .collect();
    assert!(expected.len() >= 4, "the test needs a few pages");

    let mut filter = SandboxFilter {
        tenant: Some("acme".to_owned()),
        states: vec![Running, Creating],
        labels: labels(&[("team", "even"), ("env", "ci")]),
        after_id: None,
        limit: 3,
    };
    let mut seen = Vec::new();
    loop {
        let page = store.list_sandboxes(&filter).expect("list");
        assert!(page.len() <= 3);
        let Some(last) = page.last() else { break };
        filter.after_id = Some(last.id.clone());
        seen.extend(page.into_iter().map(|s| s.id));
    }
    assert_eq!(seen, expected);

    let all = store
        .list_sandboxes(&SandboxFilter {
            limit: 100,
            ..SandboxFilter::default()
        })
        .expect("list all");
    assert_eq!(all.len(), 25);
    let none = store
        .list_sandboxes(&SandboxFilter {
            labels: labels(&[("team", "nobody")]),
            limit: 100,
            ..SandboxFilter::default()
        })
        .expect("list");
    assert!(none.is_empty());
    let missing_key = store
        .list_sandboxes(&SandboxFilter {
            labels: labels(&[("absent", "ci")]),
            limit: 100,
            ..SandboxFilter::default()
        })
        .expect("list");
    assert!(
        missing_key.is_empty(),
        "a label's value does not match under another key"
    );
}

#[test]
fn transaction_writes_a_transition_and_its_audit_row_together() {
    let store = store_with_tenants();
    store
        .insert_sandbox(&new_sandbox("sb", Some("acme"), Running))
        .expect("insert");
    let entry = NewAuditEntry {
        ts_ms: 10,
        tenant: Some("acme".to_owned()),
        key_id: None,
        action: "sandbox.stop".to_owned(),
        sandbox_id: Some("sb".to_owned()),
        outcome: "ok".to_owned(),
        detail: serde_json::json!({}),
    };

    // A failure after both writes rolls both back.
    let result: Result<(), StoreError> = store.transaction(|tx| {
        assert!(tx.transition_sandbox("sb", &[Running], Killed, 10, None)?);
        tx.append_audit(&entry)?;
        Err(StoreError::NoTenant {
            id: "simulated failure".to_owned(),
        })
    });
    assert!(result.is_err());
    assert_eq!(
        store.get_sandbox("sb").expect("get").expect("present").state,
        Running
    );
    assert_eq!(
        store.verify_audit().expect("verify").rows_checked,
        0,
        "audit row rolled back"
    );

    let record = store
        .transaction(|tx| {
            assert!(tx.transition_sandbox("sb", &[Running], Killed, 10, None)?);
            tx.append_audit(&entry)
        })
        .expect("commit");
    assert_eq!(record.seq, 1);
    assert_eq!(
        store.get_sandbox("sb").expect("get").expect("present").state,
        Killed
    );
    assert!(store.verify_audit().expect("verify").is_intact());
}
