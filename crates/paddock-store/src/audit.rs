//! The audit log: appending hash-chained rows and querying them. Rows are never updated or deleted
//! (the schema's triggers refuse it, and a test checks this crate contains no such statement).

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::audit_hash::{audit_hash, AuditFields, GENESIS_HASH};
use crate::cached::Cached;
use crate::error::{from_i64, to_i64};
use crate::{Store, StoreError, StoreTx};

/// An audit row to append; the store assigns its `seq` and chain hashes.
#[derive(Debug, Clone, PartialEq)]
pub struct NewAuditEntry {
    pub ts_ms: i64,
    pub tenant: Option<String>,
    pub key_id: Option<String>,
    /// What was attempted, dotted: `sandbox.create`, `process.exec`, `key.revoke`, ...
    pub action: String,
    pub sandbox_id: Option<String>,
    /// How it ended: `ok`, `denied`, `error`, ...
    pub outcome: String,
    /// Details; stored as JSON with object keys sorted, so the same value always stores the same text.
    pub detail: serde_json::Value,
}

/// A stored audit row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub seq: u64,
    pub ts_ms: i64,
    pub tenant: Option<String>,
    pub key_id: Option<String>,
    pub action: String,
    pub sandbox_id: Option<String>,
    pub outcome: String,
    pub detail: serde_json::Value,
    pub prev_hash: String,
    pub hash: String,
}

/// Which audit rows [`Store::query_audit`] returns, in seq order. Every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    pub tenant: Option<String>,
    pub sandbox_id: Option<String>,
    /// An exact action, or a prefix when it ends with `.` (`"process."` matches `process.exec`, ...).
    pub action: Option<String>,
    /// `ts_ms >= since_ms`.
    pub since_ms: Option<i64>,
    /// `ts_ms < until_ms`.
    pub until_ms: Option<i64>,
    /// Keyset cursor: only rows after this seq (the last seq of the previous page).
    pub after_seq: Option<u64>,
    /// At most this many rows.
    pub limit: u32,
    /// Newest rows first (seq descending); `after_seq` then means "before this seq".
    pub newest_first: bool,
}

pub(crate) const AUDIT_COLUMNS: &str =
    "seq, ts_ms, tenant, key_id, action, sandbox_id, outcome, detail_json, prev_hash, hash";

impl Store {
    /// Appends one row to the chain, in its own `BEGIN IMMEDIATE` transaction.
    pub fn append_audit(&self, entry: &NewAuditEntry) -> Result<AuditRecord, StoreError> {
        self.write("append audit row", |conn| append_audit(conn, entry))
    }

    /// Appends rows in order, all or none, in one transaction.
    pub fn append_audit_batch(&self, entries: &[NewAuditEntry]) -> Result<Vec<AuditRecord>, StoreError> {
        self.write("append audit rows", |conn| {
            entries.iter().map(|entry| append_audit(conn, entry)).collect()
        })
    }

    /// One page of the audit rows matching `filter`, in seq order (or newest first).
    pub fn query_audit(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, StoreError> {
        self.query_audit_within(filter, usize::MAX).map(|(rows, _)| rows)
    }

    /// [`Store::query_audit`] that also stops once the rows read hold `max_detail_bytes` of detail
    /// text (at least one row is returned, whatever its size), so that a page of rows with large
    /// details never makes the caller hold more than about that much. The flag says it stopped there
    /// (more rows may match).
    pub fn query_audit_within(
        &self,
        filter: &AuditFilter,
        max_detail_bytes: usize,
    ) -> Result<(Vec<AuditRecord>, bool), StoreError> {
        let mut conditions = Vec::new();
        let mut params: Vec<Value> = Vec::new();
        if let Some(tenant) = &filter.tenant {
            conditions.push("tenant = ?");
            params.push(Value::from(tenant.clone()));
        }
        if let Some(sandbox_id) = &filter.sandbox_id {
            conditions.push("sandbox_id = ?");
            params.push(Value::from(sandbox_id.clone()));
        }
        if let Some(action) = &filter.action {
            if let Some(stem) = action.strip_suffix('.') {
                // Prefix match as a range, which the index serves and which needs no LIKE escaping:
                // `stem.` <= action < `stem/` ('/' is the byte after '.').
                conditions.push("action >= ? AND action < ?");
                params.push(Value::from(action.clone()));
                params.push(Value::from(format!("{stem}/")));
            } else {
                conditions.push("action = ?");
                params.push(Value::from(action.clone()));
            }
        }
        if let Some(since_ms) = filter.since_ms {
            conditions.push("ts_ms >= ?");
            params.push(Value::from(since_ms));
        }
        if let Some(until_ms) = filter.until_ms {
            conditions.push("ts_ms < ?");
            params.push(Value::from(until_ms));
        }
        if let Some(after_seq) = filter.after_seq {
            conditions.push(if filter.newest_first { "seq < ?" } else { "seq > ?" });
            // A cursor beyond i64::MAX is past every row.
            params.push(Value::from(i64::try_from(after_seq).unwrap_or(i64::MAX)));
        }
        let where_clause = if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        };
        params.push(Value::from(i64::from(filter.limit)));
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {AUDIT_COLUMNS} FROM audit {where_clause} ORDER BY seq {} LIMIT ?",
                if filter.newest_first { "DESC" } else { "ASC" }
            ))
            .map_err(StoreError::read("audit rows"))?;
        let rows = stmt
            .query_map(params_from_iter(params), AuditRow::read)
            .map_err(StoreError::read("audit rows"))?;
        let mut records = Vec::new();
        let mut bytes = 0usize;
        for row in rows {
            if !records.is_empty() && bytes >= max_detail_bytes {
                return Ok((records, true));
            }
            let row = row.map_err(StoreError::read("audit rows"))?;
            bytes = bytes.saturating_add(row.detail_json.len());
            records.push(row.into_record()?);
        }
        Ok((records, false))
    }
}

impl StoreTx<'_> {
    /// [`Store::append_audit`] inside this transaction: the audit row commits (or not) together with
    /// the change it records.
    pub fn append_audit(&self, entry: &NewAuditEntry) -> Result<AuditRecord, StoreError> {
        append_audit(&self.tx, entry)
    }
}

/// Appends `entry` after the current last row. Must run inside a write (IMMEDIATE) transaction, so that
/// no other writer can append between reading the last hash and inserting.
pub(crate) fn append_audit(conn: &Connection, entry: &NewAuditEntry) -> Result<AuditRecord, StoreError> {
    let last: Option<(i64, String)> = conn
        .query_row_cached(
            "SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(StoreError::read("last audit row"))?;
    let (seq, prev_hash) = match last {
        Some((seq, hash)) => (from_i64::<u64>("audit seq", seq)? + 1, hash),
        None => (1, GENESIS_HASH.to_owned()),
    };
    // serde_json's default map is a BTreeMap, so object keys serialize sorted: one text per value.
    let detail_json = serde_json::to_string(&entry.detail).map_err(|source| StoreError::EncodeJson {
        what: "audit detail",
        source,
    })?;
    let hash = audit_hash(&AuditFields {
        seq,
        ts_ms: entry.ts_ms,
        tenant: entry.tenant.as_deref(),
        key_id: entry.key_id.as_deref(),
        action: &entry.action,
        sandbox_id: entry.sandbox_id.as_deref(),
        outcome: &entry.outcome,
        detail_json: &detail_json,
        prev_hash: &prev_hash,
    });
    conn.execute_cached(
        &format!("INSERT INTO audit ({AUDIT_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"),
        (
            to_i64("audit seq", seq)?,
            entry.ts_ms,
            &entry.tenant,
            &entry.key_id,
            &entry.action,
            &entry.sandbox_id,
            &entry.outcome,
            &detail_json,
            &prev_hash,
            &hash,
        ),
    )
    .map_err(StoreError::write("audit row"))?;
    Ok(AuditRecord {
        seq,
        ts_ms: entry.ts_ms,
        tenant: entry.tenant.clone(),
        key_id: entry.key_id.clone(),
        action: entry.action.clone(),
        sandbox_id: entry.sandbox_id.clone(),
        outcome: entry.outcome.clone(),
        detail: entry.detail.clone(),
        prev_hash,
        hash,
    })
}

/// An audit row as stored, `detail_json` still text (the hash covers that text).
pub(crate) struct AuditRow {
    pub(crate) seq: i64,
    pub(crate) ts_ms: i64,
    pub(crate) tenant: Option<String>,
    pub(crate) key_id: Option<String>,
    pub(crate) action: String,
    pub(crate) sandbox_id: Option<String>,
    pub(crate) outcome: String,
    pub(crate) detail_json: String,
    pub(crate) prev_hash: String,
    pub(crate) hash: String,
}

impl AuditRow {
    /// Reads one row of [`AUDIT_COLUMNS`].
    pub(crate) fn read(row: &Row<'_>) -> rusqlite::Result<AuditRow> {
        Ok(AuditRow {
            seq: row.get(0)?,
            ts_ms: row.get(1)?,
            tenant: row.get(2)?,
            key_id: row.get(3)?,
            action: row.get(4)?,
            sandbox_id: row.get(5)?,
            outcome: row.get(6)?,
            detail_json: row.get(7)?,
            prev_hash: row.get(8)?,
            hash: row.get(9)?,
        })
    }

    fn into_record(self) -> Result<AuditRecord, StoreError> {
        let detail = serde_json::from_str(&self.detail_json).map_err(|e| StoreError::Corrupt {
            what: "audit detail",
            detail: format!("seq {}: {e}", self.seq),
        })?;
        Ok(AuditRecord {
            seq: from_i64("audit seq", self.seq)?,
            ts_ms: self.ts_ms,
            tenant: self.tenant,
            key_id: self.key_id,
            action: self.action,
            sandbox_id: self.sandbox_id,
            outcome: self.outcome,
            detail,
            prev_hash: self.prev_hash,
            hash: self.hash,
        })
    }
}

#[cfg(test)]
mod tests {
    /// The stored text of a detail must not depend on insertion order, or equal details would store
    /// differently. Fails if something in the build turns on serde_json's `preserve_order`.
    #[test]
    fn detail_json_keys_serialize_sorted() {
        let detail = serde_json::json!({"zeta": 1, "alpha": {"y": 2, "b": 3}});
        assert_eq!(
            serde_json::to_string(&detail).expect("detail serializes"),
            r#"{"alpha":{"b":3,"y":2},"zeta":1}"#
        );
    }
}
