//! Reading sandbox records: one, a filtered page, the live ones for recovery, the expired ones for the
//! reaper.

use std::collections::BTreeMap;

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection, OptionalExtension, Params};

use crate::cached::Cached;
use crate::error::from_i64;
use crate::sandboxes::{SandboxRow, SANDBOX_COLUMNS};
use crate::{SandboxRecord, SandboxState, Store, StoreError, StoreTx};

/// Which sandboxes [`Store::list_sandboxes`] returns, one page at a time in id order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    pub tenant: Option<String>,
    /// Empty means every state.
    pub states: Vec<SandboxState>,
    /// Every one of these labels must be present with this value.
    pub labels: BTreeMap<String, String>,
    /// Keyset cursor: only sandboxes whose id sorts after this one (the last id of the previous page).
    pub after_id: Option<String>,
    /// At most this many records.
    pub limit: u32,
}

impl Store {
    pub fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRecord>, StoreError> {
        get_sandbox(&self.conn(), id)
    }

    /// One page of the sandboxes matching `filter`, in id order. All filtering happens in SQL, so a page
    /// is full whenever more matching rows exist.
    pub fn list_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<SandboxRecord>, StoreError> {
        let mut conditions = Vec::new();
        let mut params: Vec<Value> = Vec::new();
        if let Some(tenant) = &filter.tenant {
            conditions.push("tenant = ?".to_owned());
            params.push(Value::from(tenant.clone()));
        }
        if !filter.states.is_empty() {
            conditions.push(format!(
                "state IN ({})",
                vec!["?"; filter.states.len()].join(", ")
            ));
            params.extend(filter.states.iter().map(|s| Value::from(s.as_str().to_owned())));
        }
        for (key, value) in &filter.labels {
            // json_each rather than json_extract: no JSON path quoting of arbitrary label keys.
            conditions.push(
                "EXISTS (SELECT 1 FROM json_each(sandboxes.labels_json) AS l \
                 WHERE l.key = ? AND l.type = 'text' AND l.value = ?)"
                    .to_owned(),
            );
            params.push(Value::from(key.clone()));
            params.push(Value::from(value.clone()));
        }
        if let Some(after_id) = &filter.after_id {
            conditions.push("id > ?".to_owned());
            params.push(Value::from(after_id.clone()));
        }
        let where_clause = if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        };
        params.push(Value::from(i64::from(filter.limit)));
        query_sandboxes(
            &self.conn(),
            &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes {where_clause} ORDER BY id LIMIT ?"),
            params_from_iter(params),
        )
    }

    /// Every warm, creating or running sandbox, oldest first: what a restarted control plane re-adopts.
    pub fn live_sandboxes(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        query_sandboxes(
            &self.conn(),
            &format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes
                 WHERE state IN ('warm', 'creating', 'running') ORDER BY created_at_ms, id"
            ),
            [],
        )
    }

    /// Running sandboxes whose expiry is at or before `now_ms`, soonest first.
    pub fn expired_sandboxes(&self, now_ms: i64) -> Result<Vec<SandboxRecord>, StoreError> {
        query_sandboxes(
            &self.conn(),
            &format!(
                "SELECT {SANDBOX_COLUMNS} FROM sandboxes
                 WHERE state = 'running' AND expires_at_ms <= ?1 ORDER BY expires_at_ms, id"
            ),
            [now_ms],
        )
    }

    /// How many warm sandboxes of `profile` wait in the pool.
    pub fn count_warm(&self, profile: &str) -> Result<u64, StoreError> {
        let count: i64 = self
            .conn()
            .query_row_cached(
                "SELECT COUNT(*) FROM sandboxes WHERE state = 'warm' AND profile = ?1",
                [profile],
                |row| row.get(0),
            )
            .map_err(StoreError::read("warm sandbox count"))?;
        from_i64("warm sandbox count", count)
    }
}

impl StoreTx<'_> {
    /// [`Store::get_sandbox`] inside this transaction.
    pub fn get_sandbox(&self, id: &str) -> Result<Option<SandboxRecord>, StoreError> {
        get_sandbox(&self.tx, id)
    }
}

fn get_sandbox(conn: &Connection, id: &str) -> Result<Option<SandboxRecord>, StoreError> {
    conn.query_row_cached(
        &format!("SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE id = ?1"),
        [id],
        SandboxRow::read,
    )
    .optional()
    .map_err(StoreError::read("sandbox"))?
    .map(SandboxRow::into_record)
    .transpose()
}

fn query_sandboxes(
    conn: &Connection,
    sql: &str,
    params: impl Params,
) -> Result<Vec<SandboxRecord>, StoreError> {
    let mut stmt = conn.prepare_cached(sql).map_err(StoreError::read("sandboxes"))?;
    let rows = stmt
        .query_map(params, SandboxRow::read)
        .map_err(StoreError::read("sandboxes"))?;
    rows.map(|row| row.map_err(StoreError::read("sandboxes"))?.into_record())
        .collect()
}
