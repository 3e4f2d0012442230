//! Approved executions' rows: what was asked, the approval it waits on, and what became of it.
//! A change names the states it may leave (`ExecutionChange::from`), so a cancel and a finish, or
//! two runners after a restart, cannot both move one execution.
//!
//! What it does not do: decide (the control plane does), or bound how many a tenant has (the
//! control plane keeps the newest finished ones with [`StoreTx::insert_execution`]).

use rusqlite::{Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::cached::Cached;
use crate::tenants::ensure_tenant;
use crate::{Store, StoreError, StoreTx};

/// One execution as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutionRecord {
    pub id: String,
    pub tenant: String,
    pub client_id: Option<String>,
    pub session_id: Option<String>,
    pub task_id: Option<String>,
    pub description: String,
    /// The request's JSON.
    pub spec: String,
    /// `sandbox` or `kubernetes-job`.
    pub executor: String,
    pub approval_id: String,
    pub requested_by: String,
    pub state: String,
    /// The executor's object (a sandbox id, a Job's name).
    pub object: Option<String>,
    pub exit_code: Option<i64>,
    pub logs: Option<Vec<u8>>,
    pub logs_truncated: bool,
    pub message: Option<String>,
    pub approved_by: Option<String>,
    pub created_at_ms: i64,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
}

/// A move of one execution from one of `from` to `to`, with what it learned on the way (fields
/// left `None` keep their value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecutionChange<'a> {
    pub from: &'a [&'a str],
    pub to: &'a str,
    pub object: Option<&'a str>,
    pub exit_code: Option<i64>,
    pub logs: Option<&'a [u8]>,
    pub logs_truncated: Option<bool>,
    pub message: Option<&'a str>,
    pub approved_by: Option<&'a str>,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
}

const COLUMNS: &str = "id, tenant, client_id, session_id, task_id, description, spec, executor, \
                       approval_id, requested_by, state, object, exit_code, logs, logs_truncated, message, \
                       approved_by, created_at_ms, started_at_ms, finished_at_ms";

fn record(row: &Row<'_>) -> rusqlite::Result<ExecutionRecord> {
    Ok(ExecutionRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        client_id: row.get(2)?,
        session_id: row.get(3)?,
        task_id: row.get(4)?,
        description: row.get(5)?,
        spec: row.get(6)?,
        executor: row.get(7)?,
        approval_id: row.get(8)?,
        requested_by: row.get(9)?,
        state: row.get(10)?,
        object: row.get(11)?,
        exit_code: row.get(12)?,
        logs: row.get(13)?,
        logs_truncated: row.get(14)?,
        message: row.get(15)?,
        approved_by: row.get(16)?,
        created_at_ms: row.get(17)?,
        started_at_ms: row.get(18)?,
        finished_at_ms: row.get(19)?,
    })
}

fn query(
    conn: &Connection,
    filter: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<ExecutionRecord>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM executions WHERE {filter}"))
        .map_err(StoreError::read("executions"))?;
    let rows = stmt
        .query_map(params, record)
        .map_err(StoreError::read("executions"))?;
    rows.collect::<Result<_, _>>()
        .map_err(StoreError::read("executions"))
}

fn get_execution(conn: &Connection, tenant: &str, id: &str) -> Result<Option<ExecutionRecord>, StoreError> {
    conn.query_row_cached(
        &format!("SELECT {COLUMNS} FROM executions WHERE tenant = ?1 AND id = ?2"),
        (tenant, id),
        record,
    )
    .optional()
    .map_err(StoreError::read("execution"))
}

impl Store {
    /// Execution `id` of `tenant`.
    pub fn get_execution(&self, tenant: &str, id: &str) -> Result<Option<ExecutionRecord>, StoreError> {
        get_execution(&self.conn(), tenant, id)
    }

    /// `tenant`'s executions, newest first, at most `limit`.
    pub fn list_executions(&self, tenant: &str, limit: u32) -> Result<Vec<ExecutionRecord>, StoreError> {
        query(
            &self.conn(),
            "tenant = ?1 ORDER BY created_at_ms DESC, id DESC LIMIT ?2",
            (tenant, limit),
        )
    }

    /// The execution waiting on approval `approval_id`, if one does.
    pub fn execution_of_approval(&self, approval_id: &str) -> Result<Option<ExecutionRecord>, StoreError> {
        Ok(query(&self.conn(), "approval_id = ?1", [approval_id])?.pop())
    }

    /// Every execution (of every tenant) pending approval or running: what a restarted server
    /// picks up again.
    pub fn open_executions(&self) -> Result<Vec<ExecutionRecord>, StoreError> {
        query(
            &self.conn(),
            "state IN ('pending_approval', 'running') ORDER BY created_at_ms",
            [],
        )
    }
}

impl StoreTx<'_> {
    /// [`Store::get_execution`] inside this transaction.
    pub fn get_execution(&self, tenant: &str, id: &str) -> Result<Option<ExecutionRecord>, StoreError> {
        get_execution(&self.tx, tenant, id)
    }

    /// The execution `tenant` made with its own id `client_id`, if any.
    pub fn execution_by_client_id(
        &self,
        tenant: &str,
        client_id: &str,
    ) -> Result<Option<ExecutionRecord>, StoreError> {
        Ok(query(&self.tx, "tenant = ?1 AND client_id = ?2", (tenant, client_id))?.pop())
    }

    /// Adds an execution (creating its tenant if needed), then drops the tenant's oldest ended
    /// executions past the newest `keep_ended`.
    pub fn insert_execution(&self, r: &ExecutionRecord, keep_ended: u32) -> Result<(), StoreError> {
        ensure_tenant(&self.tx, &r.tenant, r.created_at_ms)?;
        self.tx
            .execute_cached(
                &format!(
                    "INSERT INTO executions ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10,
                       ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)"
                ),
                rusqlite::params![
                    r.id,
                    r.tenant,
                    r.client_id,
                    r.session_id,
                    r.task_id,
                    r.description,
                    r.spec,
                    r.executor,
                    r.approval_id,
                    r.requested_by,
                    r.state,
                    r.object,
                    r.exit_code,
                    r.logs,
                    r.logs_truncated,
                    r.message,
                    r.approved_by,
                    r.created_at_ms,
                    r.started_at_ms,
                    r.finished_at_ms,
                ],
            )
            .map_err(StoreError::write("execution"))?;
        self.tx
            .execute_cached(
                "DELETE FROM executions WHERE id IN (
                   SELECT id FROM executions WHERE tenant = ?1
                     AND state NOT IN ('pending_approval', 'running')
                   ORDER BY created_at_ms DESC, id DESC LIMIT -1 OFFSET ?2)",
                (&r.tenant, keep_ended),
            )
            .map_err(StoreError::write("execution"))?;
        Ok(())
    }

    /// Applies `c` to execution `id` if it is in one of `c.from`; `false` (no change) otherwise.
    pub fn change_execution(
        &self,
        tenant: &str,
        id: &str,
        c: &ExecutionChange<'_>,
    ) -> Result<bool, StoreError> {
        let from = serde_json::to_string(c.from).unwrap_or_else(|_| "[]".to_owned());
        let n = self
            .tx
            .execute_cached(
                "UPDATE executions SET state = ?4,
                   object = coalesce(?5, object), exit_code = coalesce(?6, exit_code),
                   logs = coalesce(?7, logs), logs_truncated = coalesce(?8, logs_truncated),
                   message = coalesce(?9, message), approved_by = coalesce(?10, approved_by),
                   started_at_ms = coalesce(?11, started_at_ms),
                   finished_at_ms = coalesce(?12, finished_at_ms)
                 WHERE tenant = ?1 AND id = ?2 AND state IN (SELECT value FROM json_each(?3))",
                rusqlite::params![
                    tenant,
                    id,
                    from,
                    c.to,
                    c.object,
                    c.exit_code,
                    c.logs,
                    c.logs_truncated,
                    c.message,
                    c.approved_by,
                    c.started_at_ms,
                    c.finished_at_ms,
                ],
            )
            .map_err(StoreError::write("execution"))?;
        Ok(n > 0)
    }
}
