//! The record of a front-end's calls that are more than one operation: an MCP tool call is one
//! `mcp.call` row (the tool, its arguments or their hash, how it ended), beside the rows its
//! operations write themselves, so an audit reader sees what the agent asked for as a whole.
//!
//! What it does not do: decide anything (the operations the call made were checked and recorded
//! on their own), or keep large arguments (file contents, code): past [`INLINE_ARGUMENTS`] bytes a
//! row keeps only their size and SHA-256.

use paddock_types::api::ErrorCode;
use sha2::Digest as _;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::error::ServiceError;
use crate::{Principal, SandboxService};

/// Arguments whose JSON is at most this long are kept in the row as given.
pub const INLINE_ARGUMENTS: usize = 512;

/// One finished tool call, as [`SandboxService::record_tool_call`] records it.
#[derive(Debug)]
pub struct ToolCallRecord<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The sandbox it named, if it named one.
    pub sandbox: Option<&'a str>,
    /// Its arguments as the client sent them.
    pub arguments: &'a serde_json::Value,
    /// How it ended.
    pub outcome: ToolCallOutcome,
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallOutcome {
    /// It answered (a command's non-zero exit is an answer).
    Ok,
    /// It failed with this stable code.
    Failed(ErrorCode),
    /// The client cancelled it before it answered; what it was doing was stopped.
    Cancelled,
}

impl ToolCallOutcome {
    /// The row's outcome: `ok`, `cancelled` or the failure's code.
    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed(code) => code.as_str(),
            Self::Cancelled => "cancelled",
        }
    }
}

impl SandboxService {
    /// Appends the `mcp.call` row of a tool call `p` made.
    pub async fn record_tool_call(
        &self,
        p: &Principal,
        call: ToolCallRecord<'_>,
    ) -> Result<(), ServiceError> {
        let text = call.arguments.to_string();
        let detail = audit::ToolCall {
            tool: call.tool.to_owned(),
            arguments: (text.len() <= INLINE_ARGUMENTS).then(|| call.arguments.clone()),
            arguments_bytes: text.len() as u64,
            arguments_sha256: hex::encode(sha2::Sha256::digest(text.as_bytes())),
        };
        self.audit(
            AuditEntry::ok(p, AuditAction::McpCall, call.sandbox)
                .outcome(call.outcome.as_str())
                .detail(detail),
        )
        .await
    }
}
