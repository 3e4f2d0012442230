//! What the MCP tool tests share: the service on the fake backend with two tenants' keys, an rmcp
//! client connected to a principal's server over an in-memory duplex, and readers of a call's
//! structured result or failure text.

use paddock_control::{Principal, SandboxService, ServiceConfig};
use paddock_mcp::{McpSettings, PaddockMcp};
use paddock_runtime::fake::FakeBackend;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::{json, Value};

/// Every tool the server lists, sorted.
pub const TOOLS: &[&str] = &[
    "checkpoint",
    "commit",
    "file_download_url",
    "file_edit",
    "file_list",
    "file_mkdir",
    "file_move",
    "file_read",
    "file_remove",
    "file_stat",
    "file_upload_url",
    "file_write",
    "network_get",
    "network_set",
    "port_url",
    "process_list",
    "process_read",
    "process_signal",
    "process_start",
    "process_write",
    "rollback",
    "run_code",
    "run_command",
    "sandbox_create",
    "sandbox_extend",
    "sandbox_fork",
    "sandbox_info",
    "sandbox_kill",
    "sandbox_list",
    "snapshot_create",
    "snapshot_delete",
    "snapshot_list",
];

pub async fn service() -> (SandboxService, Principal, Principal) {
    let (service, admin) = started(ServiceConfig::default()).await;
    let a = new_key(&service, &admin, json!({ "tenant": "a" })).await;
    let b = new_key(&service, &admin, json!({ "tenant": "b" })).await;
    (service, a, b)
}

/// The service on the fake backend with `config`, recovered, and its bootstrapped admin.
pub async fn started(config: ServiceConfig) -> (SandboxService, Principal) {
    let backend = FakeBackend::new().expect("fake backend");
    let store = Store::open_in_memory().expect("store");
    let service = SandboxService::start(config, AnyBackend::Fake(backend), store)
        .await
        .expect("service");
    service.recovered().await;
    let admin = service
        .bootstrap_admin_key()
        .await
        .expect("bootstrap")
        .expect("a key");
    let admin = service.authenticate(&admin.key).await.expect("admin");
    (service, admin)
}

/// A key `admin` makes from `request` (a key request's JSON), as its principal.
pub async fn new_key(service: &SandboxService, admin: &Principal, request: Value) -> Principal {
    let created = service
        .create_key(admin, serde_json::from_value(request).expect("request"))
        .await
        .expect("key");
    service.authenticate(&created.key).await.expect("tenant key")
}

/// A client connected to `principal`'s MCP server.
pub async fn connect(service: &SandboxService, principal: Principal) -> RunningService<RoleClient, ()> {
    let (server_end, client_end) = tokio::io::duplex(1 << 20);
    let server = PaddockMcp::new(service.clone(), principal, McpSettings::default());
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_end).await.expect("the client connects")
}

pub async fn call<H: rmcp::ClientHandler>(
    client: &RunningService<RoleClient, H>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    let args = args.as_object().cloned().unwrap_or_default();
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
}

/// A successful call's structured result (also given as text).
pub fn structured(result: &CallToolResult) -> Value {
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let value = result
        .structured_content
        .clone()
        .unwrap_or_else(|| panic!("no structured content: {result:?}"));
    let text = result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default();
    assert_eq!(
        serde_json::from_str::<Value>(&text).ok(),
        Some(value.clone()),
        "the text mirrors it"
    );
    value
}

/// A failed call's text.
pub fn failed(result: &CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    result
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default()
}
