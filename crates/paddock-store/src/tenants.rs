//! Tenants and their quotas.

use rusqlite::{Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::error::{from_i64, to_i64};
use crate::{Store, StoreError};

/// A tenant's limits on its live (creating or running) sandboxes. `None` means unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantQuota {
    pub max_sandboxes: Option<u32>,
    pub max_memory_bytes: Option<u64>,
    pub max_cpu_millis: Option<u32>,
}

/// A stored tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub name: String,
    pub quota: TenantQuota,
    pub created_at_ms: i64,
}

/// What a tenant's live sandboxes use now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantUsage {
    pub sandboxes: u64,
    pub memory_bytes: u64,
    pub cpu_millis: u64,
}

const TENANT_COLUMNS: &str = "name, max_sandboxes, max_memory_bytes, max_cpu_millis, created_at_ms";

impl Store {
    /// The tenant `name`, created with no limits at `now_ms` if it does not exist yet.
    pub fn ensure_tenant(&self, name: &str, now_ms: i64) -> Result<TenantRecord, StoreError> {
        ensure_tenant(&self.conn(), name, now_ms)
    }

    pub fn get_tenant(&self, name: &str) -> Result<Option<TenantRecord>, StoreError> {
        get_tenant(&self.conn(), name)
    }

    /// Every tenant, by name.
    pub fn list_tenants(&self) -> Result<Vec<TenantRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(&format!("SELECT {TENANT_COLUMNS} FROM tenants ORDER BY name"))
            .map_err(StoreError::read("tenants"))?;
        let rows = stmt
            .query_map([], read_tenant_row)
            .map_err(StoreError::read("tenants"))?;
        rows.map(|row| row.map_err(StoreError::read("tenants")).and_then(|tenant| tenant))
            .collect()
    }

    /// Replaces the tenant's quota, creating the tenant at `now_ms` if it does not exist yet.
    pub fn set_tenant_quota(
        &self,
        name: &str,
        quota: &TenantQuota,
        now_ms: i64,
    ) -> Result<TenantRecord, StoreError> {
        let max_memory_bytes = quota
            .max_memory_bytes
            .map(|v| to_i64("max_memory_bytes", v))
            .transpose()?;
        let conn = self.conn();
        conn.query_row(
            &format!(
                "INSERT INTO tenants (name, max_sandboxes, max_memory_bytes, max_cpu_millis, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (name) DO UPDATE SET
                     max_sandboxes = excluded.max_sandboxes,
                     max_memory_bytes = excluded.max_memory_bytes,
                     max_cpu_millis = excluded.max_cpu_millis
                 RETURNING {TENANT_COLUMNS}"
            ),
            (
                name,
                quota.max_sandboxes,
                max_memory_bytes,
                quota.max_cpu_millis,
                now_ms,
            ),
            read_tenant_row,
        )
        .map_err(StoreError::write("tenant quota"))?
    }
}

pub(crate) fn ensure_tenant(conn: &Connection, name: &str, now_ms: i64) -> Result<TenantRecord, StoreError> {
    conn.execute(
        "INSERT INTO tenants (name, created_at_ms) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
        (name, now_ms),
    )
    .map_err(StoreError::write("tenant"))?;
    // Tenants are never deleted, so the row is still there.
    get_tenant(conn, name)?.ok_or_else(|| StoreError::UnknownTenant {
        tenant: name.to_owned(),
    })
}

pub(crate) fn get_tenant(conn: &Connection, name: &str) -> Result<Option<TenantRecord>, StoreError> {
    conn.query_row(
        &format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE name = ?1"),
        [name],
        read_tenant_row,
    )
    .optional()
    .map_err(StoreError::read("tenant"))?
    .transpose()
}

/// Reads one row of [`TENANT_COLUMNS`]. The outer result is SQLite's, the inner one the conversion's.
fn read_tenant_row(row: &Row<'_>) -> rusqlite::Result<Result<TenantRecord, StoreError>> {
    let name: String = row.get(0)?;
    let max_sandboxes: Option<i64> = row.get(1)?;
    let max_memory_bytes: Option<i64> = row.get(2)?;
    let max_cpu_millis: Option<i64> = row.get(3)?;
    let created_at_ms: i64 = row.get(4)?;
    Ok((|| {
        Ok(TenantRecord {
            name,
            quota: TenantQuota {
                max_sandboxes: max_sandboxes.map(|v| from_i64("tenant quota", v)).transpose()?,
                max_memory_bytes: max_memory_bytes
                    .map(|v| from_i64("tenant quota", v))
                    .transpose()?,
                max_cpu_millis: max_cpu_millis.map(|v| from_i64("tenant quota", v)).transpose()?,
            },
            created_at_ms,
        })
    })())
}
