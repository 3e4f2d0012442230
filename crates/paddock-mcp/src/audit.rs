//! What a tool call's audit row says of it: how it ended (its failure's stable code, read back
//! from the tool's error text, which starts with it) and which sandbox it named.
//!
//! What it does not do: write the row (`SandboxService::record_tool_call` does), or judge the
//! call.

use paddock_control::ToolCallOutcome;
use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;
use rmcp::model::{CallToolResponse, ErrorData};

/// How a tool call ended, from its response: a result with `isError` failed with the code its
/// text starts with; a protocol error (an unknown tool, arguments that do not fit its schema) is
/// an invalid request.
pub(crate) fn outcome(response: &Result<CallToolResponse, ErrorData>) -> ToolCallOutcome {
    let result = match response {
        Ok(CallToolResponse::Complete(result)) => result,
        Ok(_) => return ToolCallOutcome::Ok,
        Err(_) => return ToolCallOutcome::Failed(ErrorCode::InvalidRequest),
    };
    if result.is_error != Some(true) {
        return ToolCallOutcome::Ok;
    }
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map_or("", |t| t.text.as_str());
    ToolCallOutcome::Failed(error_code(text))
}

/// The stable code a tool's error text starts with (`sandbox_not_found: ...`); `internal` when it
/// starts with none.
fn error_code(text: &str) -> ErrorCode {
    let code = text.split_once(':').map_or(text, |(code, _)| code);
    serde_json::from_value(serde_json::Value::String(code.to_owned())).unwrap_or(ErrorCode::Internal)
}

/// The sandbox a call's arguments name, when they name a well-formed one.
pub(crate) fn sandbox_named(arguments: &serde_json::Value) -> Option<String> {
    let text = arguments.get("sandbox_id")?.as_str()?;
    text.parse::<SandboxId>().ok().map(|_| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_text_gives_its_code_and_anything_else_is_internal() {
        assert_eq!(
            error_code("sandbox_not_found: no sandbox sb-1"),
            ErrorCode::SandboxNotFound
        );
        assert_eq!(
            error_code("invalid_request: timeout_secs: between 1 and 3600"),
            ErrorCode::InvalidRequest
        );
        assert_eq!(error_code("no code here"), ErrorCode::Internal);
        assert_eq!(error_code("made_up: x"), ErrorCode::Internal);
    }

    #[test]
    fn only_a_well_formed_sandbox_id_is_named() {
        assert_eq!(
            sandbox_named(&serde_json::json!({"sandbox_id": "sb-0123456789abcdef"})).as_deref(),
            Some("sb-0123456789abcdef")
        );
        assert_eq!(sandbox_named(&serde_json::json!({"sandbox_id": "../etc"})), None);
        assert_eq!(sandbox_named(&serde_json::json!({"path": "/x"})), None);
    }
}
