//! Retention of network audit rows: what it removes (network rows only, by age and per-tenant
//! count), that the chain still verifies across what it removed, that every other removal or change
//! is still refused by the triggers, and that tampering with the prune records is caught.

mod support;

use paddock_store::{AuditFilter, NetworkRetention, NewAuditEntry, Store, PRUNE_ACTION};
use proptest::prelude::*;
use serde_json::json;
use support::TempDb;

fn row(ts_ms: i64, tenant: &str, action: &str) -> NewAuditEntry {
    NewAuditEntry {
        ts_ms,
        tenant: Some(tenant.to_owned()),
        key_id: None,
        action: action.to_owned(),
        sandbox_id: Some("sb-1".to_owned()),
        outcome: "allowed".to_owned(),
        detail: json!({ "ts": ts_ms }),
    }
}

fn all_rows(store: &Store) -> Vec<(u64, String, Option<String>)> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .query_audit(&AuditFilter {
                after_seq: after,
                limit: 1000,
                ..Default::default()
            })
            .expect("query");
        let Some(last) = page.last() else { break };
        after = Some(last.seq);
        out.extend(page.into_iter().map(|r| (r.seq, r.action, r.tenant)));
    }
    out
}

fn intact(store: &Store) -> paddock_store::AuditVerification {
    let v = store.verify_audit().expect("verify");
    assert!(v.is_intact(), "{v:?}");
    v
}

const AGE: NetworkRetention = NetworkRetention {
    older_than_ms: Some(100),
    max_rows_per_tenant: None,
    batch: 10_000,
};

#[test]
fn old_network_rows_go_everything_else_stays_and_the_chain_verifies() {
    let store = Store::open_in_memory().expect("open");
    // seq 1..=20: network rows interleaved with others, half of them old.
    for i in 0..20i64 {
        let action = match i % 4 {
            0 => "sandbox.create",
            1 | 2 => "network.dns",
            _ => "network.connection",
        };
        store.append_audit(&row(i * 10, "acme", action)).expect("append");
    }
    let before = all_rows(&store);
    let report = store.prune_network_audit(&AGE, 1_000).expect("prune");
    // Old network rows: ts < 100, i.e. i < 10 and i % 4 != 0: i = 1, 2, 3, 5, 6, 7, 9.
    assert_eq!(report.rows, 7);
    assert_eq!(report.ranges, 3, "seqs 2-4, 6-8, 10");
    let anchor = report.anchor_seq.expect("an anchor row");
    assert_eq!(anchor, 21);
    let after = all_rows(&store);
    let gone: Vec<u64> = before
        .iter()
        .filter(|r| !after.contains(r))
        .map(|r| r.0)
        .collect();
    assert_eq!(gone, [2, 3, 4, 6, 7, 8, 10]);
    assert!(after.iter().any(|r| r.0 == anchor && r.1 == PRUNE_ACTION));
    let v = intact(&store);
    assert_eq!((v.rows_checked, v.rows_pruned, v.prune_anchors), (14, 7, 1));
    // Nothing more to do: no second anchor.
    assert_eq!(store.prune_network_audit(&AGE, 1_001).expect("prune").rows, 0);

    // A later prune removes rows next to an earlier range: verify crosses both.
    let later = NetworkRetention {
        older_than_ms: Some(200),
        ..AGE
    };
    let report = store.prune_network_audit(&later, 1_002).expect("prune");
    assert_eq!(report.rows, 8, "i = 10, 11, 13, 14, 15, 17, 18, 19");
    store
        .append_audit(&row(5_000, "acme", "network.dns"))
        .expect("append after a prune");
    let v = intact(&store);
    assert_eq!((v.rows_pruned, v.prune_anchors), (15, 2));
    assert_eq!(
        store.pruned_ranges(anchor).expect("ranges").len(),
        3,
        "the ranges of a prune stay readable"
    );
}

#[test]
fn each_tenant_keeps_its_newest_network_rows() {
    let store = Store::open_in_memory().expect("open");
    for i in 0..30i64 {
        let tenant = if i % 3 == 0 { "quiet" } else { "noisy" };
        store
            .append_audit(&row(i, tenant, "network.connection"))
            .expect("append");
    }
    store
        .append_audit(&row(99, "noisy", "process.start"))
        .expect("append");
    let rule = NetworkRetention {
        older_than_ms: None,
        max_rows_per_tenant: Some(5),
        batch: 10_000,
    };
    let report = store.prune_network_audit(&rule, 1_000).expect("prune");
    assert_eq!(report.rows, (20 - 5) + (10 - 5));
    let rows = all_rows(&store);
    for tenant in ["quiet", "noisy"] {
        let kept: Vec<u64> = rows
            .iter()
            .filter(|r| r.2.as_deref() == Some(tenant) && r.1 == "network.connection")
            .map(|r| r.0)
            .collect();
        assert_eq!(kept.len(), 5, "{tenant}: {kept:?}");
        let newest = if tenant == "quiet" {
            vec![16, 19, 22, 25, 28]
        } else {
            vec![24, 26, 27, 29, 30]
        };
        assert_eq!(kept, newest, "{tenant} keeps its newest rows");
    }
    assert!(rows.iter().any(|r| r.1 == "process.start"));
    intact(&store);
    // A batch smaller than the excess takes the oldest first, and the next call the rest.
    for i in 0..10i64 {
        store
            .append_audit(&row(100 + i, "quiet", "network.dns"))
            .expect("append");
    }
    let small = NetworkRetention { batch: 4, ..rule };
    assert_eq!(store.prune_network_audit(&small, 2_000).expect("prune").rows, 4);
    assert_eq!(store.prune_network_audit(&small, 2_001).expect("prune").rows, 4);
    assert_eq!(store.prune_network_audit(&small, 2_002).expect("prune").rows, 2);
    assert_eq!(store.prune_network_audit(&small, 2_003).expect("prune").rows, 0);
    let v = intact(&store);
    assert_eq!(v.prune_anchors, 4);
}

#[test]
fn the_triggers_refuse_every_other_removal_and_change() {
    let db = TempDb::new();
    let store = db.open();
    for (i, action) in ["sandbox.create", "network.dns", "network.dns", "process.start"]
        .into_iter()
        .enumerate()
    {
        store
            .append_audit(&row(i as i64, "acme", action))
            .expect("append");
    }
    store.prune_network_audit(&AGE, 1_000).expect("prune");
    let raw = db.raw();
    for sql in [
        // Not a network row, or no recorded range covers it.
        "DELETE FROM audit WHERE seq = 1",
        "DELETE FROM audit WHERE seq = 4",
        "DELETE FROM audit",
        "UPDATE audit SET outcome = 'denied' WHERE seq = 5",
        // The records of pruned ranges are append-only, and vouched for by an audit.prune row.
        "UPDATE audit_pruned SET last_hash = 'x'",
        "DELETE FROM audit_pruned",
        "INSERT INTO audit_pruned (first_seq, last_seq, prev_hash, last_hash, anchor_seq) VALUES (1, 1, 'a', 'b', 4)",
        "INSERT INTO audit_pruned (first_seq, last_seq, prev_hash, last_hash, anchor_seq) VALUES (6, 6, 'a', 'b', 5)",
    ] {
        let err = raw.execute(sql, []).expect_err(sql);
        assert!(err.to_string().contains("audit"), "{sql}: {err}");
    }
    // A new network row is not deletable either until retention records it.
    store
        .append_audit(&row(10, "acme", "network.connection"))
        .expect("append");
    let err = raw
        .execute("DELETE FROM audit WHERE seq = 6", [])
        .expect_err("unrecorded network row");
    assert!(err.to_string().contains("append-only"), "{err}");
    drop(raw);
    intact(&store);
}

/// Makes the raw connection able to change anything, as an attacker with file access could.
fn drop_all_triggers(raw: &rusqlite::Connection) {
    raw.execute_batch(
        "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete; \
         DROP TRIGGER audit_pruned_no_update; DROP TRIGGER audit_pruned_no_delete; \
         DROP TRIGGER audit_pruned_anchored;",
    )
    .expect("drop triggers");
}

/// seq 1..=6: create, dns, dns, start, dns, start; then a prune of seq 2, 3 and 5 (anchor 7).
fn pruned_db() -> TempDb {
    let db = TempDb::new();
    let store = db.open();
    for (i, action) in [
        "sandbox.create",
        "network.dns",
        "network.dns",
        "process.start",
        "network.dns",
        "process.start",
    ]
    .into_iter()
    .enumerate()
    {
        store
            .append_audit(&row(i as i64, "acme", action))
            .expect("append");
    }
    let report = store.prune_network_audit(&AGE, 1_000).expect("prune");
    assert_eq!((report.rows, report.anchor_seq), (3, Some(7)));
    intact(&store);
    db
}

fn broken(db: &TempDb) -> String {
    let v = db.open().verify_audit().expect("verify");
    v.first_broken.expect("tampering must be detected").reason
}

#[test]
fn a_deleted_row_passed_off_as_pruned_is_detected() {
    // Deleting a process row and recording a range for it under the real anchor: the anchor's
    // digest no longer matches its ranges.
    let db = pruned_db();
    let raw = db.raw();
    drop_all_triggers(&raw);
    let (prev, hash): (String, String) = raw
        .query_row("SELECT prev_hash, hash FROM audit WHERE seq = 4", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .expect("row 4");
    raw.execute("DELETE FROM audit WHERE seq = 4", [])
        .expect("tamper");
    raw.execute(
        "INSERT INTO audit_pruned (first_seq, last_seq, prev_hash, last_hash, anchor_seq) VALUES (4, 4, ?1, ?2, 7)",
        [&prev, &hash],
    )
    .expect("tamper");
    drop(raw);
    let reason = broken(&db);
    assert!(reason.contains("not those it vouches for"), "{reason}");
}

#[test]
fn a_changed_or_removed_range_record_is_detected() {
    let db = pruned_db();
    let raw = db.raw();
    drop_all_triggers(&raw);
    raw.execute(
        "UPDATE audit_pruned SET last_hash = ?1 WHERE first_seq = 2",
        [&"ab".repeat(32)],
    )
    .expect("tamper");
    drop(raw);
    let reason = broken(&db);
    assert!(
        reason.contains("prev_hash") || reason.contains("vouches"),
        "{reason}"
    );

    let db = pruned_db();
    let raw = db.raw();
    drop_all_triggers(&raw);
    raw.execute("DELETE FROM audit_pruned WHERE first_seq = 5", [])
        .expect("tamper");
    drop(raw);
    // The anchor no longer has the ranges it vouches for: caught at the first one crossed.
    let reason = broken(&db);
    assert!(reason.contains("not those it vouches for"), "{reason}");
}

#[test]
fn a_forged_anchor_is_detected() {
    // The ranges point at a row that is not an audit.prune row.
    let db = pruned_db();
    let raw = db.raw();
    drop_all_triggers(&raw);
    raw.execute("UPDATE audit_pruned SET anchor_seq = 6", [])
        .expect("tamper");
    drop(raw);
    let reason = broken(&db);
    assert!(reason.contains("not audit.prune"), "{reason}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any mix of rows and any sequence of prunes: the chain verifies, no row but a network row is
    /// ever removed, and every row appended is either there or counted as pruned.
    #[test]
    fn any_prunes_keep_the_chain_verifiable(
        actions in proptest::collection::vec(0u8..4, 1..80),
        prunes in proptest::collection::vec((0i64..90, proptest::option::of(0u64..20), 1u32..30), 1..5),
    ) {
        let store = Store::open_in_memory().expect("open");
        for (i, a) in actions.iter().enumerate() {
            let action = ["network.dns", "network.connection", "process.start", "sandbox.create"][usize::from(*a)];
            let tenant = if i % 2 == 0 { "a" } else { "b" };
            store.append_audit(&row(i as i64, tenant, action)).expect("append");
        }
        let mut anchors = 0u64;
        for (k, (age, max, batch)) in prunes.iter().enumerate() {
            let rule = NetworkRetention { older_than_ms: Some(*age), max_rows_per_tenant: *max, batch: *batch };
            let report = store.prune_network_audit(&rule, 10_000 + k as i64).expect("prune");
            anchors += u64::from(report.anchor_seq.is_some());
        }
        let rows = all_rows(&store);
        let v = store.verify_audit().expect("verify");
        prop_assert!(v.is_intact(), "{:?}", v);
        prop_assert_eq!(v.rows_checked + v.rows_pruned, actions.len() as u64 + anchors);
        prop_assert_eq!(v.prune_anchors, anchors);
        let others = actions.iter().filter(|a| **a >= 2).count();
        let kept_others = rows.iter().filter(|r| !r.1.starts_with("network.") && r.1 != PRUNE_ACTION).count();
        prop_assert_eq!(kept_others, others);
    }
}
