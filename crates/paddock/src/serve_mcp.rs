//! `/mcp` on `paddock serve`: the MCP front-end over Streamable HTTP, behind the API's own
//! authentication (`Authorization: Bearer <key>` or `X-API-Key`, refused with the API's JSON
//! error before rmcp reads anything), so every tool call acts as its request's key.
//!
//! What it does not do: the tools (`paddock-mcp`), or configure which other host names and
//! browser origins may call it (loopback names and the listen address only, no origin).

use std::net::SocketAddr;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use paddock_api::Auth;
use paddock_control::SandboxService;

/// The `/mcp` route of a server listening on `listen`.
pub fn router(service: SandboxService, listen: SocketAddr) -> Router {
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
        hosts.push(listen.ip().to_string());
    }
    let settings = paddock_mcp::McpSettings {
        public_url: Some(format!("http://{listen}")),
        port_domain: None,
    };
    let mcp = paddock_mcp::endpoint::service(service.clone(), settings, hosts, Vec::new());
    Router::new()
        .route_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(service, authenticate))
}

async fn authenticate(
    State(_service): State<SandboxService>,
    Auth(principal): Auth,
    mut request: Request,
    next: Next,
) -> Response {
    paddock_mcp::endpoint::authenticate(&mut request, principal);
    next.run(request).await
}
