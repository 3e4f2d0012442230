//! The approvals queue's rows: requests an approval policy said `ask` about, and what a person
//! decided. Every change is one conditional `UPDATE` (a row is decided only while it is pending
//! and unexpired, used only while approved, unused, unexpired and for the same request), so two
//! approvers, an approver and the expiry, or two retries of one request cannot both win.
//!
//! What it does not do: decide anything by policy, wait for a person, bound how many rows a
//! tenant may have pending (the control plane counts with [`StoreTx::pending_approvals`]), or
//! write audit rows (the caller writes them in the same transaction).

use rusqlite::{Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::cached::Cached;
use crate::tenants::ensure_tenant;
use crate::{Store, StoreError, StoreTx};

/// One approval as stored. `state` is `pending`, `approved`, `rejected` or `expired`; a pending or
/// approved row past `expires_at_ms` is expired whether or not the sweep has marked it yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub id: String,
    pub tenant: String,
    pub sandbox_id: Option<String>,
    /// `exec`, `file`, `network` or `execution`.
    pub kind: String,
    pub summary: String,
    /// The exact request (JSON).
    pub request: String,
    pub request_sha256: String,
    /// `tenant` or `sandbox`: whose policy said `ask`.
    pub policy_scope: String,
    pub rule: Option<i64>,
    pub reason: Option<String>,
    /// The key that asked.
    pub requested_by: String,
    pub state: String,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub decided_at_ms: Option<i64>,
    pub decided_by: Option<String>,
    pub note: Option<String>,
    pub used_at_ms: Option<i64>,
}

/// A person's decision on a pending approval.
#[derive(Debug, Clone, Copy)]
pub struct ApprovalDecision<'a> {
    /// Approved (else rejected).
    pub approved: bool,
    /// The deciding key.
    pub by: &'a str,
    pub note: Option<&'a str>,
    pub at_ms: i64,
    /// Until when an approved request may run.
    pub use_by_ms: i64,
}

/// Why [`StoreTx::use_approval`] did not let a request run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalUse {
    /// It is the caller's to run now (marked used).
    Granted,
    /// No such approval of the tenant.
    NotFound,
    /// Still waiting for a person.
    Pending,
    /// Rejected.
    Rejected,
    /// Expired (undecided, or approved and unused, past its time).
    Expired,
    /// Approved, and already used once.
    Used,
    /// Approved, for another request (another sandbox, or other fields).
    OtherRequest,
}

const COLUMNS: &str = "id, tenant, sandbox_id, kind, summary, request, request_sha256, policy_scope, \
                       rule, reason, requested_by, state, created_at_ms, expires_at_ms, decided_at_ms, \
                       decided_by, note, used_at_ms";

fn record(row: &Row<'_>) -> rusqlite::Result<ApprovalRecord> {
    Ok(ApprovalRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        sandbox_id: row.get(2)?,
        kind: row.get(3)?,
        summary: row.get(4)?,
        request: row.get(5)?,
        request_sha256: row.get(6)?,
        policy_scope: row.get(7)?,
        rule: row.get(8)?,
        reason: row.get(9)?,
        requested_by: row.get(10)?,
        state: row.get(11)?,
        created_at_ms: row.get(12)?,
        expires_at_ms: row.get(13)?,
        decided_at_ms: row.get(14)?,
        decided_by: row.get(15)?,
        note: row.get(16)?,
        used_at_ms: row.get(17)?,
    })
}

fn get_approval(conn: &Connection, tenant: &str, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
    conn.query_row_cached(
        &format!("SELECT {COLUMNS} FROM approvals WHERE tenant = ?1 AND id = ?2"),
        (tenant, id),
        record,
    )
    .optional()
    .map_err(StoreError::read("approval"))
}

impl Store {
    /// The approval `id` of `tenant`.
    pub fn get_approval(&self, tenant: &str, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        get_approval(&self.conn(), tenant, id)
    }

    /// The approval `id`, whichever tenant's it is (for a caller that proves itself otherwise than
    /// by a tenant's key: the signed webhook callback).
    pub fn find_approval(&self, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        self.conn()
            .query_row_cached(
                &format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"),
                [id],
                record,
            )
            .optional()
            .map_err(StoreError::read("approval"))
    }

    /// `tenant`'s approvals, newest first: only those in `state` and of `sandbox_id` when given,
    /// at most `limit`.
    pub fn list_approvals(
        &self,
        tenant: &str,
        state: Option<&str>,
        sandbox_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ApprovalRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM approvals WHERE tenant = ?1
                   AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR sandbox_id = ?3)
                 ORDER BY created_at_ms DESC, id DESC LIMIT ?4"
            ))
            .map_err(StoreError::read("approvals"))?;
        let rows = stmt
            .query_map((tenant, state, sandbox_id, limit), record)
            .map_err(StoreError::read("approvals"))?;
        rows.collect::<Result<_, _>>()
            .map_err(StoreError::read("approvals"))
    }

    /// Pending and approved-unused approvals (of every tenant) whose time is up at `now_ms`, for
    /// the sweep to mark expired.
    pub fn due_approvals(&self, now_ms: i64, limit: u32) -> Result<Vec<ApprovalRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM approvals
                 WHERE state IN ('pending', 'approved') AND used_at_ms IS NULL AND expires_at_ms <= ?1
                 ORDER BY expires_at_ms LIMIT ?2"
            ))
            .map_err(StoreError::read("approvals"))?;
        let rows = stmt
            .query_map((now_ms, limit), record)
            .map_err(StoreError::read("approvals"))?;
        rows.collect::<Result<_, _>>()
            .map_err(StoreError::read("approvals"))
    }
}

impl StoreTx<'_> {
    /// [`Store::get_approval`] inside this transaction.
    pub fn get_approval(&self, tenant: &str, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
        get_approval(&self.tx, tenant, id)
    }

    /// How many of `tenant`'s approvals are pending.
    pub fn pending_approvals(&self, tenant: &str) -> Result<u64, StoreError> {
        self.tx
            .query_row_cached(
                "SELECT count(*) FROM approvals WHERE tenant = ?1 AND state = 'pending'",
                [tenant],
                |row| row.get::<_, i64>(0),
            )
            .map(|n| n.unsigned_abs())
            .map_err(StoreError::read("approvals"))
    }

    /// How many of `tenant`'s approvals about sandbox `sandbox_id` are pending.
    pub fn pending_approvals_of_sandbox(&self, tenant: &str, sandbox_id: &str) -> Result<u64, StoreError> {
        self.tx
            .query_row_cached(
                "SELECT count(*) FROM approvals WHERE tenant = ?1 AND sandbox_id = ?2 AND state = 'pending'",
                [tenant, sandbox_id],
                |row| row.get::<_, i64>(0),
            )
            .map(|n| n.unsigned_abs())
            .map_err(StoreError::read("approvals"))
    }

    /// Adds a pending approval (creating its tenant if needed), then drops the tenant's oldest
    /// decided approvals past the newest `keep_decided`.
    pub fn insert_approval(&self, r: &ApprovalRecord, keep_decided: u32) -> Result<(), StoreError> {
        ensure_tenant(&self.tx, &r.tenant, r.created_at_ms)?;
        self.tx
            .execute_cached(
                &format!(
                    "INSERT INTO approvals ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10,
                       ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)"
                ),
                rusqlite::params![
                    r.id,
                    r.tenant,
                    r.sandbox_id,
                    r.kind,
                    r.summary,
                    r.request,
                    r.request_sha256,
                    r.policy_scope,
                    r.rule,
                    r.reason,
                    r.requested_by,
                    r.state,
                    r.created_at_ms,
                    r.expires_at_ms,
                    r.decided_at_ms,
                    r.decided_by,
                    r.note,
                    r.used_at_ms,
                ],
            )
            .map_err(StoreError::write("approval"))?;
        self.tx
            .execute_cached(
                "DELETE FROM approvals WHERE id IN (
                   SELECT id FROM approvals WHERE tenant = ?1 AND state NOT IN ('pending', 'approved')
                   ORDER BY created_at_ms DESC, id DESC LIMIT -1 OFFSET ?2)",
                (&r.tenant, keep_decided),
            )
            .map_err(StoreError::write("approval"))?;
        Ok(())
    }

    /// Approves (`approved`, usable until `use_by_ms`) or rejects a pending, unexpired approval;
    /// `false` (and no change) if it is not pending or its time is up at `at_ms`.
    pub fn decide_approval(
        &self,
        tenant: &str,
        id: &str,
        d: &ApprovalDecision<'_>,
    ) -> Result<bool, StoreError> {
        let (state, expires) = if d.approved {
            ("approved", d.use_by_ms)
        } else {
            ("rejected", d.at_ms)
        };
        let n = self
            .tx
            .execute_cached(
                "UPDATE approvals SET state = ?3, decided_at_ms = ?4, decided_by = ?5, note = ?6,
                   expires_at_ms = ?7
                 WHERE tenant = ?1 AND id = ?2 AND state = 'pending' AND expires_at_ms > ?4",
                rusqlite::params![tenant, id, state, d.at_ms, d.by, d.note, expires],
            )
            .map_err(StoreError::write("approval"))?;
        Ok(n > 0)
    }

    /// Marks an approval whose time is up at `at_ms` expired (pending, or approved and unused);
    /// `false` if it was not.
    pub fn expire_approval(&self, tenant: &str, id: &str, at_ms: i64) -> Result<bool, StoreError> {
        let n = self
            .tx
            .execute_cached(
                "UPDATE approvals SET state = 'expired', decided_at_ms = coalesce(decided_at_ms, ?3)
                 WHERE tenant = ?1 AND id = ?2 AND state IN ('pending', 'approved')
                   AND used_at_ms IS NULL AND expires_at_ms <= ?3",
                (tenant, id, at_ms),
            )
            .map_err(StoreError::write("approval"))?;
        Ok(n > 0)
    }

    /// Lets the request hashing `request_sha256`, for `sandbox_id`, run under approval `id` at
    /// `at_ms`: only once, only approved, only in time. Marks it used when it does.
    pub fn use_approval(
        &self,
        tenant: &str,
        id: &str,
        sandbox_id: Option<&str>,
        request_sha256: &str,
        at_ms: i64,
    ) -> Result<ApprovalUse, StoreError> {
        let n = self
            .tx
            .execute_cached(
                "UPDATE approvals SET used_at_ms = ?5
                 WHERE tenant = ?1 AND id = ?2 AND sandbox_id IS ?3 AND request_sha256 = ?4
                   AND state = 'approved' AND used_at_ms IS NULL AND expires_at_ms > ?5",
                (tenant, id, sandbox_id, request_sha256, at_ms),
            )
            .map_err(StoreError::write("approval"))?;
        if n > 0 {
            return Ok(ApprovalUse::Granted);
        }
        let Some(r) = self.get_approval(tenant, id)? else {
            return Ok(ApprovalUse::NotFound);
        };
        let due = r.expires_at_ms <= at_ms;
        Ok(match r.state.as_str() {
            "rejected" => ApprovalUse::Rejected,
            "expired" => ApprovalUse::Expired,
            _ if r.used_at_ms.is_some() => ApprovalUse::Used,
            _ if due => ApprovalUse::Expired,
            _ if r.request_sha256 != request_sha256 || r.sandbox_id.as_deref() != sandbox_id => {
                ApprovalUse::OtherRequest
            }
            "pending" => ApprovalUse::Pending,
            _ => ApprovalUse::OtherRequest,
        })
    }
}
