//! Approved executions (`/v1/executions`): a command an agent proposes (a remediation), held in
//! the approvals queue until a person approves it, then run once on the server's executor (a fresh
//! sandbox, or a Kubernetes Job), with its status, exit code and capped logs read back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// `POST /v1/executions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateExecutionRequest {
    /// The caller's own id for it (at most 128 bytes): a second request with the same id answers
    /// the first execution instead of making another.
    #[serde(default)]
    pub id: Option<String>,
    /// The caller's session (an agent's conversation), kept and shown.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The caller's task, kept and shown.
    #[serde(default)]
    pub task_id: Option<String>,
    /// The template of the sandbox it runs in (`sandbox` executor; `default` when absent).
    #[serde(default)]
    pub template: Option<String>,
    /// The container image it runs in (`kubernetes-job` executor; the operator's default when
    /// absent).
    #[serde(default)]
    pub image: Option<String>,
    /// The program and its leading arguments.
    pub command: Vec<String>,
    /// Further arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The longest it may run, in seconds (the server's default and cap apply).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// What it is for, for the person approving it (required, at most 4096 bytes).
    pub description: String,
}

/// Where an execution stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionState {
    /// Waiting for a person; nothing has run.
    PendingApproval,
    /// Rejected, or its approval expired; nothing ran.
    Rejected,
    /// Approved and running.
    Running,
    /// Exited 0.
    Succeeded,
    /// Exited non-zero, or could not be run.
    Failed,
    /// Ran past its timeout and was ended.
    TimedOut,
    /// Cancelled (before or while running).
    Cancelled,
}

impl ExecutionState {
    /// The state as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PendingApproval => "pending_approval",
            Self::Rejected => "rejected",
            Self::Running => "running",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::TimedOut => "timed_out",
            Self::Cancelled => "cancelled",
        }
    }

    /// The state of its wire name.
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::PendingApproval,
            Self::Rejected,
            Self::Running,
            Self::Succeeded,
            Self::Failed,
            Self::TimedOut,
            Self::Cancelled,
        ]
        .into_iter()
        .find(|s| s.as_str() == text)
    }

    /// Whether it will not change any more.
    pub fn is_final(self) -> bool {
        !matches!(self, Self::PendingApproval | Self::Running)
    }
}

/// One execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecutionInfo {
    /// Paddock's id (`ex-...`).
    pub id: String,
    /// The caller's own id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Where it stands.
    pub state: ExecutionState,
    /// What it is for.
    pub description: String,
    /// What it runs, as requested.
    pub request: CreateExecutionRequest,
    /// `sandbox` or `kubernetes-job`.
    pub executor: String,
    /// What the executor runs it in: a sandbox id, a Job's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The approval it waits on or ran under.
    pub approval_id: String,
    /// The key that asked.
    pub requested_by: String,
    /// The key that approved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    /// The exit code, once it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Its output (stdout and stderr together), once it ended; at most the server's limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<String>,
    /// Whether output past the limit was cut.
    pub logs_truncated: bool,
    /// Why it did not succeed, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339 times.
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// `GET /v1/executions`: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecutionList {
    pub executions: Vec<ExecutionInfo>,
}

/// The query of `GET /v1/executions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListExecutionsQuery {
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}
