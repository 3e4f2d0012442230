//! Quota checks. Every write that adds something a tenant runs or stores (a sandbox, a warm claim, a
//! resume, a snapshot, a volume) checks the tenant's quota and writes in one `BEGIN IMMEDIATE`
//! transaction, which is what makes quotas race-free across threads and processes.
//!
//! What counts (see [`TenantQuota`] for the limits):
//! - sandboxes: every sandbox that exists, creating, running (paused too) or stopped; memory and CPU:
//!   the limits of the creating and running ones (a stopped sandbox holds no memory or CPU, and its
//!   resume is checked for them);
//! - snapshots: every snapshot that exists, named, checkpoint or imported;
//! - volumes: every volume that exists;
//! - templates: every template that exists, built or being built;
//! - storage bytes: a sandbox's disk limit plus its base (the charge of the snapshot it was made
//!   from), a snapshot's own charge (its sandbox's base plus what the sandbox had written when it was
//!   taken; an import: the archive's size), a volume's size, a template's charge (while
//!   it is built, the most its build may write; once built, what its tree holds). These are upper
//!   bounds of what each can hold in the pool, known without walking any files.
//!
//! What it does not do: measure anything (the control plane supplies every size), or take back what
//! was admitted when a quota is lowered later (the tenant just cannot add more until it is under).

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension};

use crate::cached::Cached;
use crate::error::{from_i64, to_i64};
use crate::sandboxes::{encode_labels, insert_sandbox, SandboxRow, SANDBOX_COLUMNS};
use crate::tenants::get_tenant;
use crate::{NewSandbox, QuotaDefaults, SandboxRecord, Store, StoreError, StoreTx, TenantQuota, TenantUsage};

/// What a tenant's claim of a warm sandbox sets on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub memory_bytes: u64,
    pub cpu_millis: u32,
    /// The claimed sandbox's disk limit (its base is the template: 0).
    pub disk_bytes: u64,
    pub labels: BTreeMap<String, String>,
    pub spec_json: String,
    pub expires_at_ms: Option<i64>,
    pub now_ms: i64,
}

/// How much more of each quota an operation would use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaRequest {
    pub sandboxes: u64,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
    pub snapshots: u64,
    pub volumes: u64,
    pub templates: u64,
    pub storage_bytes: u64,
}

impl QuotaRequest {
    /// What `sandbox` adds when it is inserted.
    pub fn sandbox(sandbox: &NewSandbox) -> Self {
        Self {
            sandboxes: 1,
            memory_bytes: sandbox.memory_bytes,
            cpu_millis: u64::from(sandbox.cpu_millis),
            storage_bytes: sandbox.disk_bytes.saturating_add(sandbox.base_bytes),
            ..Self::default()
        }
    }

    /// `n` times this request.
    pub fn times(self, n: u64) -> Self {
        Self {
            sandboxes: self.sandboxes.saturating_mul(n),
            memory_bytes: self.memory_bytes.saturating_mul(n),
            cpu_millis: self.cpu_millis.saturating_mul(n),
            snapshots: self.snapshots.saturating_mul(n),
            volumes: self.volumes.saturating_mul(n),
            templates: self.templates.saturating_mul(n),
            storage_bytes: self.storage_bytes.saturating_mul(n),
        }
    }

    /// This request and `other` together.
    pub fn plus(self, other: Self) -> Self {
        Self {
            sandboxes: self.sandboxes.saturating_add(other.sandboxes),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            snapshots: self.snapshots.saturating_add(other.snapshots),
            volumes: self.volumes.saturating_add(other.volumes),
            templates: self.templates.saturating_add(other.templates),
            storage_bytes: self.storage_bytes.saturating_add(other.storage_bytes),
        }
    }
}

impl Store {
    /// Inserts a tenant-owned sandbox if the tenant's quota (read from the tenants table in the same
    /// transaction) allows one more sandbox of its size; else [`StoreError::QuotaExceeded`].
    pub fn insert_sandbox_checked(
        &self,
        sandbox: &NewSandbox,
        defaults: &QuotaDefaults,
    ) -> Result<(), StoreError> {
        self.write("insert sandbox", |conn| {
            insert_sandbox_checked(conn, sandbox, defaults)
        })
    }

    /// Gives `tenant` the oldest warm sandbox of `profile`, now running with the claim's size, labels,
    /// spec and expiry. The quota is checked first, so a tenant at its limit gets
    /// [`StoreError::QuotaExceeded`] whether or not a warm sandbox exists; `Ok(None)` means none does.
    pub fn claim_warm_sandbox(
        &self,
        profile: &str,
        tenant: &str,
        claim: &Claim,
        defaults: &QuotaDefaults,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        self.write("claim warm sandbox", |conn| {
            claim_warm_sandbox(conn, profile, tenant, claim, defaults)
        })
    }

    /// Moves stopped sandbox `id` of `tenant` back to `creating` (it resumes) if the tenant's memory
    /// and CPU quotas allow it to run again (it already counts as a sandbox and for its storage);
    /// `false` if it is not a stopped sandbox of `tenant`.
    pub fn resume_stopped_checked(
        &self,
        id: &str,
        tenant: &str,
        defaults: &QuotaDefaults,
    ) -> Result<bool, StoreError> {
        self.write("resume stopped sandbox", |conn| {
            resume_stopped_checked(conn, id, tenant, defaults)
        })
    }

    /// Refuses `request` if it would take `tenant` over its quota, without writing anything: a check
    /// before expensive work (a fork of N copies, a capture, an upload) whose own insert checks again.
    pub fn check_quota(
        &self,
        tenant: &str,
        request: &QuotaRequest,
        defaults: &QuotaDefaults,
    ) -> Result<(), StoreError> {
        check_quota(&self.conn(), tenant, request, defaults)
    }

    /// The tenant's quota as it applies: its own fields, `defaults` where it has none. `None` if the
    /// tenant does not exist.
    pub fn effective_quota(
        &self,
        tenant: &str,
        defaults: &QuotaDefaults,
    ) -> Result<Option<TenantQuota>, StoreError> {
        Ok(get_tenant(&self.conn(), tenant)?.map(|t| t.quota.or(&defaults.quota)))
    }

    /// What `tenant` uses now (legacy unsized volumes charged `defaults.unsized_volume_bytes`).
    pub fn tenant_usage(&self, tenant: &str, defaults: &QuotaDefaults) -> Result<TenantUsage, StoreError> {
        tenant_usage(&self.conn(), tenant, defaults)
    }

    /// Sets what sandbox `id` started from (a rollback replaces its files with a snapshot's: its
    /// base becomes that snapshot's charge). `false` if there is no such sandbox.
    pub fn set_sandbox_base_bytes(&self, id: &str, base_bytes: u64) -> Result<bool, StoreError> {
        set_sandbox_base_bytes(&self.conn(), id, base_bytes)
    }
}

fn set_sandbox_base_bytes(conn: &Connection, id: &str, base_bytes: u64) -> Result<bool, StoreError> {
    let base = to_i64("base_bytes", base_bytes)?;
    let changed = conn
        .execute_cached("UPDATE sandboxes SET base_bytes = ?2 WHERE id = ?1", (id, base))
        .map_err(StoreError::write("sandbox base"))?;
    Ok(changed == 1)
}

impl StoreTx<'_> {
    /// [`Store::set_sandbox_base_bytes`] inside this transaction.
    pub fn set_sandbox_base_bytes(&self, id: &str, base_bytes: u64) -> Result<bool, StoreError> {
        set_sandbox_base_bytes(&self.tx, id, base_bytes)
    }

    /// Sets what sandbox `id` of `tenant` started from, refusing with
    /// [`StoreError::QuotaExceeded`] a raise that the tenant's storage quota cannot take (a lower
    /// figure is always taken). A fork's copies are recorded with their base as read before the
    /// pool's transaction that made their file systems, and get the exact figure after it. `false`
    /// if `tenant` has no such sandbox.
    pub fn rebase_sandbox_checked(
        &self,
        id: &str,
        tenant: &str,
        base_bytes: u64,
        defaults: &QuotaDefaults,
    ) -> Result<bool, StoreError> {
        let current: Option<i64> = self
            .tx
            .query_row_cached(
                "SELECT base_bytes FROM sandboxes WHERE id = ?1 AND tenant = ?2",
                (id, tenant),
                |row| row.get(0),
            )
            .optional()
            .map_err(StoreError::read("sandbox base"))?;
        let Some(current) = current else {
            return Ok(false);
        };
        let current = from_i64("sandbox base_bytes", current)?;
        if base_bytes > current {
            let more = QuotaRequest {
                storage_bytes: base_bytes - current,
                ..QuotaRequest::default()
            };
            check_quota(&self.tx, tenant, &more, defaults)?;
        }
        set_sandbox_base_bytes(&self.tx, id, base_bytes)
    }

    /// [`Store::insert_sandbox_checked`] inside this transaction.
    pub fn insert_sandbox_checked(
        &self,
        sandbox: &NewSandbox,
        defaults: &QuotaDefaults,
    ) -> Result<(), StoreError> {
        insert_sandbox_checked(&self.tx, sandbox, defaults)
    }

    /// [`Store::claim_warm_sandbox`] inside this transaction.
    pub fn claim_warm_sandbox(
        &self,
        profile: &str,
        tenant: &str,
        claim: &Claim,
        defaults: &QuotaDefaults,
    ) -> Result<Option<SandboxRecord>, StoreError> {
        claim_warm_sandbox(&self.tx, profile, tenant, claim, defaults)
    }
}

fn insert_sandbox_checked(
    conn: &Connection,
    sandbox: &NewSandbox,
    defaults: &QuotaDefaults,
) -> Result<(), StoreError> {
    let Some(tenant) = &sandbox.tenant else {
        return Err(StoreError::NoTenant {
            id: sandbox.id.clone(),
        });
    };
    check_quota(conn, tenant, &QuotaRequest::sandbox(sandbox), defaults)?;
    insert_sandbox(conn, sandbox)
}

fn resume_stopped_checked(
    conn: &Connection,
    id: &str,
    tenant: &str,
    defaults: &QuotaDefaults,
) -> Result<bool, StoreError> {
    let size: Option<(i64, i64)> = conn
        .query_row_cached(
            "SELECT memory_bytes, cpu_millis FROM sandboxes WHERE id = ?1 AND tenant = ?2 AND state = 'stopped'",
            (id, tenant),
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()
        .map_err(StoreError::read("stopped sandbox"))?;
    let Some((memory, cpu)) = size else {
        return Ok(false);
    };
    let request = QuotaRequest {
        memory_bytes: from_i64("stopped sandbox", memory)?,
        cpu_millis: from_i64("stopped sandbox", cpu)?,
        ..QuotaRequest::default()
    };
    check_quota(conn, tenant, &request, defaults)?;
    let changed = conn
        .execute_cached(
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
    defaults: &QuotaDefaults,
) -> Result<Option<SandboxRecord>, StoreError> {
    let request = QuotaRequest {
        sandboxes: 1,
        memory_bytes: claim.memory_bytes,
        cpu_millis: u64::from(claim.cpu_millis),
        storage_bytes: claim.disk_bytes,
        ..QuotaRequest::default()
    };
    check_quota(conn, tenant, &request, defaults)?;
    let labels_json = encode_labels(&claim.labels)?;
    let memory_bytes = to_i64("memory_bytes", claim.memory_bytes)?;
    let disk_bytes = to_i64("disk_bytes", claim.disk_bytes)?;
    let row = conn
        .query_row_cached(
            &format!(
                "UPDATE sandboxes
                 SET tenant = ?2, state = 'running', claimed_at_ms = ?3, expires_at_ms = ?4,
                     labels_json = ?5, spec_json = ?6, memory_bytes = ?7, cpu_millis = ?8,
                     disk_bytes = ?9, base_bytes = 0
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
                disk_bytes,
            ),
            SandboxRow::read,
        )
        .optional()
        .map_err(StoreError::write("warm sandbox claim"))?;
    row.map(SandboxRow::into_record).transpose()
}

/// Refuses `request` for `tenant` if it would take any of its quotas past its limit. Run inside the
/// write transaction that then inserts what was asked for, so the check and the insert are atomic.
pub(crate) fn check_quota(
    conn: &Connection,
    tenant: &str,
    request: &QuotaRequest,
    defaults: &QuotaDefaults,
) -> Result<(), StoreError> {
    let quota = get_tenant(conn, tenant)?
        .ok_or_else(|| StoreError::UnknownTenant {
            tenant: tenant.to_owned(),
        })?
        .quota
        .or(&defaults.quota);
    let usage = tenant_usage(conn, tenant, defaults)?;
    match first_exceeded(&quota, &usage, request) {
        None => Ok(()),
        Some((what, limit, requested_total)) => Err(StoreError::QuotaExceeded {
            tenant: tenant.to_owned(),
            what,
            limit,
            requested_total,
        }),
    }
}

/// The first quota `request` would take past its limit: (its field name, the limit, the total the
/// request would make). Only what the request adds to is checked, so a tenant over a quota that was
/// lowered can still do what does not add to it (delete, stop, snapshot when over on volumes).
pub fn first_exceeded(
    quota: &TenantQuota,
    usage: &TenantUsage,
    request: &QuotaRequest,
) -> Option<(&'static str, u64, u64)> {
    let checks = [
        (
            "max_sandboxes",
            quota.max_sandboxes.map(u64::from),
            usage.sandboxes,
            request.sandboxes,
        ),
        (
            "max_memory",
            quota.max_memory_bytes,
            usage.memory_bytes,
            request.memory_bytes,
        ),
        (
            "max_cpus",
            quota.max_cpu_millis.map(u64::from),
            usage.cpu_millis,
            request.cpu_millis,
        ),
        (
            "max_snapshots",
            quota.max_snapshots.map(u64::from),
            usage.snapshots,
            request.snapshots,
        ),
        (
            "max_volumes",
            quota.max_volumes.map(u64::from),
            usage.volumes,
            request.volumes,
        ),
        (
            "max_templates",
            quota.max_templates.map(u64::from),
            usage.templates,
            request.templates,
        ),
        (
            "max_storage",
            quota.max_storage_bytes,
            usage.storage_bytes,
            request.storage_bytes,
        ),
    ];
    checks.into_iter().find_map(|(what, limit, used, more)| {
        let total = used.saturating_add(more);
        match limit {
            Some(limit) if more > 0 && total > limit => Some((what, limit, total)),
            _ => None,
        }
    })
}

pub(crate) fn tenant_usage(
    conn: &Connection,
    tenant: &str,
    defaults: &QuotaDefaults,
) -> Result<TenantUsage, StoreError> {
    let unsized_volume = to_i64("unsized_volume_bytes", defaults.unsized_volume_bytes)?;
    let row: [i64; 7] = conn
        .query_row_cached(
            "SELECT
                 (SELECT COUNT(*) FROM sandboxes
                  WHERE tenant = ?1 AND state IN ('creating', 'running', 'stopped')),
                 (SELECT COALESCE(SUM(memory_bytes), 0) FROM sandboxes
                  WHERE tenant = ?1 AND state IN ('creating', 'running')),
                 (SELECT COALESCE(SUM(cpu_millis), 0) FROM sandboxes
                  WHERE tenant = ?1 AND state IN ('creating', 'running')),
                 (SELECT COUNT(*) FROM snapshots WHERE tenant = ?1 AND deleted_at_ms IS NULL),
                 (SELECT COUNT(*) FROM volumes WHERE tenant = ?1 AND deleted_at_ms IS NULL),
                 (SELECT COUNT(*) FROM templates WHERE tenant = ?1 AND deleted_at_ms IS NULL),
                 (SELECT COALESCE(SUM(disk_bytes + base_bytes), 0) FROM sandboxes
                  WHERE tenant = ?1 AND state IN ('creating', 'running', 'stopped'))
                 + (SELECT COALESCE(SUM(storage_bytes), 0) FROM snapshots
                    WHERE tenant = ?1 AND deleted_at_ms IS NULL)
                 + (SELECT COALESCE(SUM(COALESCE(size_bytes, ?2)), 0) FROM volumes
                    WHERE tenant = ?1 AND deleted_at_ms IS NULL)
                 + (SELECT COALESCE(SUM(storage_bytes), 0) FROM templates
                    WHERE tenant = ?1 AND deleted_at_ms IS NULL)",
            (tenant, unsized_volume),
            |row| {
                Ok([
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                    row.get(6)?,
                ])
            },
        )
        .map_err(StoreError::read("tenant usage"))?;
    let [sandboxes, memory_bytes, cpu_millis, snapshots, volumes, templates, storage_bytes] = row;
    Ok(TenantUsage {
        sandboxes: from_i64("tenant usage", sandboxes)?,
        memory_bytes: from_i64("tenant usage", memory_bytes)?,
        cpu_millis: from_i64("tenant usage", cpu_millis)?,
        snapshots: from_i64("tenant usage", snapshots)?,
        volumes: from_i64("tenant usage", volumes)?,
        templates: from_i64("tenant usage", templates)?,
        storage_bytes: from_i64("tenant usage", storage_bytes)?,
    })
}
