//! Intent records of multi-step sandbox operations, and the checkpoint sweeps that go with ending a
//! sandbox.
//!
//! An operation that changes a sandbox in several irreversible steps writes its intent before the
//! first step and removes it in the transaction that records the outcome; an intent found at start-up
//! is an operation a crash interrupted. This module only keeps the records: what finishing or undoing
//! each operation means is the control plane's recovery.

use rusqlite::{Connection, Row};

use crate::cached::Cached;
use crate::snapshots::{self, SnapshotRecord};
use crate::{Store, StoreError, StoreTx};

/// The operations that leave an intent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IntentOp {
    /// A sandbox restarting on a snapshot's files.
    Rollback,
    /// A sandbox being stopped (its files kept).
    Stop,
    /// A stopped sandbox booting again.
    Resume,
    /// A sandbox's copies being made from its volume (an older paddock's: from a base snapshot).
    Fork,
}

impl IntentOp {
    pub fn as_str(self) -> &'static str {
        match self {
            IntentOp::Rollback => "rollback",
            IntentOp::Stop => "stop",
            IntentOp::Resume => "resume",
            IntentOp::Fork => "fork",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "rollback" => IntentOp::Rollback,
            "stop" => IntentOp::Stop,
            "resume" => IntentOp::Resume,
            "fork" => IntentOp::Fork,
            _ => return None,
        })
    }
}

/// An operation in flight (or interrupted).
#[derive(Debug, Clone, PartialEq)]
pub struct IntentRecord {
    pub id: i64,
    pub sandbox_id: String,
    pub op: IntentOp,
    /// Rollback: the snapshot it returns to; fork: none (an older paddock's: the base snapshot).
    pub snapshot_id: Option<String>,
    /// What else the operation's recovery needs (the caller's JSON).
    pub detail: serde_json::Value,
    pub created_at_ms: i64,
}

/// An intent to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewIntent<'a> {
    pub sandbox_id: &'a str,
    pub op: IntentOp,
    pub snapshot_id: Option<&'a str>,
    pub detail: serde_json::Value,
    pub created_at_ms: i64,
}

impl Store {
    /// Records an intent; its id.
    pub fn begin_intent(&self, intent: &NewIntent<'_>) -> Result<i64, StoreError> {
        begin_intent(&self.conn(), intent)
    }

    /// Removes an intent; whether it was there.
    pub fn end_intent(&self, id: i64) -> Result<bool, StoreError> {
        end_intent(&self.conn(), id)
    }

    /// Every recorded intent, oldest first.
    pub fn list_intents(&self) -> Result<Vec<IntentRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT id, sandbox_id, op, snapshot_id, detail_json, created_at_ms FROM intents ORDER BY id",
            )
            .map_err(StoreError::read("intents"))?;
        let rows = stmt
            .query_map([], read_row)
            .map_err(StoreError::read("intents"))?;
        rows.map(|r| r.map_err(StoreError::read("intents")).and_then(into_record))
            .collect()
    }

    /// Existing checkpoints whose sandbox has ended (or has no record): step transactions do not
    /// outlive their sandbox, so these are leftovers of an end a crash interrupted.
    pub fn orphaned_checkpoints(&self) -> Result<Vec<SnapshotRecord>, StoreError> {
        snapshots::select(
            &self.conn(),
            "kind = 'checkpoint' AND deleted_at_ms IS NULL AND NOT EXISTS (
                 SELECT 1 FROM sandboxes s WHERE s.id = snapshots.sandbox_id
                 AND s.state IN ('warm', 'creating', 'running', 'stopped'))",
            [],
        )
    }
}

impl StoreTx<'_> {
    /// [`Store::begin_intent`] inside this transaction.
    pub fn begin_intent(&self, intent: &NewIntent<'_>) -> Result<i64, StoreError> {
        begin_intent(&self.tx, intent)
    }

    /// [`Store::end_intent`] inside this transaction.
    pub fn end_intent(&self, id: i64) -> Result<bool, StoreError> {
        end_intent(&self.tx, id)
    }

    /// Marks every existing checkpoint of `sandbox_id` deleted at `now_ms`; the records so marked
    /// (their storage is the caller's to free).
    pub fn drop_checkpoints_of(
        &self,
        sandbox_id: &str,
        now_ms: i64,
    ) -> Result<Vec<SnapshotRecord>, StoreError> {
        let records = snapshots::select(
            &self.tx,
            "sandbox_id = ?1 AND kind = 'checkpoint' AND deleted_at_ms IS NULL",
            [sandbox_id],
        )?;
        for r in &records {
            self.mark_snapshot_deleted(&r.id, now_ms)?;
        }
        Ok(records)
    }
}

fn begin_intent(conn: &Connection, intent: &NewIntent<'_>) -> Result<i64, StoreError> {
    let detail = serde_json::to_string(&intent.detail).map_err(|source| StoreError::EncodeJson {
        what: "intent detail",
        source,
    })?;
    conn.execute_cached(
        "INSERT INTO intents (sandbox_id, op, snapshot_id, detail_json, created_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
        (
            intent.sandbox_id,
            intent.op.as_str(),
            intent.snapshot_id,
            detail,
            intent.created_at_ms,
        ),
    )
    .map_err(StoreError::write("intent"))?;
    Ok(conn.last_insert_rowid())
}

fn end_intent(conn: &Connection, id: i64) -> Result<bool, StoreError> {
    let changed = conn
        .execute_cached("DELETE FROM intents WHERE id = ?1", [id])
        .map_err(StoreError::write("intent removal"))?;
    Ok(changed == 1)
}

type RawRow = (i64, String, String, Option<String>, String, i64);

fn read_row(row: &Row<'_>) -> rusqlite::Result<RawRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

fn into_record(r: RawRow) -> Result<IntentRecord, StoreError> {
    let (id, sandbox_id, op, snapshot_id, detail_json, created_at_ms) = r;
    let op = IntentOp::parse(&op).ok_or_else(|| StoreError::Corrupt {
        what: "intent",
        detail: format!("unknown operation {op:?}"),
    })?;
    let detail = serde_json::from_str(&detail_json).map_err(|e| StoreError::Corrupt {
        what: "intent",
        detail: format!("detail is not JSON: {e}"),
    })?;
    Ok(IntentRecord {
        id,
        sandbox_id,
        op,
        snapshot_id,
        detail,
        created_at_ms,
    })
}
