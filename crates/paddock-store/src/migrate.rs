//! Embedded, forward-only schema migrations.
//!
//! Each migration is an SQL file under `migrations/`, compiled into the binary and applied once, in
//! order, inside one transaction together with its row in `schema_migrations`. A released migration is
//! never edited; a schema change is a new file (and a reviewed diff of `tests/golden/schema.sql`).

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::error::DbError;
use crate::StoreError;

struct Migration {
    version: i64,
    sql: &'static str,
}

/// Versions are 1, 2, 3, ... with no gaps (a unit test checks).
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        sql: include_str!("../migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        sql: include_str!("../migrations/0002_snapshots.sql"),
    },
    Migration {
        version: 3,
        sql: include_str!("../migrations/0003_stopped.sql"),
    },
    Migration {
        version: 4,
        sql: include_str!("../migrations/0004_snapshot_import.sql"),
    },
    Migration {
        version: 5,
        sql: include_str!("../migrations/0005_volumes.sql"),
    },
    Migration {
        version: 6,
        sql: include_str!("../migrations/0006_network.sql"),
    },
    Migration {
        version: 7,
        sql: include_str!("../migrations/0007_storage_quotas.sql"),
    },
    Migration {
        version: 8,
        sql: include_str!("../migrations/0008_secret_bindings.sql"),
    },
    Migration {
        version: 9,
        sql: include_str!("../migrations/0009_audit_retention.sql"),
    },
    Migration {
        version: 10,
        sql: include_str!("../migrations/0010_intents.sql"),
    },
    Migration {
        version: 11,
        sql: include_str!("../migrations/0011_templates.sql"),
    },
    Migration {
        version: 12,
        sql: include_str!("../migrations/0012_template_quotas.sql"),
    },
    Migration {
        version: 13,
        sql: include_str!("../migrations/0013_key_network_change.sql"),
    },
    Migration {
        version: 14,
        sql: include_str!("../migrations/0014_approval_policies.sql"),
    },
    Migration {
        version: 15,
        sql: include_str!("../migrations/0015_approvals.sql"),
    },
    Migration {
        version: 16,
        sql: include_str!("../migrations/0016_executions.sql"),
    },
];

/// The schema version this binary writes and understands.
pub const SCHEMA_VERSION: i64 = 16;

const CREATE_VERSION_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version       INTEGER PRIMARY KEY,
    applied_at_ms INTEGER NOT NULL
) STRICT";

/// Brings the database up to [`SCHEMA_VERSION`], refusing one that is newer. All in one IMMEDIATE
/// transaction, so two processes opening a fresh file at once apply each migration exactly once.
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let fail = |version: i64| {
        move |e| StoreError::Migrate {
            path: path.to_owned(),
            version,
            source: DbError(e),
        }
    };
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(fail(0))?;
    tx.execute_batch(CREATE_VERSION_TABLE).map_err(fail(0))?;
    let current = read_version(&tx, path)?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: path.to_owned(),
            found: current,
            latest: SCHEMA_VERSION,
        });
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        tx.execute_batch(migration.sql).map_err(fail(migration.version))?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at_ms) VALUES (?1, ?2)",
            (migration.version, now_ms()),
        )
        .map_err(fail(migration.version))?;
    }
    tx.commit().map_err(fail(SCHEMA_VERSION))
}

/// Refuses a database whose schema is not exactly the one this binary knows (for read-only opens,
/// which cannot migrate).
pub(crate) fn check_current(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let found = read_version(conn, path)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            path: path.to_owned(),
            found,
            latest: SCHEMA_VERSION,
        });
    }
    if found < SCHEMA_VERSION {
        return Err(StoreError::SchemaOutdated {
            path: path.to_owned(),
            found,
            latest: SCHEMA_VERSION,
        });
    }
    Ok(())
}

/// The highest applied migration, 0 for a database paddock never initialised.
pub(crate) fn read_version(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    let fail = |e| StoreError::ReadSchemaVersion {
        path: path.to_owned(),
        source: DbError(e),
    };
    let has_table = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'",
            [],
            |_| Ok(()),
        )
        .optional()
        .map_err(fail)?
        .is_some();
    if !has_table {
        return Ok(0);
    }
    conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_migrations",
        [],
        |row| row.get(0),
    )
    .map_err(fail)
}

fn now_ms() -> i64 {
    // Before 1970 only on a broken clock; 0 then is as good as anything for a bookkeeping column.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_contiguous_and_end_at_schema_version() {
        for (i, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.version, i as i64 + 1, "migration {i} is out of order");
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }
}
