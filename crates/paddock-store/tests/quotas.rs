//! Quotas hold under concurrency: the check and the insert are one transaction.

mod support;

use std::sync::Barrier;

use paddock_store::{Claim, NewSandbox, SandboxState, Store, StoreError, TenantQuota, TenantUsage};
use support::{labels, new_sandbox, TempDb};

const THREADS: usize = 8;

fn quota(
    max_sandboxes: Option<u32>,
    max_memory_bytes: Option<u64>,
    max_cpu_millis: Option<u32>,
) -> TenantQuota {
    TenantQuota {
        max_sandboxes,
        max_memory_bytes,
        max_cpu_millis,
    }
}

/// Every thread opens its own `Store` on the same file (as separate processes would) and tries to
/// create one sandbox at the same moment. Returns the results.
fn race_inserts(db: &TempDb, make: impl Fn(usize) -> NewSandbox + Sync) -> Vec<Result<(), StoreError>> {
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (barrier, make) = (&barrier, &make);
                s.spawn(move || {
                    let store = db.open();
                    let sandbox = make(i);
                    barrier.wait();
                    store.insert_sandbox_checked(&sandbox)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread panicked"))
            .collect()
    })
}

fn assert_exactly_n_succeed(results: &[Result<(), StoreError>], n: usize, what: &str) {
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, n, "{results:?}");
    for result in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(
            matches!(result, StoreError::QuotaExceeded { what: w, .. } if *w == what),
            "expected a {what} quota error, got {result:?}"
        );
    }
}

#[test]
fn sandbox_count_quota_holds_under_concurrent_inserts() {
    let db = TempDb::new();
    db.open()
        .set_tenant_quota("acme", &quota(Some(3), None, None), 0)
        .expect("set quota");
    let results = race_inserts(&db, |i| {
        new_sandbox(&format!("sb-{i}"), Some("acme"), SandboxState::Creating)
    });
    assert_exactly_n_succeed(&results, 3, "sandboxes");
    let usage = db.open().tenant_usage("acme").expect("usage");
    assert_eq!(usage.sandboxes, 3);
}

#[test]
fn memory_quota_holds_under_concurrent_inserts() {
    let db = TempDb::new();
    // Room for two sandboxes of 1 GiB, not three.
    db.open()
        .set_tenant_quota("acme", &quota(None, Some((5 << 30) / 2), None), 0)
        .expect("set quota");
    let results = race_inserts(&db, |i| NewSandbox {
        memory_bytes: 1 << 30,
        ..new_sandbox(&format!("sb-{i}"), Some("acme"), SandboxState::Running)
    });
    assert_exactly_n_succeed(&results, 2, "memory");
    let err = results.into_iter().find_map(Result::err).expect("some failed");
    assert!(
        matches!(
            err,
            StoreError::QuotaExceeded { limit, requested_total, .. }
                if limit == (5 << 30) / 2 && requested_total == 3 << 30
        ),
        "{err:?}"
    );
}

#[test]
fn cpu_quota_holds_under_concurrent_inserts() {
    let db = TempDb::new();
    db.open()
        .set_tenant_quota("acme", &quota(None, None, Some(2000)), 0)
        .expect("set quota");
    let results = race_inserts(&db, |i| NewSandbox {
        cpu_millis: 500,
        ..new_sandbox(&format!("sb-{i}"), Some("acme"), SandboxState::Creating)
    });
    assert_exactly_n_succeed(&results, 4, "cpu");
}

#[test]
fn ended_and_other_tenants_sandboxes_do_not_count() {
    let store = Store::open_in_memory().expect("open");
    store
        .set_tenant_quota("acme", &quota(Some(1), None, None), 0)
        .expect("quota");
    store.ensure_tenant("other", 0).expect("tenant");
    store
        .insert_sandbox(&new_sandbox("theirs", Some("other"), SandboxState::Running))
        .expect("insert");
    store
        .insert_sandbox(&new_sandbox("old", Some("acme"), SandboxState::Killed))
        .expect("insert");
    store
        .insert_sandbox(&new_sandbox("warm", None, SandboxState::Warm))
        .expect("insert");
    store
        .insert_sandbox_checked(&new_sandbox("a", Some("acme"), SandboxState::Creating))
        .expect("first fits");
    let err = store
        .insert_sandbox_checked(&new_sandbox("b", Some("acme"), SandboxState::Creating))
        .expect_err("second does not");
    assert!(
        matches!(&err, StoreError::QuotaExceeded { tenant, what: "sandboxes", limit: 1, requested_total: 2 } if tenant == "acme"),
        "{err:?}"
    );
    assert!(store.get_sandbox("b").expect("get").is_none(), "nothing inserted");

    // Ending the live one frees the slot.
    assert!(store
        .transition_sandbox("a", &[SandboxState::Creating], SandboxState::Killed, 5, None)
        .expect("transition"));
    store
        .insert_sandbox_checked(&new_sandbox("b", Some("acme"), SandboxState::Creating))
        .expect("fits again");
}

#[test]
fn checked_insert_needs_a_known_tenant() {
    let store = Store::open_in_memory().expect("open");
    let err = store
        .insert_sandbox_checked(&new_sandbox("sb", None, SandboxState::Warm))
        .expect_err("no tenant");
    assert!(matches!(err, StoreError::NoTenant { .. }), "{err:?}");
    let err = store
        .insert_sandbox_checked(&new_sandbox("sb", Some("ghost"), SandboxState::Creating))
        .expect_err("unknown tenant");
    assert!(matches!(err, StoreError::UnknownTenant { .. }), "{err:?}");
    let err = store
        .insert_sandbox(&new_sandbox("sb", Some("ghost"), SandboxState::Creating))
        .expect_err("unknown tenant, unchecked insert");
    assert!(matches!(err, StoreError::UnknownTenant { .. }), "{err:?}");
}

fn claim(now_ms: i64) -> Claim {
    Claim {
        memory_bytes: 512 << 20,
        cpu_millis: 1000,
        labels: labels(&[("team", "a")]),
        spec_json: r#"{"image":"claimed"}"#.to_owned(),
        expires_at_ms: Some(now_ms + 60_000),
        now_ms,
    }
}

#[test]
fn claim_takes_the_oldest_warm_sandbox_of_the_profile() {
    let store = Store::open_in_memory().expect("open");
    store.ensure_tenant("acme", 0).expect("tenant");
    for (id, profile, created) in [("w2", "default", 20), ("w1", "default", 10), ("g1", "gpu", 5)] {
        store
            .insert_sandbox(&NewSandbox {
                profile: profile.to_owned(),
                created_at_ms: created,
                ..new_sandbox(id, None, SandboxState::Warm)
            })
            .expect("insert warm");
    }
    assert_eq!(store.count_warm("default").expect("count"), 2);

    let got = store
        .claim_warm_sandbox("default", "acme", &claim(100))
        .expect("claim")
        .expect("a warm one");
    assert_eq!(got.id, "w1");
    assert_eq!(got.tenant.as_deref(), Some("acme"));
    assert_eq!(got.state, SandboxState::Running);
    assert_eq!(got.claimed_at_ms, Some(100));
    assert_eq!(got.expires_at_ms, Some(60_100));
    assert_eq!(got.labels, labels(&[("team", "a")]));
    assert_eq!(got.spec_json, r#"{"image":"claimed"}"#);
    assert_eq!((got.memory_bytes, got.cpu_millis), (512 << 20, 1000));
    assert_eq!(store.get_sandbox("w1").expect("get"), Some(got));
    assert_eq!(store.count_warm("default").expect("count"), 1);
    assert_eq!(
        store.tenant_usage("acme").expect("usage"),
        TenantUsage {
            sandboxes: 1,
            memory_bytes: 512 << 20,
            cpu_millis: 1000
        }
    );

    assert_eq!(
        store
            .claim_warm_sandbox("default", "acme", &claim(101))
            .expect("claim")
            .map(|s| s.id)
            .as_deref(),
        Some("w2")
    );
    assert_eq!(
        store
            .claim_warm_sandbox("default", "acme", &claim(102))
            .expect("claim"),
        None,
        "pool empty"
    );
    assert_eq!(
        store.count_warm("gpu").expect("count"),
        1,
        "other profiles untouched"
    );
}

#[test]
fn claim_respects_the_quota_even_when_the_pool_is_empty() {
    let store = Store::open_in_memory().expect("open");
    store
        .set_tenant_quota("acme", &quota(None, Some(768 << 20), None), 0)
        .expect("quota");
    store
        .insert_sandbox(&new_sandbox("w1", None, SandboxState::Warm))
        .expect("warm");
    store
        .insert_sandbox(&new_sandbox("w2", None, SandboxState::Warm))
        .expect("warm");

    store
        .claim_warm_sandbox("default", "acme", &claim(1))
        .expect("claim")
        .expect("first fits");
    let err = store
        .claim_warm_sandbox("default", "acme", &claim(2))
        .expect_err("second exceeds memory");
    assert!(
        matches!(err, StoreError::QuotaExceeded { what: "memory", .. }),
        "{err:?}"
    );
    assert_eq!(
        store.count_warm("default").expect("count"),
        1,
        "the refused claim took nothing"
    );

    let err = store
        .claim_warm_sandbox("empty-profile", "acme", &claim(3))
        .expect_err("quota before pool");
    assert!(matches!(err, StoreError::QuotaExceeded { .. }), "{err:?}");
}

#[test]
fn concurrent_claims_respect_the_quota_and_never_share_a_sandbox() {
    let db = TempDb::new();
    let store = db.open();
    store
        .set_tenant_quota("acme", &quota(Some(3), None, None), 0)
        .expect("quota");
    for i in 0..THREADS {
        store
            .insert_sandbox(&new_sandbox(&format!("w{i}"), None, SandboxState::Warm))
            .expect("warm");
    }
    let (db, barrier) = (&db, Barrier::new(THREADS));
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let barrier = &barrier;
                s.spawn(move || {
                    let store = db.open();
                    barrier.wait();
                    store.claim_warm_sandbox("default", "acme", &claim(1))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread panicked"))
            .collect()
    });
    let mut claimed: Vec<String> = results
        .iter()
        .filter_map(|r| r.as_ref().ok().cloned().flatten().map(|s| s.id))
        .collect();
    claimed.sort();
    claimed.dedup();
    assert_eq!(claimed.len(), 3, "{results:?}");
    assert_eq!(
        results.iter().filter(|r| r.is_err()).count(),
        THREADS - 3,
        "{results:?}"
    );
    assert_eq!(store.count_warm("default").expect("count"), (THREADS - 3) as u64);
}

#[test]
fn tenants_and_quotas() {
    let store = Store::open_in_memory().expect("open");
    let created = store.ensure_tenant("acme", 7).expect("ensure");
    assert_eq!(created.quota, TenantQuota::default(), "unlimited by default");
    assert_eq!(
        store
            .ensure_tenant("acme", 99)
            .expect("ensure again")
            .created_at_ms,
        7
    );

    let q = quota(Some(3), Some(u64::from(u32::MAX) * 4), Some(4000));
    let updated = store.set_tenant_quota("acme", &q, 100).expect("set");
    assert_eq!((updated.quota, updated.created_at_ms), (q, 7));
    let made = store.set_tenant_quota("beta", &q, 100).expect("set creates");
    assert_eq!(made.created_at_ms, 100);
    let cleared = store
        .set_tenant_quota("acme", &TenantQuota::default(), 200)
        .expect("clear");
    assert_eq!(cleared.quota, TenantQuota::default());

    let names: Vec<String> = store
        .list_tenants()
        .expect("list")
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, ["acme", "beta"]);
    assert_eq!(store.get_tenant("gamma").expect("get"), None);

    let err = store
        .set_tenant_quota("acme", &quota(None, Some(u64::MAX), None), 1)
        .expect_err("too large for SQLite");
    assert!(matches!(err, StoreError::OutOfRange { .. }), "{err:?}");
}
