//! Envelopes of list answers (an object, not a bare array, so fields can be added later).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{AuditRecord, KeyInfo, ProcessInfo, TenantInfo};

/// `GET /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    /// Running processes and finished ones the agent still remembers, oldest first.
    pub processes: Vec<ProcessInfo>,
}

/// `GET /v1/audit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    /// Rows in sequence order.
    pub records: Vec<AuditRecord>,
    /// Pass as `after_seq` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after_seq: Option<u64>,
}

/// `GET /v1/keys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeyList {
    /// The keys (never their secrets).
    pub keys: Vec<KeyInfo>,
}

/// `GET /v1/tenants`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantList {
    /// The tenants.
    pub tenants: Vec<TenantInfo>,
}
