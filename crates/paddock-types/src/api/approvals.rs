//! The approvals queue: requests an approval policy said to `ask` about, waiting for a person
//! (`GET /v1/approvals`, `GET /v1/approvals/{id}`, `POST /v1/approvals/{id}/approve` and
//! `.../reject`, and `GET /v1/approvals/events`, a server-sent event stream of the queue's changes).

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for a person; nothing of the request has run.
    Pending,
    /// Approved: the request may run once (`used_at` says when it did).
    Approved,
    /// Rejected: the request never runs.
    Rejected,
    /// No one decided before `expires_at` (or it was approved and not used in time): the request
    /// never runs.
    Expired,
}

impl ApprovalState {
    /// The state as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
        }
    }

    /// The state of its wire name.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Pending, Self::Approved, Self::Rejected, Self::Expired]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// What kind of request waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalKind {
    /// A process to start in a sandbox (`POST /v1/sandboxes/{id}/exec` and the front-ends on it).
    Exec,
    /// A file-API write, removal, directory or move in a sandbox.
    File,
    /// A connection from a sandbox to a destination its allowlist does not cover.
    Network,
    /// An approved execution (`POST /v1/executions`).
    Execution,
}

impl ApprovalKind {
    /// The kind as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::File => "file",
            Self::Network => "network",
            Self::Execution => "execution",
        }
    }

    /// The kind of its wire name.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Exec, Self::File, Self::Network, Self::Execution]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// One approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalInfo {
    /// `apr_...`.
    pub id: String,
    /// Where it stands.
    pub state: ApprovalState,
    /// What kind of request waits.
    pub kind: ApprovalKind,
    /// The sandbox the request is for (absent for an execution not yet run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// One line for a person: the command line, `write /path`, `connect host:port`.
    pub summary: String,
    /// The exact request, as the API received it (what an approval lets run, and nothing else).
    #[schema(value_type = Object)]
    pub request: serde_json::Value,
    /// SHA-256 of `request`'s canonical JSON: a retry runs under this approval only if its request
    /// hashes the same.
    pub request_sha256: String,
    /// Which policy said `ask`: `sandbox` or `tenant`.
    pub policy: String,
    /// The index of the rule that said `ask` (absent: the policy's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<u32>,
    /// That rule's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The key that asked.
    pub requested_by: String,
    /// When it was asked (RFC 3339).
    pub created_at: String,
    /// When it expires if no one decides (RFC 3339); an approved one must be used by then too.
    pub expires_at: String,
    /// When it was approved, rejected or expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    /// The key that approved or rejected it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// The approver's note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// When the approved request ran (an approval lets it run once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_at: Option<String>,
}

/// `GET /v1/approvals`: newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalList {
    /// The approvals.
    pub approvals: Vec<ApprovalInfo>,
}

/// The query of `GET /v1/approvals`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListApprovalsQuery {
    /// Only approvals in this state (`pending`, `approved`, `rejected`, `expired`).
    #[serde(default)]
    pub state: Option<String>,
    /// Only this sandbox's.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// `POST /v1/approvals/{id}/approve` and `.../reject`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideApprovalRequest {
    /// A note for the audit log and whoever asked (at most 1024 bytes).
    #[serde(default)]
    pub note: Option<String>,
}

/// One change of the queue, as `GET /v1/approvals/events` sends it (event name: the `event`
/// field) and the webhook posts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalEvent {
    /// `requested`, `approved`, `rejected`, `expired` or `used`.
    pub event: String,
    /// The tenant whose queue changed.
    pub tenant: String,
    /// The approval after the change.
    pub approval: ApprovalInfo,
}
