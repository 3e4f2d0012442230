//! `/mcp` on `paddock serve`: the MCP front-end over Streamable HTTP, behind the API's own
//! authentication (`Authorization: Bearer <key>` or `X-API-Key`, refused with the API's JSON
//! error before rmcp reads anything), so every tool call acts as its request's key. A request
//! that would open a session while `[mcp] max_sessions` are open is refused with 503
//! `unavailable`.
//!
//! Host names answered: the loopback names, the listen address and `[mcp] allowed_hosts`; browser
//! origins: the server's own on loopback (`http://127.0.0.1:<port>`, ...) and `[mcp]
//! allowed_origins`. The URL tools hand out is `[mcp] public_url`, else
//! `http://<listen address>` (loopback when it listens on every address); a port's own host
//! name uses `[e2b] domain` when the E2B front-end serves one.
//!
//! What it does not do: the tools (`paddock-mcp`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{FromRef, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use paddock_api::{ApiError, Auth};
use paddock_control::SandboxService;
use paddock_mcp::endpoint::{BoundedSessions, EndpointConfig};
use paddock_types::api::ErrorCode;

use crate::serve_config::ServeConfig;

/// The `/mcp` route of a server configured by `config`, listening on `listen`.
pub fn router(service: SandboxService, config: &ServeConfig, listen: SocketAddr) -> Router {
    let settings = &config.mcp;
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    if !listen.ip().is_unspecified() && !listen.ip().is_loopback() {
        hosts.push(listen.ip().to_string());
    }
    hosts.extend(settings.allowed_hosts.iter().cloned());
    let public_url = settings.public_url.clone().unwrap_or_else(|| {
        let mut reachable = listen;
        if listen.ip().is_unspecified() {
            reachable.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        format!("http://{reachable}")
    });
    let tools = paddock_mcp::McpSettings {
        public_url: Some(public_url.trim_end_matches('/').to_owned()),
        port_domain: config.e2b.enabled.then(|| config.e2b.domain.clone()).flatten(),
    };
    // A page of the server's own origin (a console it may serve) is no rebinding attack.
    let mut origins: Vec<String> = ["127.0.0.1".to_owned(), "localhost".to_owned(), "[::1]".to_owned()]
        .iter()
        .map(|host| format!("http://{host}:{}", listen.port()))
        .collect();
    origins.extend(settings.allowed_origins.iter().cloned());
    let endpoint = EndpointConfig {
        allowed_hosts: hosts,
        allowed_origins: origins,
        max_sessions: settings.max_sessions,
    };
    let (mcp, sessions) = paddock_mcp::endpoint::service(service.clone(), tools, endpoint);
    let state = Gate { service, sessions };
    Router::new()
        .route_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(state, authenticate))
}

/// What the layer in front of `/mcp` checks with: the service (keys) and the sessions.
#[derive(Clone)]
struct Gate {
    service: SandboxService,
    sessions: Arc<BoundedSessions>,
}

impl FromRef<Gate> for SandboxService {
    fn from_ref(gate: &Gate) -> Self {
        gate.service.clone()
    }
}

async fn authenticate(
    State(Gate { sessions, .. }): State<Gate>,
    Auth(principal): Auth,
    mut request: Request,
    next: Next,
) -> Response {
    if paddock_mcp::endpoint::opens_a_session(&request) && sessions.full().await {
        return ApiError::new(
            ErrorCode::Unavailable,
            "the server keeps as many MCP sessions as it may ([mcp] max_sessions): close one, or use \
             the stateless protocol (2026-07-28)",
        )
        .into_response();
    }
    paddock_mcp::endpoint::authenticate(&mut request, principal);
    next.run(request).await
}
