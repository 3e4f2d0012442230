//! Approval policies: `PUT`, `GET` and `DELETE /v1/policy` (the caller's tenant) and
//! `/v1/sandboxes/{id}/policy` (one of its sandboxes).
//!
//! The policy itself is paddock-policy's `PolicySpec` (`{"default": "allow|ask|deny", "rules":
//! [...]}`), carried here as JSON: the control plane parses and compiles it, refusing a faulty one
//! whole with `invalid_request` and `field` naming the fault (`policy.rules[1].exec.args`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `PUT /v1/policy` and `PUT /v1/sandboxes/{id}/policy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetApprovalPolicyRequest {
    /// The policy: a default verdict (`allow`, `ask` or `deny`) and ordered rules, each a verdict
    /// and one matcher (`exec`, `file` or `network`).
    #[schema(value_type = Object, example = json!({"default": "allow", "rules": [
        {"verdict": "ask", "exec": {"command": {"regex": "^git push( |$)"}}}
    ]}))]
    pub policy: serde_json::Value,
}

/// An approval policy as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ApprovalPolicyInfo {
    /// The sandbox it applies to; absent for the tenant's policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// The policy, normalized (absent optional fields left out).
    #[schema(value_type = Object)]
    pub policy: serde_json::Value,
    /// When it was last set (RFC 3339).
    pub updated_at: String,
}
