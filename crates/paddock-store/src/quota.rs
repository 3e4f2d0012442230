//! Quota-checked sandbox creation: the check and the insert (or warm claim) happen in one `BEGIN
//! IMMEDIATE` transaction, which is what makes quotas race-free across threads and processes.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension};

use crate::error::{from_i64, to_i64};
use crate::sandboxes::{encode_labels, insert_sandbox, SandboxRow, SANDBOX_COLUMNS};
use crate::tenants::get_tenant;
use crate::{NewSandbox, SandboxRecord, Store, StoreError, StoreTx, TenantUsage};

/// What a tenant's claim of a warm sandbox sets on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub memory_bytes: u64,
    pub cpu_millis: u32,
    pub labels: BTreeMap<String, String>,
    pub spec_json: String,
    pub expires_at_ms: Option<i64>,
    pub now_ms: i64,
}

impl Store {
    /// Inserts a tenant-owned sandbox if the tenant's quota (read from the tenants table in the same
    /// transaction) allows one more live sandbox of its size; else [`StoreError::QuotaExceeded`].
    pub fn insert_sandbox_checked(&self, sandbox: &NewSandbox) -> Result<(), StoreError> {
        self.write("insert sandbox", |conn| insert_sandbox_checked(conn, sandbox))
    }

    /// Gives `tenant` the oldest warm sandbox of `profile`, now running with the claim's size, labels,
    /// spec and expiry. The quota is checked first, so a tenant at its limit gets
    /// [`StoreError::QuotaExceeded`] whether or not a warm sandbox exists; `Ok(None)` means none does.
    pub fn claim_warm_sandbox(
        &self,
        profile: &str,
        tenant: &str,
        claim: &Claim,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        self.write("claim warm sandbox", |conn| {
            claim_warm_sandbox(conn, profile, tenant, claim)
        })
    }

    /// Moves stopped sandbox `id` of `tenant` back to `creating` (it resumes) if the tenant's quota
    /// allows one more live sandbox of its size; `false` if it is not a stopped sandbox of `tenant`.
    pub fn resume_stopped_checked(&self, id: &str, tenant: &str) -> Result<bool, StoreError> {
        self.write("resume stopped sandbox", |conn| {
            resume_stopped_checked(conn, id, tenant)
        })
    }

    /// What `tenant`'s creating and running sandboxes use now.
    pub fn tenant_usage(&self, tenant: &str) -> Result<TenantUsage, StoreError> {
        tenant_usage(&self.conn(), tenant)
    }
}

impl StoreTx<'_> {
    /// [`Store::insert_sandbox_checked`] inside this transaction.
    pub fn insert_sandbox_checked(&self, sandbox: &NewSandbox) -> Result<(), StoreError> {
        insert_sandbox_checked(&self.tx, sandbox)
    }

    /// [`Store::claim_warm_sandbox`] inside this transaction.
    pub fn claim_warm_sandbox(
        &self,
        profile: &str,
        tenant: &str,
        claim: &Claim,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        claim_warm_sandbox(&self.tx, profile, tenant, claim)
    }
}

fn insert_sandbox_checked(conn: &Connection, sandbox: &NewSandbox) -> Result<(), StoreError> {
    let Some(tenant) = &sandbox.tenant else {
        return Err(StoreError::NoTenant {
            id: sandbox.id.clone(),
        });
    };
    check_quota(conn, tenant, sandbox.memory_bytes, sandbox.cpu_millis)?;
    insert_sandbox(conn, sandbox)
}

fn resume_stopped_checked(conn: &Connection, id: &str, tenant: &str) -> Result<bool, StoreError> {
    let size: Option<(i64, i64)> = conn
        .query_row(
            "SELECT memory_bytes, cpu_millis FROM sandboxes WHERE id = ?1 AND tenant = ?2 AND state = 'stopped'",
            (id, tenant),
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(StoreError::read("stopped sandbox"))?;
    let Some((memory, cpu)) = size else {
        return Ok(false);
    };
    let cpu: u32 = from_i64("stopped sandbox", cpu)?;
    let memory: u64 = from_i64("stopped sandbox", memory)?;
    check_quota(conn, tenant, memory, cpu)?;
    let changed = conn
        .execute(
            "UPDATE sandboxes SET state = 'creating' WHERE id = ?1 AND state = 'stopped'",
            [id],
        )
        .map_err(StoreError::write("sandbox state"))?;
    Ok(changed == 1)
}

fn claim_warm_sandbox(
    conn: &Connection,
    profile: &str,
    tenant: &str,
    claim: &Claim,
) -> Result<Option<SandboxRecord>, StoreError> {
    check_quota(conn, tenant, claim.memory_bytes, claim.cpu_millis)?;
    let labels_json = encode_labels(&claim.labels)?;
    let memory_bytes = to_i64("memory_bytes", claim.memory_bytes)?;
    let row = conn
        .query_row(
            &format!(
                "UPDATE sandboxes
                 SET tenant = ?2, state = 'running', claimed_at_ms = ?3, expires_at_ms = ?4,
                     labels_json = ?5, spec_json = ?6, memory_bytes = ?7, cpu_millis = ?8
                 WHERE id = (SELECT id FROM sandboxes WHERE state = 'warm' AND profile = ?1
                             ORDER BY created_at_ms, id LIMIT 1)
                 RETURNING {SANDBOX_COLUMNS}"
            ),
            (
                profile,
                tenant,
                claim.now_ms,
                claim.expires_at_ms,
                labels_json,
                &claim.spec_json,
                memory_bytes,
                claim.cpu_millis,
            ),
            SandboxRow::read,
        )
        .optional()
        .map_err(StoreError::write("warm sandbox claim"))?;
    row.map(SandboxRow::into_record).transpose()
}

/// Refuses one more live sandbox of this size for `tenant` if it would exceed the tenant's quota.
/// Must run inside the write transaction that then inserts or claims the sandbox.
fn check_quota(
    conn: &Connection,
    tenant: &str,
    memory_bytes: u64,
    cpu_millis: u32,
) -> Result<(), StoreError> {
    let quota = get_tenant(conn, tenant)?
        .ok_or_else(|| StoreError::UnknownTenant {
            tenant: tenant.to_owned(),
        })?
        .quota;
    let usage = tenant_usage(conn, tenant)?;
    let checks = [
        (
            "sandboxes",
            quota.max_sandboxes.map(u64::from),
            usage.sandboxes,
            1,
        ),
        ("memory", quota.max_memory_bytes, usage.memory_bytes, memory_bytes),
        (
            "cpu",
            quota.max_cpu_millis.map(u64::from),
            usage.cpu_millis,
            u64::from(cpu_millis),
        ),
    ];
    for (what, limit, used, more) in checks {
        let requested_total = used.saturating_add(more);
        if let Some(limit) = limit.filter(|&limit| requested_total > limit) {
            return Err(StoreError::QuotaExceeded {
                tenant: tenant.to_owned(),
                what,
                limit,
                requested_total,
            });
        }
    }
    Ok(())
}

pub(crate) fn tenant_usage(conn: &Connection, tenant: &str) -> Result<TenantUsage, StoreError> {
    let (sandboxes, memory_bytes, cpu_millis): (i64, i64, i64) = conn
        .query_row(
            "SELECT COUNT(*), COALESCE(SUM(memory_bytes), 0), COALESCE(SUM(cpu_millis), 0)
             FROM sandboxes WHERE tenant = ?1 AND state IN ('creating', 'running')",
            [tenant],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .map_err(StoreError::read("tenant usage"))?;
    Ok(TenantUsage {
        sandboxes: from_i64("tenant usage", sandboxes)?,
        memory_bytes: from_i64("tenant usage", memory_bytes)?,
        cpu_millis: from_i64("tenant usage", cpu_millis)?,
    })
}
