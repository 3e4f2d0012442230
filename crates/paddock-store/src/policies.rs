//! Approval policies: one per tenant and one per sandbox of a tenant, each the policy's JSON as the
//! control plane compiled and normalized it. The store neither reads nor checks a policy (the
//! control plane compiles it before it is stored); it keeps it, with when it was set.

use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::cached::Cached;
use crate::tenants::ensure_tenant;
use crate::{Store, StoreError, StoreTx};

/// A stored approval policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalPolicyRecord {
    pub tenant: String,
    /// The sandbox it applies to; `None`: the whole tenant.
    pub sandbox_id: Option<String>,
    /// The policy's JSON.
    pub spec: String,
    pub updated_at_ms: i64,
}

/// The stored spelling of a scope: the empty string is the tenant.
fn scope_key(sandbox_id: Option<&str>) -> &str {
    sandbox_id.unwrap_or("")
}

impl Store {
    /// The policy of `tenant` (`sandbox_id` `None`) or of one of its sandboxes, if one is set.
    pub fn get_approval_policy(
        &self,
        tenant: &str,
        sandbox_id: Option<&str>,
    ) -> Result<Option<ApprovalPolicyRecord>, StoreError> {
        get_approval_policy(&self.conn(), tenant, sandbox_id)
    }
}

impl StoreTx<'_> {
    /// Sets (or replaces) a policy, creating its tenant if needed. Call it in the transaction that
    /// writes its audit row.
    pub fn put_approval_policy(&self, record: &ApprovalPolicyRecord) -> Result<(), StoreError> {
        ensure_tenant(&self.tx, &record.tenant, record.updated_at_ms)?;
        self.tx
            .execute_cached(
                "INSERT INTO approval_policies (tenant, sandbox_id, spec, updated_at_ms)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (tenant, sandbox_id) DO UPDATE SET spec = excluded.spec,
                   updated_at_ms = excluded.updated_at_ms",
                (
                    &record.tenant,
                    scope_key(record.sandbox_id.as_deref()),
                    &record.spec,
                    record.updated_at_ms,
                ),
            )
            .map_err(StoreError::write("approval policy"))?;
        Ok(())
    }

    /// [`Store::get_approval_policy`] inside this transaction.
    pub fn get_approval_policy(
        &self,
        tenant: &str,
        sandbox_id: Option<&str>,
    ) -> Result<Option<ApprovalPolicyRecord>, StoreError> {
        get_approval_policy(&self.tx, tenant, sandbox_id)
    }

    /// Deletes a policy; `false` if none was set.
    pub fn delete_approval_policy(&self, tenant: &str, sandbox_id: Option<&str>) -> Result<bool, StoreError> {
        let n = self
            .tx
            .execute_cached(
                "DELETE FROM approval_policies WHERE tenant = ?1 AND sandbox_id = ?2",
                (tenant, scope_key(sandbox_id)),
            )
            .map_err(StoreError::write("approval policy"))?;
        Ok(n > 0)
    }
}

fn get_approval_policy(
    conn: &Connection,
    tenant: &str,
    sandbox_id: Option<&str>,
) -> Result<Option<ApprovalPolicyRecord>, StoreError> {
    conn.query_row_cached(
        "SELECT spec, updated_at_ms FROM approval_policies WHERE tenant = ?1 AND sandbox_id = ?2",
        (tenant, scope_key(sandbox_id)),
        |row| {
            Ok(ApprovalPolicyRecord {
                tenant: tenant.to_owned(),
                sandbox_id: sandbox_id.map(str::to_owned),
                spec: row.get(0)?,
                updated_at_ms: row.get(1)?,
            })
        },
    )
    .optional()
    .map_err(StoreError::read("approval policy"))
}
