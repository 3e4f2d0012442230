//! Snapshot records: named snapshots and per-step checkpoints of a sandbox's file system. The
//! storage itself lives in the pool; these rows say who owns which snapshot and which still exist.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::cached::Cached;
use crate::error::{from_i64, to_i64, violation, Violation};
use crate::quota::{check_quota, QuotaRequest};
use crate::{QuotaDefaults, Store, StoreError, StoreTx};

/// What a snapshot is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    /// Taken on request, kept until deleted.
    Snapshot,
    /// A step transaction's checkpoint: dropped by `commit` or consumed by `rollback`.
    Checkpoint,
}

impl SnapshotKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotKind::Snapshot => "snapshot",
            SnapshotKind::Checkpoint => "checkpoint",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "snapshot" => Some(SnapshotKind::Snapshot),
            "checkpoint" => Some(SnapshotKind::Checkpoint),
            _ => None,
        }
    }
}

/// A snapshot to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSnapshot {
    pub id: String,
    pub tenant: String,
    /// The sandbox it was taken of; `None` for an imported snapshot (always `Some` for a checkpoint).
    pub sandbox_id: Option<String>,
    pub kind: SnapshotKind,
    pub name: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub created_at_ms: i64,
    /// What it is charged against its tenant's storage quota (see `quota.rs`).
    pub storage_bytes: u64,
    /// The image template its files were made from (`tp-...`): a sandbox made from it starts on
    /// that template; `None` for the host's tree or an import.
    pub template_id: Option<String>,
}

/// A stored snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub id: String,
    pub tenant: String,
    /// The sandbox it was taken of; `None` for an imported snapshot.
    pub sandbox_id: Option<String>,
    pub kind: SnapshotKind,
    pub name: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub created_at_ms: i64,
    pub deleted_at_ms: Option<i64>,
    /// What it is charged against its tenant's storage quota.
    pub storage_bytes: u64,
    /// The image template its files were made from, if any.
    pub template_id: Option<String>,
}

/// Which snapshots [`Store::list_snapshots`] returns (existing ones only), in id order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotFilter {
    pub tenant: Option<String>,
    pub sandbox_id: Option<String>,
    pub kind: Option<SnapshotKind>,
    /// Keyset cursor: only ids after this one.
    pub after_id: Option<String>,
    pub limit: u32,
}

const COLUMNS: &str =
    "id, tenant, sandbox_id, kind, name, labels_json, created_at_ms, deleted_at_ms, storage_bytes, template_id";

impl Store {
    /// Records a snapshot. A duplicate id is [`StoreError::Conflict`].
    pub fn insert_snapshot(&self, snapshot: &NewSnapshot) -> Result<(), StoreError> {
        insert_snapshot(&self.conn(), snapshot)
    }

    pub fn get_snapshot(&self, id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        get_snapshot(&self.conn(), id)
    }

    pub fn list_snapshots(&self, filter: &SnapshotFilter) -> Result<Vec<SnapshotRecord>, StoreError> {
        let mut sql = format!("SELECT {COLUMNS} FROM snapshots WHERE deleted_at_ms IS NULL");
        let mut args: Vec<Box<dyn rusqlite::ToSql>> = Vec::new();
        if let Some(t) = &filter.tenant {
            sql.push_str(" AND tenant = ?");
            args.push(Box::new(t.clone()));
        }
        if let Some(s) = &filter.sandbox_id {
            sql.push_str(" AND sandbox_id = ?");
            args.push(Box::new(s.clone()));
        }
        if let Some(k) = filter.kind {
            sql.push_str(" AND kind = ?");
            args.push(Box::new(k.as_str()));
        }
        if let Some(a) = &filter.after_id {
            sql.push_str(" AND id > ?");
            args.push(Box::new(a.clone()));
        }
        sql.push_str(" ORDER BY id LIMIT ?");
        args.push(Box::new(i64::from(filter.limit)));
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&sql).map_err(StoreError::read("snapshots"))?;
        let rows = stmt
            .query_map(
                rusqlite::params_from_iter(args.iter().map(|a| a.as_ref())),
                read_row,
            )
            .map_err(StoreError::read("snapshots"))?;
        rows.map(|r| r.map_err(StoreError::read("snapshots")).and_then(into_record))
            .collect()
    }

    /// The newest existing checkpoint of a sandbox.
    pub fn latest_checkpoint(&self, sandbox_id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        latest_checkpoint(&self.conn(), sandbox_id)
    }

    /// Ids of every existing snapshot (for garbage collection of the pool).
    pub fn existing_snapshot_ids(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached("SELECT id FROM snapshots WHERE deleted_at_ms IS NULL ORDER BY id")
            .map_err(StoreError::read("snapshot ids"))?;
        let rows = stmt
            .query_map([], |row| row.get::<_, String>(0))
            .map_err(StoreError::read("snapshot ids"))?;
        rows.map(|r| r.map_err(StoreError::read("snapshot ids")))
            .collect()
    }

    /// Marks a snapshot deleted at `now_ms`. `false` if absent or already deleted.
    pub fn mark_snapshot_deleted(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        mark_snapshot_deleted(&self.conn(), id, now_ms)
    }
}

impl StoreTx<'_> {
    /// [`Store::insert_snapshot`] inside this transaction (with its audit row).
    pub fn insert_snapshot(&self, snapshot: &NewSnapshot) -> Result<(), StoreError> {
        insert_snapshot(&self.tx, snapshot)
    }

    /// Records a snapshot if its tenant's quota allows one more of its charge
    /// ([`StoreError::QuotaExceeded`] otherwise), inside this transaction (with its audit row).
    pub fn insert_snapshot_checked(
        &self,
        snapshot: &NewSnapshot,
        defaults: &QuotaDefaults,
    ) -> Result<(), StoreError> {
        let request = QuotaRequest {
            snapshots: 1,
            storage_bytes: snapshot.storage_bytes,
            ..QuotaRequest::default()
        };
        check_quota(&self.tx, &snapshot.tenant, &request, defaults)?;
        insert_snapshot(&self.tx, snapshot)
    }

    /// [`Store::mark_snapshot_deleted`] inside this transaction.
    pub fn mark_snapshot_deleted(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        mark_snapshot_deleted(&self.tx, id, now_ms)
    }

    /// [`Store::latest_checkpoint`] inside this transaction.
    pub fn latest_checkpoint(&self, sandbox_id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
        latest_checkpoint(&self.tx, sandbox_id)
    }
}

fn insert_snapshot(conn: &Connection, s: &NewSnapshot) -> Result<(), StoreError> {
    let labels = serde_json::to_string(&s.labels).map_err(|source| StoreError::EncodeJson {
        what: "snapshot labels",
        source,
    })?;
    let storage = to_i64("storage_bytes", s.storage_bytes)?;
    let inserted = conn.execute_cached(
        "INSERT INTO snapshots (id, tenant, sandbox_id, kind, name, labels_json, created_at_ms, storage_bytes,
                                template_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        (
            &s.id,
            &s.tenant,
            &s.sandbox_id,
            s.kind.as_str(),
            &s.name,
            labels,
            s.created_at_ms,
            storage,
            &s.template_id,
        ),
    );
    match inserted {
        Ok(_) => Ok(()),
        Err(e) if violation(&e) == Some(Violation::PrimaryKey) => Err(StoreError::Conflict {
            what: "snapshot",
            id: s.id.clone(),
        }),
        Err(e) => Err(StoreError::write("snapshot")(e)),
    }
}

fn get_snapshot(conn: &Connection, id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
    conn.query_row_cached(
        &format!("SELECT {COLUMNS} FROM snapshots WHERE id = ?1"),
        [id],
        read_row,
    )
    .optional()
    .map_err(StoreError::read("snapshot"))?
    .map(into_record)
    .transpose()
}

fn latest_checkpoint(conn: &Connection, sandbox_id: &str) -> Result<Option<SnapshotRecord>, StoreError> {
    conn.query_row_cached(
        &format!(
            "SELECT {COLUMNS} FROM snapshots
             WHERE sandbox_id = ?1 AND kind = 'checkpoint' AND deleted_at_ms IS NULL
             ORDER BY created_at_ms DESC, rowid DESC LIMIT 1"
        ),
        [sandbox_id],
        read_row,
    )
    .optional()
    .map_err(StoreError::read("checkpoint"))?
    .map(into_record)
    .transpose()
}

/// The snapshots matching `condition` (SQL over the `snapshots` table), in id order.
pub(crate) fn select<P: rusqlite::Params>(
    conn: &Connection,
    condition: &str,
    params: P,
) -> Result<Vec<SnapshotRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM snapshots WHERE {condition} ORDER BY id"
        ))
        .map_err(StoreError::read("snapshots"))?;
    let rows = stmt
        .query_map(params, read_row)
        .map_err(StoreError::read("snapshots"))?;
    rows.map(|r| r.map_err(StoreError::read("snapshots")).and_then(into_record))
        .collect()
}

fn mark_snapshot_deleted(conn: &Connection, id: &str, now_ms: i64) -> Result<bool, StoreError> {
    let changed = conn
        .execute_cached(
            "UPDATE snapshots SET deleted_at_ms = ?2 WHERE id = ?1 AND deleted_at_ms IS NULL",
            (id, now_ms),
        )
        .map_err(StoreError::write("snapshot deletion"))?;
    Ok(changed == 1)
}

type RawRow = (
    String,
    String,
    Option<String>,
    String,
    Option<String>,
    String,
    i64,
    Option<i64>,
    i64,
    Option<String>,
);

fn read_row(row: &Row<'_>) -> rusqlite::Result<RawRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
        row.get(9)?,
    ))
}

fn into_record(r: RawRow) -> Result<SnapshotRecord, StoreError> {
    let (id, tenant, sandbox_id, kind, name, labels_json, created_at_ms, deleted_at_ms, storage, template_id) =
        r;
    let kind = SnapshotKind::parse(&kind).ok_or_else(|| StoreError::Corrupt {
        what: "snapshot kind",
        detail: format!("snapshot {id}: {kind:?}"),
    })?;
    let labels = serde_json::from_str(&labels_json).map_err(|e| StoreError::Corrupt {
        what: "snapshot labels",
        detail: format!("snapshot {id}: {e}"),
    })?;
    Ok(SnapshotRecord {
        id,
        tenant,
        sandbox_id,
        kind,
        name,
        labels,
        created_at_ms,
        deleted_at_ms,
        storage_bytes: from_i64("snapshot storage_bytes", storage)?,
        template_id,
    })
}
