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
    /// May change a live sandbox's network policy and injected secrets after creation (`PUT
    /// /v1/sandboxes/{id}/network`; refused with `forbidden` otherwise). Allowed when absent: set it
    /// to `false` for a key whose sandboxes must keep the network they were created with.
    #[serde(default = "allowed")]
    pub change_network: bool,
    /// May set and delete the tenant's approval policies (`PUT`/`DELETE /v1/policy` and
    /// `/v1/sandboxes/{id}/policy`; refused with `forbidden` otherwise). Not allowed when absent;
    /// an admin key may do everything an approver may, and is made one.
    #[serde(default)]
    pub approver: bool,
}

fn allowed() -> bool {
    true
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
    /// The same key in E2B's spelling (`e2b_` and hex), for E2B's SDKs (`E2B_API_KEY`); it also
    /// works wherever `key` does.
    #[serde(default)]
    pub e2b_key: Option<String>,
    /// Admin key.
    pub admin: bool,
    /// May change a live sandbox's network policy and secrets.
    #[serde(default = "allowed")]
    pub change_network: bool,
    /// May set and delete the tenant's approval policies.
    #[serde(default)]
    pub approver: bool,
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
    /// May change a live sandbox's network policy and secrets.
    #[serde(default = "allowed")]
    pub change_network: bool,
    /// May set and delete the tenant's approval policies.
    #[serde(default)]
    pub approver: bool,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// Revocation time, if revoked.
    #[serde(default)]
    pub revoked_at: Option<String>,
    /// Last use (to the minute).
    #[serde(default)]
    pub last_used_at: Option<String>,
}

/// A tenant's quota. In `PUT /v1/tenants/{name}/quota` a field left out or `null` follows the
/// server's default for it (`[quotas]` in its configuration; unlimited where that sets none); in a
/// tenant's answer, each field is the quota as it applies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantQuotaBody {
    /// Sandboxes that exist at once: running, paused and stopped ones (a stopped sandbox keeps its
    /// files and may be resumed at will).
    #[serde(default)]
    pub max_sandboxes: Option<u32>,
    /// Sum of the memory limits of its running sandboxes (bytes or `16G`).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "16G")]
    pub max_memory: Option<crate::ByteSize>,
    /// Sum of the CPU limits of its running sandboxes (one without a CPU limit counts as the host's
    /// CPUs).
    #[serde(default)]
    #[schema(value_type = Option<f64>, example = 8.0)]
    pub max_cpus: Option<crate::CpuQuota>,
    /// Snapshots that exist at once: named ones, checkpoints and imports.
    #[serde(default)]
    pub max_snapshots: Option<u32>,
    /// Volumes that exist at once.
    #[serde(default)]
    pub max_volumes: Option<u32>,
    /// Bytes of storage (bytes or `100G`): the disk limits of its sandboxes (stopped ones too) plus
    /// what each started from, what its snapshots hold, its volumes' sizes, and what its templates
    /// hold (while one is built: the most its build may write).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "100G")]
    pub max_storage: Option<crate::ByteSize>,
    /// Templates that exist at once: built ones and those being built.
    #[serde(default)]
    pub max_templates: Option<u32>,
}

/// What a tenant uses now, in the units of its quota.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantUsageBody {
    /// Sandboxes that exist (running, paused and stopped).
    pub sandboxes: u64,
    /// Sum of the memory limits of the running ones (bytes).
    pub memory_bytes: u64,
    /// Sum of the CPU limits of the running ones (CPUs).
    pub cpus: f64,
    /// Snapshots that exist.
    pub snapshots: u64,
    /// Volumes that exist.
    pub volumes: u64,
    /// Templates that exist (built and being built).
    pub templates: u64,
    /// Bytes charged against `max_storage`.
    pub storage_bytes: u64,
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantInfo {
    /// Its name.
    pub name: String,
    /// Its quota as it applies (its own settings, the server's defaults where it has none).
    pub quota: TenantQuotaBody,
    /// Its current usage.
    pub usage: TenantUsageBody,
}
