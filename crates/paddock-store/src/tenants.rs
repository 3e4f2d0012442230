//! Tenants and their quotas.
//!
//! A tenant's stored quota holds its own overrides; a field it leaves unset (`NULL`) follows the
//! server's default for that field ([`QuotaDefaults`], from the configuration's `[quotas]`), and a
//! field unset in both is unlimited.

use rusqlite::{Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::cached::Cached;
use crate::error::{from_i64, to_i64};
use crate::{Store, StoreError};

/// A tenant's limits on what it runs and what it stores. `None`: the server's default (see
/// [`TenantQuota::or`]); unlimited when that is `None` too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantQuota {
    /// Sandboxes that exist: creating, running (paused too) and stopped. A stopped sandbox keeps its
    /// files and can be resumed at will, so it counts like a running one.
    pub max_sandboxes: Option<u32>,
    /// Sum of the memory limits of its creating and running sandboxes.
    pub max_memory_bytes: Option<u64>,
    /// Sum of the CPU limits of its creating and running sandboxes (an unlimited one counts as the
    /// host's CPUs).
    pub max_cpu_millis: Option<u32>,
    /// Snapshots that exist: named ones, checkpoints and imports alike.
    #[serde(default)]
    pub max_snapshots: Option<u32>,
    /// Volumes that exist.
    #[serde(default)]
    pub max_volumes: Option<u32>,
    /// Bytes of the pool its sandboxes, snapshots, volumes and templates may hold (see `quota.rs`
    /// for what each is charged).
    #[serde(default)]
    pub max_storage_bytes: Option<u64>,
    /// Templates that exist: built ones and those being built.
    #[serde(default)]
    pub max_templates: Option<u32>,
}

impl TenantQuota {
    /// This quota where it says something, `defaults` where it does not.
    pub fn or(&self, defaults: &TenantQuota) -> TenantQuota {
        TenantQuota {
            max_sandboxes: self.max_sandboxes.or(defaults.max_sandboxes),
            max_memory_bytes: self.max_memory_bytes.or(defaults.max_memory_bytes),
            max_cpu_millis: self.max_cpu_millis.or(defaults.max_cpu_millis),
            max_snapshots: self.max_snapshots.or(defaults.max_snapshots),
            max_volumes: self.max_volumes.or(defaults.max_volumes),
            max_storage_bytes: self.max_storage_bytes.or(defaults.max_storage_bytes),
            max_templates: self.max_templates.or(defaults.max_templates),
        }
    }
}

/// What the server applies to every tenant, passed to each quota-checked write (the store keeps no
/// configuration of its own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QuotaDefaults {
    /// The quota of a tenant whose own quota leaves a field unset.
    pub quota: TenantQuota,
    /// What a volume recorded without a size (before migration 0007 sizes were optional) is charged
    /// against the storage quota: the server's default disk size, which new volumes get.
    pub unsized_volume_bytes: u64,
}

/// A stored tenant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantRecord {
    pub name: String,
    pub quota: TenantQuota,
    pub created_at_ms: i64,
}

/// What a tenant uses now, in the units of [`TenantQuota`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantUsage {
    /// Sandboxes that exist (creating, running, stopped).
    pub sandboxes: u64,
    /// Memory limits of the creating and running ones.
    pub memory_bytes: u64,
    /// CPU limits of the creating and running ones.
    pub cpu_millis: u64,
    /// Snapshots that exist.
    pub snapshots: u64,
    /// Volumes that exist.
    pub volumes: u64,
    /// Templates that exist (built or being built).
    #[serde(default)]
    pub templates: u64,
    /// Bytes charged against the storage quota.
    pub storage_bytes: u64,
}

const TENANT_COLUMNS: &str = "name, max_sandboxes, max_memory_bytes, max_cpu_millis, max_snapshots, \
     max_volumes, max_storage_bytes, created_at_ms, max_templates";

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
            .prepare_cached(&format!("SELECT {TENANT_COLUMNS} FROM tenants ORDER BY name"))
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
        let max_storage_bytes = quota
            .max_storage_bytes
            .map(|v| to_i64("max_storage_bytes", v))
            .transpose()?;
        let conn = self.conn();
        conn.query_row_cached(
            &format!(
                "INSERT INTO tenants (name, max_sandboxes, max_memory_bytes, max_cpu_millis, max_snapshots,
                                      max_volumes, max_storage_bytes, created_at_ms, max_templates)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (name) DO UPDATE SET
                     max_sandboxes = excluded.max_sandboxes,
                     max_memory_bytes = excluded.max_memory_bytes,
                     max_cpu_millis = excluded.max_cpu_millis,
                     max_snapshots = excluded.max_snapshots,
                     max_volumes = excluded.max_volumes,
                     max_storage_bytes = excluded.max_storage_bytes,
                     max_templates = excluded.max_templates
                 RETURNING {TENANT_COLUMNS}"
            ),
            (
                name,
                quota.max_sandboxes,
                max_memory_bytes,
                quota.max_cpu_millis,
                quota.max_snapshots,
                quota.max_volumes,
                max_storage_bytes,
                now_ms,
                quota.max_templates,
            ),
            read_tenant_row,
        )
        .map_err(StoreError::write("tenant quota"))?
    }
}

pub(crate) fn ensure_tenant(conn: &Connection, name: &str, now_ms: i64) -> Result<TenantRecord, StoreError> {
    conn.execute_cached(
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
    conn.query_row_cached(
        &format!("SELECT {TENANT_COLUMNS} FROM tenants WHERE name = ?1"),
        [name],
        read_tenant_row,
    )
    .optional()
    .map_err(StoreError::read("tenant"))?
    .transpose()
}

/// A stored quota field back as the unsigned quantity it was written from.
fn quota_field<T: TryFrom<i64>>(value: Option<i64>) -> Result<Option<T>, StoreError> {
    value.map(|v| from_i64("tenant quota", v)).transpose()
}

/// Reads one row of [`TENANT_COLUMNS`]. The outer result is SQLite's, the inner one the conversion's.
fn read_tenant_row(row: &Row<'_>) -> rusqlite::Result<Result<TenantRecord, StoreError>> {
    let name: String = row.get(0)?;
    let max_sandboxes: Option<i64> = row.get(1)?;
    let max_memory_bytes: Option<i64> = row.get(2)?;
    let max_cpu_millis: Option<i64> = row.get(3)?;
    let max_snapshots: Option<i64> = row.get(4)?;
    let max_volumes: Option<i64> = row.get(5)?;
    let max_storage_bytes: Option<i64> = row.get(6)?;
    let created_at_ms: i64 = row.get(7)?;
    let max_templates: Option<i64> = row.get(8)?;
    Ok((|| {
        Ok(TenantRecord {
            name,
            quota: TenantQuota {
                max_sandboxes: quota_field(max_sandboxes)?,
                max_memory_bytes: quota_field(max_memory_bytes)?,
                max_cpu_millis: quota_field(max_cpu_millis)?,
                max_snapshots: quota_field(max_snapshots)?,
                max_volumes: quota_field(max_volumes)?,
                max_storage_bytes: quota_field(max_storage_bytes)?,
                max_templates: quota_field(max_templates)?,
            },
            created_at_ms,
        })
    })())
}
