//! Opening databases: migrations, refusal of unknown schema versions, read-only opens, file mode.

mod support;

use std::os::unix::fs::PermissionsExt;

use paddock_store::{Store, StoreError, SCHEMA_VERSION};
use support::TempDb;

#[test]
fn fresh_database_gets_the_latest_schema() {
    let db = TempDb::new();
    let store = db.open();
    assert_eq!(store.schema_version().expect("read version"), SCHEMA_VERSION);
    let applied: Vec<i64> = {
        let raw = db.raw();
        let mut stmt = raw
            .prepare("SELECT version FROM schema_migrations ORDER BY version")
            .expect("prepare");
        stmt.query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows")
    };
    assert_eq!(applied, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
}

#[test]
fn reopening_is_a_no_op() {
    let db = TempDb::new();
    let store = db.open();
    store.ensure_tenant("acme", 5).expect("tenant");
    drop(store);
    let applied_at: i64 = db
        .raw()
        .query_row(
            "SELECT applied_at_ms FROM schema_migrations WHERE version = 1",
            [],
            |r| r.get(0),
        )
        .expect("applied_at");

    let store = db.open();
    assert_eq!(store.schema_version().expect("read version"), SCHEMA_VERSION);
    assert!(
        store.get_tenant("acme").expect("get").is_some(),
        "data survives a reopen"
    );
    let (rows, applied_again): (i64, i64) = db
        .raw()
        .query_row(
            "SELECT COUNT(*), MAX(applied_at_ms) FROM schema_migrations WHERE version = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .expect("count");
    assert_eq!(
        (rows, applied_again),
        (1, applied_at),
        "migration 1 was not re-applied"
    );
}

#[test]
fn concurrent_first_opens_migrate_once() {
    let db = TempDb::new();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| db.open());
        }
    });
    let rows: i64 = db
        .raw()
        .query_row("SELECT COUNT(*) FROM schema_migrations", [], |r| r.get(0))
        .expect("count");
    assert_eq!(rows, SCHEMA_VERSION);
}

#[test]
fn database_from_a_newer_paddock_is_refused() {
    let db = TempDb::new();
    drop(db.open());
    db.raw()
        .execute(
            "INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?1, 0)",
            [SCHEMA_VERSION + 1],
        )
        .expect("fake a future migration");

    let err = Store::open(&db.path).expect_err("a newer schema must be refused");
    assert!(
        matches!(err, StoreError::SchemaTooNew { found, latest, .. } if found == SCHEMA_VERSION + 1 && latest == SCHEMA_VERSION),
        "{err:?}"
    );
    assert!(err.to_string().contains("newer"), "{err}");

    let err = Store::open_read_only(&db.path).expect_err("read-only too");
    assert!(matches!(err, StoreError::SchemaTooNew { .. }), "{err:?}");
}

#[test]
fn read_only_open_refuses_an_uninitialised_database_and_changes_nothing() {
    let db = TempDb::new();
    std::fs::write(&db.path, b"").expect("create empty file");
    let err = Store::open_read_only(&db.path).expect_err("no schema yet");
    assert!(
        matches!(err, StoreError::SchemaOutdated { found: 0, .. }),
        "{err:?}"
    );
    let tables: i64 = db
        .raw()
        .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
        .expect("count");
    assert_eq!(tables, 0, "a read-only open must not create anything");
}

#[test]
fn read_only_store_reads_but_cannot_write() {
    let db = TempDb::new();
    let store = db.open();
    store.ensure_tenant("acme", 1).expect("tenant");
    drop(store);

    let ro = Store::open_read_only(&db.path).expect("open read-only");
    assert!(ro.get_tenant("acme").expect("read").is_some());
    let err = ro.ensure_tenant("other", 2).expect_err("writes fail");
    assert!(matches!(err, StoreError::Write { .. }), "{err:?}");
}

#[test]
fn missing_directory_is_a_create_file_error() {
    let db = TempDb::new();
    let err = Store::open(&db.dir.path().join("nope/state.db")).expect_err("no such directory");
    assert!(matches!(err, StoreError::CreateFile { .. }), "{err:?}");
}

#[test]
fn database_files_are_private() {
    let db = TempDb::new();
    let store = db.open();
    store
        .ensure_tenant("acme", 1)
        .expect("write something so the WAL exists");
    let mode = |path: &std::path::Path| std::fs::metadata(path).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&db.path), 0o600, "database file");
    let wal = db.path.with_extension("db-wal");
    assert!(wal.exists(), "WAL mode is on");
    assert_eq!(mode(&wal), 0o600, "WAL file");
}

#[test]
fn version_2_databases_keep_their_sandboxes_and_killed_ones_are_renamed() {
    let db = TempDb::new();
    {
        let raw = db.raw();
        raw.execute_batch(include_str!("../migrations/0001_init.sql"))
            .expect("schema 1");
        raw.execute_batch(include_str!("../migrations/0002_snapshots.sql"))
            .expect("schema 2");
        raw.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL) STRICT;
             INSERT INTO schema_migrations VALUES (1, 0), (2, 0);
             INSERT INTO tenants (name, created_at_ms) VALUES ('acme', 0);
             INSERT INTO sandboxes (id, tenant, state, profile, spec_json, memory_bytes, cpu_millis, created_at_ms, ended_at_ms, end_reason)
               VALUES ('sb-killed', 'acme', 'stopped', 'default', '{}', 0, 0, 1, 2, 'killed');
             INSERT INTO sandboxes (id, tenant, state, profile, spec_json, memory_bytes, cpu_millis, created_at_ms, paused)
               VALUES ('sb-running', 'acme', 'running', 'default', '{}', 5, 7, 1, 1);",
        )
        .expect("version 2 rows");
    }
    let store = db.open();
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let killed = store.get_sandbox("sb-killed").expect("read").expect("kept");
    assert_eq!(killed.state, paddock_store::SandboxState::Killed, "{killed:?}");
    assert_eq!(
        (killed.ended_at_ms, killed.end_reason.as_deref()),
        (Some(2), Some("killed"))
    );
    let running = store.get_sandbox("sb-running").expect("read").expect("kept");
    assert_eq!(running.state, paddock_store::SandboxState::Running);
    assert!(running.paused);
    assert_eq!((running.memory_bytes, running.cpu_millis), (5, 7));
}

#[test]
fn version_6_databases_get_storage_charges_from_their_stored_disk_limits() {
    let db = TempDb::new();
    {
        let raw = db.raw();
        for sql in [
            include_str!("../migrations/0001_init.sql"),
            include_str!("../migrations/0002_snapshots.sql"),
            include_str!("../migrations/0003_stopped.sql"),
            include_str!("../migrations/0004_snapshot_import.sql"),
            include_str!("../migrations/0005_volumes.sql"),
            include_str!("../migrations/0006_network.sql"),
        ] {
            raw.execute_batch(sql).expect("older schema");
        }
        raw.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL) STRICT;
             INSERT INTO schema_migrations VALUES (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0);
             INSERT INTO tenants (name, max_sandboxes, created_at_ms) VALUES ('acme', 3, 0);
             INSERT INTO sandboxes (id, tenant, state, profile, spec_json, memory_bytes, cpu_millis, created_at_ms)
               VALUES ('sb-disk', 'acme', 'stopped', 'default', '{\"limits\":{\"disk\":1048576}}', 0, 0, 1);
             INSERT INTO sandboxes (id, tenant, state, profile, spec_json, memory_bytes, cpu_millis, created_at_ms)
               VALUES ('sb-nodisk', 'acme', 'running', 'default', '{\"limits\":{\"disk\":null}}', 0, 0, 1);
             INSERT INTO snapshots (id, tenant, sandbox_id, kind, created_at_ms)
               VALUES ('sn-of-disk', 'acme', 'sb-disk', 'snapshot', 2);
             INSERT INTO snapshots (id, tenant, sandbox_id, kind, created_at_ms)
               VALUES ('sn-imported', 'acme', NULL, 'snapshot', 2);
             INSERT INTO volumes (id, tenant, name, size_bytes, created_at_ms)
               VALUES ('vol-unsized', 'acme', 'data', NULL, 3);",
        )
        .expect("version 6 rows");
    }
    let store = db.open();
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let disk = store.get_sandbox("sb-disk").expect("read").expect("kept");
    assert_eq!((disk.disk_bytes, disk.base_bytes), (1 << 20, 0));
    let none = store.get_sandbox("sb-nodisk").expect("read").expect("kept");
    assert_eq!(none.disk_bytes, 0);
    let snap = store.get_snapshot("sn-of-disk").expect("read").expect("kept");
    assert_eq!(snap.storage_bytes, 1 << 20, "charged its sandbox's disk limit");
    let imported = store.get_snapshot("sn-imported").expect("read").expect("kept");
    assert_eq!(imported.storage_bytes, 0);
    let tenant = store.get_tenant("acme").expect("read").expect("kept");
    assert_eq!(tenant.quota.max_sandboxes, Some(3), "existing quotas are kept");
    assert_eq!(tenant.quota.max_snapshots, None);
    let defaults = paddock_store::QuotaDefaults {
        unsized_volume_bytes: 1000,
        ..Default::default()
    };
    let usage = store.tenant_usage("acme", &defaults).expect("usage");
    assert_eq!(
        (
            usage.sandboxes,
            usage.snapshots,
            usage.volumes,
            usage.storage_bytes
        ),
        (2, 2, 1, (1 << 20) + (1 << 20) + 1000),
        "the stopped sandbox counts; the unsized volume is charged the default size"
    );
}

/// Secrets stored before bindings existed are bound to `Authorization` only (not "any header", the
/// behaviour that let an echoing endpoint hand a value back), and not to query strings.
#[test]
fn version_6_secrets_are_bound_to_authorization_only() {
    let db = TempDb::new();
    {
        let raw = db.raw();
        for sql in [
            include_str!("../migrations/0001_init.sql"),
            include_str!("../migrations/0002_snapshots.sql"),
            include_str!("../migrations/0003_stopped.sql"),
            include_str!("../migrations/0004_snapshot_import.sql"),
            include_str!("../migrations/0005_volumes.sql"),
            include_str!("../migrations/0006_network.sql"),
        ] {
            raw.execute_batch(sql).expect("older schema");
        }
        raw.execute_batch(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL) STRICT;
             INSERT INTO schema_migrations VALUES (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (6, 0);
             INSERT INTO tenants (name, created_at_ms) VALUES ('acme', 0);
             INSERT INTO secrets (tenant, name, value, hosts_json, created_at_ms)
               VALUES ('acme', 'GH', X'6768705f', '[\"api.test\"]', 3);",
        )
        .expect("version 6 rows");
    }
    let store = db.open();
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let listed = store.list_secrets("acme").expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].hosts, vec!["api.test".to_owned()]);
    assert_eq!(listed[0].headers, vec!["authorization".to_owned()]);
    assert!(!listed[0].query);
}

/// A database at schema version 1 holding one key of tenant `acme` (an admin key when `admin`).
fn version_1_with_a_key(admin: bool) -> TempDb {
    let db = TempDb::new();
    let raw = db.raw();
    raw.execute_batch(include_str!("../migrations/0001_init.sql"))
        .expect("schema 1");
    raw.execute_batch(&format!(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at_ms INTEGER NOT NULL) STRICT;
         INSERT INTO schema_migrations VALUES (1, 0);
         INSERT INTO tenants (name, created_at_ms) VALUES ('acme', 0);
         INSERT INTO api_keys (id, tenant, name, admin, secret_hash, created_at_ms)
           VALUES ('0123456789ab', 'acme', 'old', {}, zeroblob(32), 1);",
        u8::from(admin)
    ))
    .expect("version 1 rows");
    drop(raw);
    db
}

/// Keys made before the network-change permission existed keep today's behaviour: they may.
#[test]
fn version_12_keys_may_change_networks() {
    let db = version_1_with_a_key(false);
    let store = db.open();
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let keys = store.list_api_keys(Some("acme")).expect("list");
    assert_eq!(keys.len(), 1);
    assert!(keys[0].change_network, "{keys:?}");
}

/// Keys made before the approver permission existed may not set approval policies, and a version
/// 13 database gains the empty policy table.
#[test]
fn version_13_keys_are_not_approvers() {
    let db = version_1_with_a_key(true);
    let store = db.open();
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let keys = store.list_api_keys(Some("acme")).expect("list");
    assert_eq!(keys.len(), 1);
    assert!(!keys[0].approver, "{keys:?}");
    assert_eq!(store.get_approval_policy("acme", None).expect("get"), None);
}
