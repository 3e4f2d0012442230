//! The audit log.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// `GET /v1/audit` query. Non-admin keys only see their own tenant's rows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Only this tenant (admin keys).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Only this sandbox.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// Only this action (`process.exit`), or a family ending in `.` (`process.`).
    #[serde(default)]
    pub action: Option<String>,
    /// Not before this time (RFC 3339).
    #[serde(default)]
    pub since: Option<String>,
    /// Not after this time (RFC 3339).
    #[serde(default)]
    pub until: Option<String>,
    /// Only rows after this sequence number (for paging).
    #[serde(default)]
    pub after_seq: Option<u64>,
    /// Most rows in a page (1-1000, default 100). A page whose rows carry large details holds
    /// fewer (about 8 MiB of details at most); `next_after_seq` then says where the next one starts.
    #[serde(default)]
    pub limit: Option<u32>,
}

/// One audit row. `hash` = SHA-256 over the row's fields and `prev_hash`, so the rows form a chain
/// that any edit or deletion breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditRecord {
    /// Sequence number (gapless, but for network rows removed by retention: `GET /v1/audit/verify`
    /// accounts for them).
    pub seq: u64,
    /// Time (RFC 3339).
    pub time: String,
    /// Tenant, when the action had one.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The API key id that acted.
    #[serde(default)]
    pub key_id: Option<String>,
    /// What happened (`sandbox.create`, `process.start`, `process.exit`, `file.write`, ...).
    pub action: String,
    /// The sandbox concerned.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// `ok`, or the error code.
    pub outcome: String,
    /// Action-specific details (argv, cwd, exit code, duration, bytes in/out, path, ...).
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
    /// Hash of the previous row.
    pub prev_hash: String,
    /// Hash of this row.
    pub hash: String,
}

/// The first row where the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BrokenAuditRow {
    /// Its sequence number.
    pub seq: u64,
    /// What is wrong with it.
    pub reason: String,
}

/// `GET /v1/audit/verify` (admin) and `paddock audit verify`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditVerification {
    /// Whether the whole chain is intact.
    pub ok: bool,
    /// Rows checked.
    pub rows_checked: u64,
    /// Network rows (`network.*`) that retention removed: the chain was followed across them through
    /// the hashes recorded by `audit.prune` rows, whose own rows are checked like any other.
    #[serde(default)]
    pub rows_pruned: u64,
    /// The `audit.prune` rows whose records were used to cross removed rows.
    #[serde(default)]
    pub prune_anchors: u64,
    /// The first broken row, if any.
    #[serde(default)]
    pub first_broken: Option<BrokenAuditRow>,
}
