//! Snapshot records and the paused flag.

mod support;

use paddock_store::{NewSnapshot, SandboxState, SnapshotFilter, SnapshotKind, Store, StoreError};
use support::{labels, new_sandbox, TempDb};

fn store() -> Store {
    let store = Store::open_in_memory().expect("open");
    store.ensure_tenant("acme", 0).expect("tenant");
    store.ensure_tenant("beta", 0).expect("tenant");
    store
}

fn snap(id: &str, tenant: &str, sandbox: &str, kind: SnapshotKind, at: i64) -> NewSnapshot {
    NewSnapshot {
        id: id.to_owned(),
        tenant: tenant.to_owned(),
        sandbox_id: Some(sandbox.to_owned()),
        kind,
        name: Some(format!("name of {id}")),
        labels: labels(&[("k", id)]),
        created_at_ms: at,
        storage_bytes: 4096,
        template_id: None,
    }
}

#[test]
fn snapshots_round_trip_list_and_delete() {
    let s = store();
    s.insert_snapshot(&snap("sn-1", "acme", "sb-1", SnapshotKind::Snapshot, 10))
        .expect("insert");
    s.insert_snapshot(&snap("sn-2", "acme", "sb-1", SnapshotKind::Checkpoint, 20))
        .expect("insert");
    s.insert_snapshot(&snap("sn-3", "beta", "sb-2", SnapshotKind::Snapshot, 30))
        .expect("insert");
    assert!(matches!(
        s.insert_snapshot(&snap("sn-1", "acme", "sb-1", SnapshotKind::Snapshot, 10)),
        Err(StoreError::Conflict { .. })
    ));
    let got = s.get_snapshot("sn-2").expect("get").expect("present");
    assert_eq!(got.kind, SnapshotKind::Checkpoint);
    assert_eq!(got.labels, labels(&[("k", "sn-2")]));
    assert_eq!(got.name.as_deref(), Some("name of sn-2"));

    let acme = |kind| SnapshotFilter {
        tenant: Some("acme".into()),
        kind,
        limit: 100,
        ..Default::default()
    };
    let ids = |v: Vec<paddock_store::SnapshotRecord>| v.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(s.list_snapshots(&acme(None)).expect("list")),
        ["sn-1", "sn-2"]
    );
    assert_eq!(
        ids(s
            .list_snapshots(&acme(Some(SnapshotKind::Snapshot)))
            .expect("list")),
        ["sn-1"]
    );
    let page = SnapshotFilter {
        after_id: Some("sn-1".into()),
        limit: 1,
        ..Default::default()
    };
    assert_eq!(ids(s.list_snapshots(&page).expect("list")), ["sn-2"]);

    assert!(s.mark_snapshot_deleted("sn-1", 50).expect("delete"));
    assert!(!s.mark_snapshot_deleted("sn-1", 60).expect("again"));
    assert!(!s.mark_snapshot_deleted("sn-404", 60).expect("absent"));
    assert_eq!(ids(s.list_snapshots(&acme(None)).expect("list")), ["sn-2"]);
    assert_eq!(s.existing_snapshot_ids().expect("ids"), ["sn-2", "sn-3"]);
    assert_eq!(
        s.get_snapshot("sn-1")
            .expect("get")
            .expect("kept as history")
            .deleted_at_ms,
        Some(50)
    );
}

#[test]
fn latest_checkpoint_is_the_newest_existing_one() {
    let s = store();
    assert!(s.latest_checkpoint("sb-1").expect("none").is_none());
    for (id, at) in [("sn-a", 10), ("sn-b", 20), ("sn-c", 20)] {
        s.insert_snapshot(&snap(id, "acme", "sb-1", SnapshotKind::Checkpoint, at))
            .expect("insert");
    }
    s.insert_snapshot(&snap("sn-d", "acme", "sb-1", SnapshotKind::Snapshot, 99))
        .expect("a named snapshot is not a checkpoint");
    // Same time: the later insert wins.
    assert_eq!(
        s.latest_checkpoint("sb-1").expect("get").expect("some").id,
        "sn-c"
    );
    s.mark_snapshot_deleted("sn-c", 30).expect("commit");
    assert_eq!(
        s.latest_checkpoint("sb-1").expect("get").expect("some").id,
        "sn-b"
    );
    let tx_view = s
        .transaction(|tx| tx.latest_checkpoint("sb-1"))
        .expect("tx")
        .expect("some");
    assert_eq!(tx_view.id, "sn-b");
}

#[test]
fn only_running_sandboxes_pause() {
    let s = store();
    s.insert_sandbox(&new_sandbox("sb-1", Some("acme"), SandboxState::Running))
        .expect("insert");
    s.insert_sandbox(&new_sandbox("sb-2", Some("acme"), SandboxState::Killed))
        .expect("insert");
    assert!(!s.get_sandbox("sb-1").expect("get").expect("present").paused);
    assert!(s.set_sandbox_paused("sb-1", true).expect("pause"));
    assert!(!s.set_sandbox_paused("sb-1", true).expect("already paused"));
    assert!(s.get_sandbox("sb-1").expect("get").expect("present").paused);
    assert!(!s.set_sandbox_paused("sb-2", true).expect("not running"));
    assert!(s.set_sandbox_paused("sb-1", false).expect("resume"));
    assert!(!s.get_sandbox("sb-1").expect("get").expect("present").paused);
}

#[test]
fn imported_snapshots_have_no_sandbox_but_checkpoints_must() {
    let s = store();
    let imported = NewSnapshot {
        sandbox_id: None,
        ..snap("sn-imp", "acme", "unused", SnapshotKind::Snapshot, 10)
    };
    s.insert_snapshot(&imported).expect("an imported snapshot");
    let got = s.get_snapshot("sn-imp").expect("get").expect("present");
    assert_eq!(got.sandbox_id, None);
    assert_eq!(got.kind, SnapshotKind::Snapshot);
    let filter = SnapshotFilter {
        tenant: Some("acme".into()),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(s.list_snapshots(&filter).expect("list").len(), 1);
    let orphan_checkpoint = NewSnapshot {
        sandbox_id: None,
        ..snap("sn-cp", "acme", "unused", SnapshotKind::Checkpoint, 10)
    };
    assert!(
        s.insert_snapshot(&orphan_checkpoint).is_err(),
        "a checkpoint without a sandbox is refused"
    );
}

#[test]
fn snapshots_taken_before_imports_existed_survive_the_migration() {
    let db = TempDb::new();
    {
        // A database as version 2 left it.
        let raw = db.raw();
        raw.execute_batch(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL) STRICT;",
        )
        .expect("version table");
        raw.execute_batch(include_str!("../migrations/0001_init.sql"))
            .expect("migration 1");
        raw.execute_batch(include_str!("../migrations/0002_snapshots.sql"))
            .expect("migration 2");
        raw.execute_batch(
            "INSERT INTO schema_migrations VALUES (1, 0), (2, 0);
             INSERT INTO tenants (name, max_sandboxes, created_at_ms) VALUES ('acme', 0, 0);
             INSERT INTO snapshots (id, tenant, sandbox_id, kind, name, labels_json, created_at_ms)
                 VALUES ('sn-old', 'acme', 'sb-1', 'checkpoint', 'n', '{\"a\":\"b\"}', 5);",
        )
        .expect("version 2 rows");
    }
    let s = db.open();
    let got = s.get_snapshot("sn-old").expect("get").expect("kept");
    assert_eq!(got.sandbox_id.as_deref(), Some("sb-1"));
    assert_eq!(got.kind, SnapshotKind::Checkpoint);
    assert_eq!(got.labels, labels(&[("a", "b")]));
    assert_eq!(
        s.latest_checkpoint("sb-1")
            .expect("index works")
            .expect("some")
            .id,
        "sn-old"
    );
}
