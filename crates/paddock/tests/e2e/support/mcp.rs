//! An MCP client (rmcp's) of a harness's service, over an in-memory duplex, acting as one API key;
//! and readers of a tool call's structured result or failure text. The transports themselves are
//! tested against real servers in `mcp/`; this is for what the tools do on real sandboxes.

use paddock_control::SandboxService;
use paddock_mcp::{McpSettings, PaddockMcp};
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::Value;

/// A client of `service`'s MCP tools as the holder of `key`.
pub async fn connect(service: &SandboxService, key: &str) -> RunningService<RoleClient, ()> {
    let principal = service.authenticate(key).await.expect("the key authenticates");
    let (server_end, client_end) = tokio::io::duplex(1 << 20);
    let server = PaddockMcp::new(service.clone(), principal, McpSettings::default());
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_end).await.expect("the MCP client connects")
}

/// Calls `tool` with `args`.
pub async fn call(client: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> CallToolResult {
    let args = args.as_object().cloned().unwrap_or_default();
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// A successful call's structured result.
pub fn ok(result: &CallToolResult) -> Value {
    assert_ne!(result.is_error, Some(true), "{result:?}");
    result.structured_content.clone().expect("structured content")
}

/// A failed call's text.
pub fn error_text(result: &CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    result.content[0]
        .as_text()
        .map(|t| t.text.clone())
        .unwrap_or_default()
}
