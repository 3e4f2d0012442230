//! Quotas hold under concurrency (the check and the insert are one transaction), count every kind of
//! thing a tenant runs or stores, and admit exactly what a model of them admits.

mod support;

use std::sync::Barrier;

use paddock_store::{
    first_exceeded, Claim, NewSandbox, NewSnapshot, NewTemplate, NewVolume, QuotaDefaults, QuotaRequest,
    SandboxState, SnapshotKind, Store, StoreError, TemplateDeletion, TenantQuota, TenantUsage,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use support::{labels, new_sandbox, TempDb};

const THREADS: usize = 8;

/// No server-wide defaults: a tenant's unset quota fields are unlimited.
const NO_DEFAULTS: QuotaDefaults = QuotaDefaults {
    quota: TenantQuota {
        max_sandboxes: None,
        max_memory_bytes: None,
        max_cpu_millis: None,
        max_snapshots: None,
        max_volumes: None,
        max_storage_bytes: None,
        max_templates: None,
    },
    unsized_volume_bytes: 0,
};

fn quota(
    max_sandboxes: Option<u32>,
    max_memory_bytes: Option<u64>,
    max_cpu_millis: Option<u32>,
) -> TenantQuota {
    TenantQuota {
        max_sandboxes,
        max_memory_bytes,
        max_cpu_millis,
        ..TenantQuota::default()
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
                    store.insert_sandbox_checked(&sandbox, &NO_DEFAULTS)
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
    assert_exactly_n_succeed(&results, 3, "max_sandboxes");
    let usage = db.open().tenant_usage("acme", &NO_DEFAULTS).expect("usage");
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
    assert_exactly_n_succeed(&results, 2, "max_memory");
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
    assert_exactly_n_succeed(&results, 4, "max_cpus");
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
        .insert_sandbox_checked(
            &new_sandbox("a", Some("acme"), SandboxState::Creating),
            &NO_DEFAULTS,
        )
        .expect("first fits");
    let err = store
        .insert_sandbox_checked(
            &new_sandbox("b", Some("acme"), SandboxState::Creating),
            &NO_DEFAULTS,
        )
        .expect_err("second does not");
    assert!(
        matches!(&err, StoreError::QuotaExceeded { tenant, what: "max_sandboxes", limit: 1, requested_total: 2 } if tenant == "acme"),
        "{err:?}"
    );
    assert!(store.get_sandbox("b").expect("get").is_none(), "nothing inserted");

    // Ending the live one frees the slot.
    assert!(store
        .transition_sandbox("a", &[SandboxState::Creating], SandboxState::Killed, 5, None)
        .expect("transition"));
    store
        .insert_sandbox_checked(
            &new_sandbox("b", Some("acme"), SandboxState::Creating),
            &NO_DEFAULTS,
        )
        .expect("fits again");
}

#[test]
fn checked_insert_needs_a_known_tenant() {
    let store = Store::open_in_memory().expect("open");
    let err = store
        .insert_sandbox_checked(&new_sandbox("sb", None, SandboxState::Warm), &NO_DEFAULTS)
        .expect_err("no tenant");
    assert!(matches!(err, StoreError::NoTenant { .. }), "{err:?}");
    let err = store
        .insert_sandbox_checked(
            &new_sandbox("sb", Some("ghost"), SandboxState::Creating),
            &NO_DEFAULTS,
        )
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
        disk_bytes: 2 << 30,
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
        .claim_warm_sandbox("default", "acme", &claim(100), &NO_DEFAULTS)
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
        store.tenant_usage("acme", &NO_DEFAULTS).expect("usage"),
        TenantUsage {
            sandboxes: 1,
            memory_bytes: 512 << 20,
            cpu_millis: 1000,
            storage_bytes: 2 << 30,
            ..TenantUsage::default()
        }
    );

    assert_eq!(
        store
            .claim_warm_sandbox("default", "acme", &claim(101), &NO_DEFAULTS)
            .expect("claim")
            .map(|s| s.id)
            .as_deref(),
        Some("w2")
    );
    assert_eq!(
        store
            .claim_warm_sandbox("default", "acme", &claim(102), &NO_DEFAULTS)
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
        .claim_warm_sandbox("default", "acme", &claim(1), &NO_DEFAULTS)
        .expect("claim")
        .expect("first fits");
    let err = store
        .claim_warm_sandbox("default", "acme", &claim(2), &NO_DEFAULTS)
        .expect_err("second exceeds memory");
    assert!(
        matches!(
            err,
            StoreError::QuotaExceeded {
                what: "max_memory",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        store.count_warm("default").expect("count"),
        1,
        "the refused claim took nothing"
    );

    let err = store
        .claim_warm_sandbox("empty-profile", "acme", &claim(3), &NO_DEFAULTS)
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
                    store.claim_warm_sandbox("default", "acme", &claim(1), &NO_DEFAULTS)
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

// ---------------------------------------------------------------------------------------------------
// What a tenant stores: sandboxes that exist (stopped ones too), snapshots, volumes, storage bytes.
// ---------------------------------------------------------------------------------------------------

fn snapshot(id: &str, tenant: &str, kind: SnapshotKind, storage_bytes: u64) -> NewSnapshot {
    NewSnapshot {
        id: id.to_owned(),
        tenant: tenant.to_owned(),
        sandbox_id: (kind == SnapshotKind::Checkpoint).then(|| "sb-x".to_owned()),
        kind,
        name: None,
        labels: labels(&[]),
        created_at_ms: 1,
        storage_bytes,
        template_id: None,
    }
}

fn volume(id: &str, tenant: &str, size_bytes: Option<u64>) -> NewVolume {
    NewVolume {
        id: id.to_owned(),
        tenant: tenant.to_owned(),
        name: format!("name-{id}"),
        labels: labels(&[]),
        size_bytes,
        created_at_ms: 1,
    }
}

fn insert_snapshot(store: &Store, s: &NewSnapshot, defaults: &QuotaDefaults) -> Result<(), StoreError> {
    store.transaction(|tx| tx.insert_snapshot_checked(s, defaults))
}

fn insert_volume(store: &Store, v: &NewVolume, defaults: &QuotaDefaults) -> Result<(), StoreError> {
    store.transaction(|tx| tx.insert_volume_checked(v, defaults))
}

fn refused_on(result: Result<(), StoreError>, quota: &str) {
    assert!(
        matches!(&result, Err(StoreError::QuotaExceeded { what, .. }) if *what == quota),
        "expected a {quota} refusal, got {result:?}"
    );
}

#[test]
fn stopped_sandboxes_count_against_max_sandboxes() {
    // The issue's probe: with max_sandboxes = 2, 8 stopped + 2 running must not be possible.
    let store = Store::open_in_memory().expect("open");
    store
        .set_tenant_quota("acme", &quota(Some(2), None, None), 0)
        .expect("quota");
    for id in ["a", "b"] {
        store
            .insert_sandbox_checked(
                &new_sandbox(id, Some("acme"), SandboxState::Running),
                &NO_DEFAULTS,
            )
            .expect("fits");
    }
    assert!(store
        .transition_sandbox("a", &[SandboxState::Running], SandboxState::Stopped, 2, None)
        .expect("stop"));
    refused_on(
        store.insert_sandbox_checked(
            &new_sandbox("c", Some("acme"), SandboxState::Creating),
            &NO_DEFAULTS,
        ),
        "max_sandboxes",
    );
    let usage = store.tenant_usage("acme", &NO_DEFAULTS).expect("usage");
    assert_eq!(usage.sandboxes, 2, "{usage:?}");
    assert_eq!(
        usage.memory_bytes,
        256 << 20,
        "only the running one holds memory: {usage:?}"
    );
    // Resuming does not add a sandbox: it is checked on memory and CPU only.
    assert!(store
        .resume_stopped_checked("a", "acme", &NO_DEFAULTS)
        .expect("resume"));
    // Deleting (ending) one frees its place.
    assert!(store
        .transition_sandbox("b", &[SandboxState::Running], SandboxState::Killed, 3, None)
        .expect("kill"));
    store
        .insert_sandbox_checked(
            &new_sandbox("c", Some("acme"), SandboxState::Creating),
            &NO_DEFAULTS,
        )
        .expect("fits again");
}

#[test]
fn resume_is_checked_on_memory_and_cpu() {
    let store = Store::open_in_memory().expect("open");
    store
        .set_tenant_quota("acme", &quota(Some(5), Some(300 << 20), Some(800)), 0)
        .expect("quota");
    store
        .insert_sandbox_checked(
            &new_sandbox("a", Some("acme"), SandboxState::Running),
            &NO_DEFAULTS,
        )
        .expect("fits");
    assert!(store
        .transition_sandbox("a", &[SandboxState::Running], SandboxState::Stopped, 2, None)
        .expect("stop"));
    store
        .insert_sandbox_checked(
            &new_sandbox("b", Some("acme"), SandboxState::Running),
            &NO_DEFAULTS,
        )
        .expect("the stopped one holds no memory");
    let err = store
        .resume_stopped_checked("a", "acme", &NO_DEFAULTS)
        .expect_err("two would hold 512 MiB");
    assert!(
        matches!(
            err,
            StoreError::QuotaExceeded {
                what: "max_memory",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        store.get_sandbox("a").expect("get").map(|s| s.state),
        Some(SandboxState::Stopped),
        "a refused resume leaves it stopped"
    );
}

#[test]
fn snapshot_quota_counts_snapshots_checkpoints_and_imports_and_holds_under_concurrency() {
    let db = TempDb::new();
    let store = db.open();
    store
        .set_tenant_quota(
            "acme",
            &TenantQuota {
                max_snapshots: Some(5),
                ..TenantQuota::default()
            },
            0,
        )
        .expect("quota");
    store.ensure_tenant("other", 0).expect("tenant");
    insert_snapshot(
        &store,
        &snapshot("sn-c", "acme", SnapshotKind::Checkpoint, 1),
        &NO_DEFAULTS,
    )
    .expect("a checkpoint");
    insert_snapshot(
        &store,
        &snapshot("sn-i", "acme", SnapshotKind::Snapshot, 1),
        &NO_DEFAULTS,
    )
    .expect("an import (no sandbox)");
    insert_snapshot(
        &store,
        &snapshot("sn-o", "other", SnapshotKind::Snapshot, 1),
        &NO_DEFAULTS,
    )
    .expect("another tenant's");
    let barrier = Barrier::new(THREADS);
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (db, barrier) = (&db, &barrier);
                s.spawn(move || {
                    let store = db.open();
                    let snap = snapshot(&format!("sn-{i}"), "acme", SnapshotKind::Snapshot, 1);
                    barrier.wait();
                    insert_snapshot(&store, &snap, &NO_DEFAULTS)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread panicked"))
            .collect()
    });
    assert_exactly_n_succeed(&results, 3, "max_snapshots");
    assert_eq!(
        store.tenant_usage("acme", &NO_DEFAULTS).expect("usage").snapshots,
        5
    );
    // A refused snapshot is not recorded; deleting one frees its place.
    let refused = snapshot("sn-late", "acme", SnapshotKind::Snapshot, 1);
    refused_on(insert_snapshot(&store, &refused, &NO_DEFAULTS), "max_snapshots");
    assert_eq!(store.get_snapshot("sn-late").expect("get"), None);
    assert!(store.mark_snapshot_deleted("sn-c", 5).expect("delete"));
    insert_snapshot(&store, &refused, &NO_DEFAULTS).expect("fits again");
}

#[test]
fn volume_quota_counts_volumes_with_and_without_a_size() {
    let store = Store::open_in_memory().expect("open");
    store
        .set_tenant_quota(
            "acme",
            &TenantQuota {
                max_volumes: Some(2),
                max_storage_bytes: Some(10 << 30),
                ..TenantQuota::default()
            },
            0,
        )
        .expect("quota");
    let defaults = QuotaDefaults {
        unsized_volume_bytes: 4 << 30,
        ..NO_DEFAULTS
    };
    insert_volume(&store, &volume("vol-1", "acme", None), &defaults).expect("unsized fits");
    // An unsized volume is charged the server's default size.
    assert_eq!(
        store
            .tenant_usage("acme", &defaults)
            .expect("usage")
            .storage_bytes,
        4 << 30
    );
    refused_on(
        insert_volume(&store, &volume("vol-2", "acme", Some(7 << 30)), &defaults),
        "max_storage",
    );
    insert_volume(&store, &volume("vol-2", "acme", Some(6 << 30)), &defaults).expect("fits exactly");
    refused_on(
        insert_volume(&store, &volume("vol-3", "acme", Some(1)), &defaults),
        "max_volumes",
    );
    assert_eq!(store.get_volume("vol-3").expect("get"), None, "nothing recorded");
    assert!(store.mark_volume_deleted("vol-1", 9).expect("delete"));
    insert_volume(&store, &volume("vol-3", "acme", Some(1)), &defaults).expect("freed");
}

#[test]
fn storage_quota_sums_sandboxes_snapshots_and_volumes() {
    let store = Store::open_in_memory().expect("open");
    store
        .set_tenant_quota(
            "acme",
            &TenantQuota {
                max_storage_bytes: Some(10_000),
                ..TenantQuota::default()
            },
            0,
        )
        .expect("quota");
    // A sandbox is charged its disk limit plus what it started from.
    let forked = NewSandbox {
        disk_bytes: 3_000,
        base_bytes: 1_000,
        ..new_sandbox("a", Some("acme"), SandboxState::Creating)
    };
    store
        .insert_sandbox_checked(&forked, &NO_DEFAULTS)
        .expect("4000 fits");
    insert_snapshot(
        &store,
        &snapshot("sn-1", "acme", SnapshotKind::Checkpoint, 2_500),
        &NO_DEFAULTS,
    )
    .expect("6500 fits");
    insert_volume(&store, &volume("vol-1", "acme", Some(3_000)), &NO_DEFAULTS).expect("9500 fits");
    let usage = store.tenant_usage("acme", &NO_DEFAULTS).expect("usage");
    assert_eq!(usage.storage_bytes, 9_500, "{usage:?}");
    let big = NewSandbox {
        disk_bytes: 501,
        ..new_sandbox("b", Some("acme"), SandboxState::Creating)
    };
    refused_on(store.insert_sandbox_checked(&big, &NO_DEFAULTS), "max_storage");
    refused_on(
        insert_snapshot(
            &store,
            &snapshot("sn-2", "acme", SnapshotKind::Snapshot, 501),
            &NO_DEFAULTS,
        ),
        "max_storage",
    );
    // A stopped sandbox keeps its charge; a killed one frees it, as does a rollback to a smaller base.
    assert!(store
        .transition_sandbox("a", &[SandboxState::Creating], SandboxState::Stopped, 2, None)
        .expect("stop"));
    refused_on(store.insert_sandbox_checked(&big, &NO_DEFAULTS), "max_storage");
    assert!(store.set_sandbox_base_bytes("a", 0).expect("rebase"));
    store
        .insert_sandbox_checked(&big, &NO_DEFAULTS)
        .expect("the base is freed");
    assert!(store
        .transition_sandbox("a", &[SandboxState::Stopped], SandboxState::Killed, 3, None)
        .expect("kill"));
    assert_eq!(
        store
            .tenant_usage("acme", &NO_DEFAULTS)
            .expect("usage")
            .storage_bytes,
        2_500 + 3_000 + 501
    );
}

/// A fork's copy gets its exact base once its file system is committed: a raise is checked against
/// the storage quota (all or none with the rest of the transaction), a lower figure always taken.
#[test]
fn a_checked_rebase_refuses_a_raise_past_the_storage_quota() {
    let store = Store::open_in_memory().expect("open");
    store
        .set_tenant_quota(
            "acme",
            &TenantQuota {
                max_storage_bytes: Some(10_000),
                max_sandboxes: Some(2),
                ..TenantQuota::default()
            },
            0,
        )
        .expect("quota");
    for id in ["a", "b"] {
        let copy = NewSandbox {
            disk_bytes: 3_000,
            base_bytes: 1_000,
            ..new_sandbox(id, Some("acme"), SandboxState::Creating)
        };
        store.insert_sandbox_checked(&copy, &NO_DEFAULTS).expect("fits");
    }
    let storage = |store: &Store| {
        store
            .tenant_usage("acme", &NO_DEFAULTS)
            .expect("usage")
            .storage_bytes
    };
    assert_eq!(storage(&store), 8_000);
    // At max_sandboxes already: a rebase adds no sandbox, so only the storage quota is asked.
    let raised = store.transaction(|tx| {
        assert!(tx.rebase_sandbox_checked("a", "acme", 2_000, &NO_DEFAULTS)?);
        tx.rebase_sandbox_checked("b", "acme", 2_001, &NO_DEFAULTS)
    });
    match raised {
        Err(StoreError::QuotaExceeded {
            what,
            limit,
            requested_total,
            ..
        }) => {
            assert_eq!((what, limit, requested_total), ("max_storage", 10_000, 10_001));
        }
        other => panic!("a raise past the quota was taken: {other:?}"),
    }
    assert_eq!(storage(&store), 8_000, "a refused transaction changes no base");
    store
        .transaction(|tx| {
            assert!(tx.rebase_sandbox_checked("a", "acme", 2_000, &NO_DEFAULTS)?);
            assert!(tx.rebase_sandbox_checked("b", "acme", 2_000, &NO_DEFAULTS)?);
            Ok::<_, StoreError>(())
        })
        .expect("exactly the quota");
    assert_eq!(storage(&store), 10_000);
    // Lower is always taken; another tenant's sandbox or none is `false`.
    store
        .transaction(|tx| {
            assert!(tx.rebase_sandbox_checked("a", "acme", 0, &NO_DEFAULTS)?);
            assert!(!tx.rebase_sandbox_checked("a", "other", 1, &NO_DEFAULTS)?);
            assert!(!tx.rebase_sandbox_checked("nope", "acme", 1, &NO_DEFAULTS)?);
            Ok::<_, StoreError>(())
        })
        .expect("lower");
    assert_eq!(storage(&store), 8_000);
}

#[test]
fn server_defaults_apply_where_the_tenant_has_no_quota_of_its_own() {
    let store = Store::open_in_memory().expect("open");
    store.ensure_tenant("plain", 0).expect("tenant");
    store
        .set_tenant_quota(
            "special",
            &TenantQuota {
                max_snapshots: Some(3),
                ..TenantQuota::default()
            },
            0,
        )
        .expect("quota");
    let defaults = QuotaDefaults {
        quota: TenantQuota {
            max_snapshots: Some(1),
            max_volumes: Some(0),
            ..TenantQuota::default()
        },
        unsized_volume_bytes: 0,
    };
    for tenant in ["plain", "special"] {
        insert_snapshot(
            &store,
            &snapshot(&format!("{tenant}-1"), tenant, SnapshotKind::Snapshot, 1),
            &defaults,
        )
        .expect("first snapshot");
        refused_on(
            insert_volume(
                &store,
                &volume(&format!("{tenant}-v"), tenant, Some(1)),
                &defaults,
            ),
            "max_volumes",
        );
    }
    refused_on(
        insert_snapshot(
            &store,
            &snapshot("plain-2", "plain", SnapshotKind::Snapshot, 1),
            &defaults,
        ),
        "max_snapshots",
    );
    insert_snapshot(
        &store,
        &snapshot("special-2", "special", SnapshotKind::Snapshot, 1),
        &defaults,
    )
    .expect("its own quota overrides the default");
    assert_eq!(
        store.effective_quota("plain", &defaults).expect("quota"),
        Some(defaults.quota)
    );
    assert_eq!(
        store
            .effective_quota("special", &defaults)
            .expect("quota")
            .and_then(|q| q.max_snapshots),
        Some(3)
    );
}

#[test]
fn a_checked_pre_check_writes_nothing_and_counts_every_copy_of_a_fork() {
    let store = Store::open_in_memory().expect("open");
    store
        .set_tenant_quota("acme", &quota(Some(4), None, None), 0)
        .expect("quota");
    store
        .insert_sandbox_checked(
            &new_sandbox("a", Some("acme"), SandboxState::Running),
            &NO_DEFAULTS,
        )
        .expect("fits");
    let copy = QuotaRequest::sandbox(&new_sandbox("x", Some("acme"), SandboxState::Creating));
    store
        .check_quota("acme", &copy.times(3), &NO_DEFAULTS)
        .expect("three copies fit");
    let err = store
        .check_quota("acme", &copy.times(4), &NO_DEFAULTS)
        .expect_err("four do not");
    assert!(
        matches!(
            err,
            StoreError::QuotaExceeded {
                what: "max_sandboxes",
                limit: 4,
                requested_total: 5,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        store.tenant_usage("acme", &NO_DEFAULTS).expect("usage").sandboxes,
        1
    );
}

/// One step of a tenant's life, for the model test below.
#[derive(Debug, Clone)]
enum Step {
    Create {
        disk: u64,
        base: u64,
        memory: u64,
    },
    Stop(usize),
    Resume(usize),
    Kill(usize),
    Snapshot {
        bytes: u64,
    },
    DeleteSnapshot(usize),
    Volume {
        size: Option<u64>,
    },
    DeleteVolume(usize),
    /// A template build starts, reserving `reserve` bytes.
    Template {
        reserve: u64,
    },
    /// The `i`th building template's build ends, holding `bytes`.
    FinishTemplate {
        i: usize,
        bytes: u64,
    },
    DeleteTemplate(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..4_000u64, 0..2_000u64, 1..400u64).prop_map(|(disk, base, memory)| Step::Create {
            disk,
            base,
            memory
        }),
        (0..8usize).prop_map(Step::Stop),
        (0..8usize).prop_map(Step::Resume),
        (0..8usize).prop_map(Step::Kill),
        (0..3_000u64).prop_map(|bytes| Step::Snapshot { bytes }),
        (0..8usize).prop_map(Step::DeleteSnapshot),
        proptest::option::of(1..3_000u64).prop_map(|size| Step::Volume { size }),
        (0..8usize).prop_map(Step::DeleteVolume),
        (0..3_000u64).prop_map(|reserve| Step::Template { reserve }),
        (0..8usize, 0..6_000u64).prop_map(|(i, bytes)| Step::FinishTemplate { i, bytes }),
        (0..8usize).prop_map(Step::DeleteTemplate),
    ]
}

/// What the model keeps of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ModelSandbox {
    memory: u64,
    storage: u64,
    state: SandboxState,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever a tenant does, the store admits exactly what a model of the quotas admits, refuses
    /// naming the first quota the model finds exceeded, and the usage it reports is the model's.
    #[test]
    fn the_store_admits_exactly_what_the_quota_model_admits(
        max_sandboxes in 0..6u32,
        max_memory in 0..1_500u64,
        max_snapshots in 0..6u32,
        max_volumes in 0..4u32,
        max_templates in 0..4u32,
        max_storage in 0..20_000u64,
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        const UNSIZED: u64 = 1_500;
        let quota = TenantQuota {
            max_sandboxes: Some(max_sandboxes),
            max_memory_bytes: Some(max_memory),
            max_cpu_millis: None,
            max_snapshots: Some(max_snapshots),
            max_volumes: Some(max_volumes),
            max_storage_bytes: Some(max_storage),
            max_templates: Some(max_templates),
        };
        let defaults = QuotaDefaults { unsized_volume_bytes: UNSIZED, ..NO_DEFAULTS };
        let store = Store::open_in_memory().expect("open");
        store.set_tenant_quota("acme", &quota, 0).expect("quota");
        let mut sandboxes: Vec<ModelSandbox> = Vec::new();
        let mut snapshots: Vec<Option<u64>> = Vec::new();
        let mut volumes: Vec<Option<u64>> = Vec::new();
        // Per attempt: (its id, what it is charged, whether it is built) while it exists.
        let mut templates: Vec<Option<(String, u64, bool)>> = Vec::new();
        let usage = |sandboxes: &[ModelSandbox], snapshots: &[Option<u64>], volumes: &[Option<u64>], templates: &[Option<(String, u64, bool)>]| {
            let existing = sandboxes.iter().filter(|s| !s.state.is_ended());
            let running = sandboxes.iter().filter(|s| s.state.is_live());
            TenantUsage {
                sandboxes: existing.clone().count() as u64,
                memory_bytes: running.clone().map(|s| s.memory).sum(),
                cpu_millis: running.count() as u64 * 500,
                snapshots: snapshots.iter().flatten().count() as u64,
                volumes: volumes.iter().flatten().count() as u64,
                templates: templates.iter().flatten().count() as u64,
                storage_bytes: existing.map(|s| s.storage).sum::<u64>()
                    + snapshots.iter().flatten().sum::<u64>()
                    + volumes.iter().flatten().sum::<u64>()
                    + templates.iter().flatten().map(|t| t.1).sum::<u64>(),
            }
        };
        for (n, step) in steps.iter().enumerate() {
            let before = usage(&sandboxes, &snapshots, &volumes, &templates);
            match step.clone() {
                Step::Create { disk, base, memory } => {
                    let new = NewSandbox {
                        memory_bytes: memory,
                        disk_bytes: disk,
                        base_bytes: base,
                        ..new_sandbox(&format!("sb-{n}"), Some("acme"), SandboxState::Creating)
                    };
                    let expected = first_exceeded(&quota, &before, &QuotaRequest::sandbox(&new));
                    let got = store.insert_sandbox_checked(&new, &defaults);
                    check(&got, expected)?;
                    if got.is_ok() {
                        sandboxes.push(ModelSandbox { memory, storage: disk + base, state: SandboxState::Creating });
                    }
                }
                Step::Stop(i) | Step::Resume(i) | Step::Kill(i) => {
                    let Some(index) = (!sandboxes.is_empty()).then(|| i % sandboxes.len()) else { continue };
                    let id = store_id(&store, index)?;
                    let model = &mut sandboxes[index];
                    match step {
                        Step::Stop(_) if model.state == SandboxState::Creating => {
                            prop_assert!(store.transition_sandbox(&id, &[SandboxState::Creating], SandboxState::Stopped, 1, None).expect("stop"));
                            model.state = SandboxState::Stopped;
                        }
                        Step::Resume(_) if model.state == SandboxState::Stopped => {
                            let request = QuotaRequest { memory_bytes: model.memory, cpu_millis: 500, ..QuotaRequest::default() };
                            let expected = first_exceeded(&quota, &before, &request);
                            let got = store.resume_stopped_checked(&id, "acme", &defaults).map(|resumed| assert!(resumed));
                            check(&got, expected)?;
                            if got.is_ok() {
                                model.state = SandboxState::Creating;
                            }
                        }
                        Step::Kill(_) if !model.state.is_ended() => {
                            prop_assert!(store.transition_sandbox(&id, &[model.state], SandboxState::Killed, 1, None).expect("kill"));
                            model.state = SandboxState::Killed;
                        }
                        _ => {}
                    }
                }
                Step::Snapshot { bytes } => {
                    let new = snapshot(&format!("sn-{n}"), "acme", SnapshotKind::Snapshot, bytes);
                    let request = QuotaRequest { snapshots: 1, storage_bytes: bytes, ..QuotaRequest::default() };
                    let got = insert_snapshot(&store, &new, &defaults);
                    check(&got, first_exceeded(&quota, &before, &request))?;
                    snapshots.push(got.is_ok().then_some(bytes));
                }
                Step::DeleteSnapshot(i) => {
                    let live: Vec<usize> = (0..snapshots.len()).filter(|&k| snapshots[k].is_some()).collect();
                    if let Some(&k) = live.get(i % live.len().max(1)) {
                        let id = snapshot_id(&steps, k);
                        prop_assert!(store.mark_snapshot_deleted(&id, 1).expect("delete"));
                        snapshots[k] = None;
                    }
                }
                Step::Volume { size } => {
                    let new = volume(&format!("vol-{n}"), "acme", size);
                    let charge = size.unwrap_or(UNSIZED);
                    let request = QuotaRequest { volumes: 1, storage_bytes: charge, ..QuotaRequest::default() };
                    let got = insert_volume(&store, &new, &defaults);
                    check(&got, first_exceeded(&quota, &before, &request))?;
                    volumes.push(got.is_ok().then_some(charge));
                }
                Step::DeleteVolume(i) => {
                    let live: Vec<usize> = (0..volumes.len()).filter(|&k| volumes[k].is_some()).collect();
                    if let Some(&k) = live.get(i % live.len().max(1)) {
                        prop_assert!(store.mark_volume_deleted(&volume_id(&steps, k), 1).expect("delete"));
                        volumes[k] = None;
                    }
                }
                Step::Template { reserve } => {
                    let id = format!("tp-{n}");
                    let new = NewTemplate {
                        id: id.clone(),
                        tenant: "acme".into(),
                        name: format!("t{n}"),
                        source: "registry.test/img".into(),
                        created_at_ms: 0,
                        storage_bytes: reserve,
                    };
                    let request = QuotaRequest { templates: 1, storage_bytes: reserve, ..QuotaRequest::default() };
                    let got = store.insert_template_checked(&new, &defaults);
                    check(&got, first_exceeded(&quota, &before, &request))?;
                    templates.push(got.is_ok().then_some((id, reserve, false)));
                }
                Step::FinishTemplate { i, bytes } => {
                    let building: Vec<usize> = (0..templates.len())
                        .filter(|&k| matches!(templates[k], Some((_, _, false))))
                        .collect();
                    if let Some(&k) = building.get(i % building.len().max(1)) {
                        let (id, reserve, _) = templates[k].clone().expect("building");
                        // Its reservation is replaced by what it holds: checked without it.
                        let mut without = before;
                        without.storage_bytes -= reserve;
                        let request = QuotaRequest { storage_bytes: bytes, ..QuotaRequest::default() };
                        let got = store.transaction(|tx| tx.finish_template(&id, "{}", bytes, Some(&defaults)));
                        check(&got, first_exceeded(&quota, &without, &request))?;
                        if got.is_ok() {
                            templates[k] = Some((id, bytes, true));
                        }
                    }
                }
                Step::DeleteTemplate(i) => {
                    let live: Vec<usize> = (0..templates.len()).filter(|&k| templates[k].is_some()).collect();
                    if let Some(&k) = live.get(i % live.len().max(1)) {
                        let (id, _, _) = templates[k].clone().expect("live");
                        // A build that fails removes its row; a built one is marked deleted.
                        let gone = match templates[k] {
                            Some((_, _, false)) => store.forget_template(&id).is_ok(),
                            _ => store.delete_template_unless_used(&id, 1).expect("delete") == TemplateDeletion::Deleted,
                        };
                        prop_assert!(gone);
                        templates[k] = None;
                    }
                }
            }
            let model = usage(&sandboxes, &snapshots, &volumes, &templates);
            prop_assert_eq!(store.tenant_usage("acme", &defaults).expect("usage"), model);
        }
    }
}

/// Compares a store result with the model's verdict (`None`: admitted).
fn check<T: std::fmt::Debug>(
    got: &Result<T, StoreError>,
    expected: Option<(&'static str, u64, u64)>,
) -> Result<(), TestCaseError> {
    match (got, expected) {
        (Ok(_), None) => Ok(()),
        (
            Err(StoreError::QuotaExceeded {
                what,
                limit,
                requested_total,
                ..
            }),
            Some(e),
        ) => {
            prop_assert_eq!((*what, *limit, *requested_total), e);
            Ok(())
        }
        (got, expected) => Err(TestCaseError::fail(format!(
            "store said {got:?}, the model {expected:?}"
        ))),
    }
}

/// The store id of the `index`th sandbox the model admitted (ids are `sb-<step>`, in step order).
fn store_id(store: &Store, index: usize) -> Result<String, TestCaseError> {
    let mut ids: Vec<(usize, String)> = store
        .list_sandboxes(&paddock_store::SandboxFilter {
            tenant: Some("acme".into()),
            states: SandboxState::ALL.to_vec(),
            limit: 1000,
            ..Default::default()
        })
        .expect("list")
        .into_iter()
        .map(|s| (s.id[3..].parse().expect("numbered"), s.id))
        .collect();
    ids.sort();
    ids.get(index)
        .map(|(_, id)| id.clone())
        .ok_or_else(|| TestCaseError::fail(format!("no sandbox #{index}")))
}

/// The id of the `k`th snapshot step (admitted or not: the model keeps one entry per attempt).
fn snapshot_id(steps: &[Step], k: usize) -> String {
    let n = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Step::Snapshot { .. }))
        .nth(k)
        .map(|(n, _)| n)
        .expect("a snapshot step");
    format!("sn-{n}")
}

/// The id of the `k`th volume step.
fn volume_id(steps: &[Step], k: usize) -> String {
    let n = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Step::Volume { .. }))
        .nth(k)
        .map(|(n, _)| n)
        .expect("a volume step");
    format!("vol-{n}")
}
