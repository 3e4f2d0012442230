//! API keys and tenants (admin operations).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/keys` (admin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyRequest {
    /// The tenant the key acts for (created if new).
    pub tenant: String,
    /// A name to recognise the key by.
    #[serde(default)]
    pub name: Option<String>,
    /// May manage keys, tenants and read every tenant's audit log.
    #[serde(default)]
    pub admin: bool,
}

/// A newly created key: the only time `key` is ever shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedKey {
    /// The key's id (not secret).
    pub id: String,
    /// Its tenant.
    pub tenant: String,
    /// The key itself: `Authorization: Bearer <key>`. Store it now; it cannot be retrieved again.
    pub key: String,
    /// Admin key.
    pub admin: bool,
}

/// A key as listed (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeyInfo {
    /// Id.
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// Name.
    #[serde(default)]
    pub name: Option<String>,
    /// Admin key.
    pub admin: bool,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// Revocation time, if revoked.
    #[serde(default)]
    pub revoked_at: Option<String>,
    /// Last use (to the minute).
    #[serde(default)]
    pub last_used_at: Option<String>,
}

/// A tenant's quota; `null` = unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantQuotaBody {
    /// Sandboxes alive at once.
    #[serde(default)]
    pub max_sandboxes: Option<u32>,
    /// Sum of the memory limits of its live sandboxes (bytes or `16G`).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "16G")]
    pub max_memory: Option<crate::ByteSize>,
    /// Sum of the CPU limits of its live sandboxes.
    #[serde(default)]
    #[schema(value_type = Option<f64>, example = 8.0)]
    pub max_cpus: Option<crate::CpuQuota>,
}

/// What a tenant uses now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantUsageBody {
    /// Live sandboxes.
    pub sandboxes: u64,
    /// Sum of their memory limits (bytes).
    pub memory_bytes: u64,
    /// Sum of their CPU limits (CPUs).
    pub cpus: f64,
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantInfo {
    /// Its name.
    pub name: String,
    /// Its quota.
    pub quota: TenantQuotaBody,
    /// Its current usage.
    pub usage: TenantUsageBody,
}
