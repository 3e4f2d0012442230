//! MCP's Streamable HTTP transport for `paddock serve` (`/mcp`): rmcp's service, with both
//! protocol generations (sessions for the `initialize`-based one, stateless requests for
//! 2026-07-28), answering each request as the [`Principal`] the caller's authentication put in the
//! request's extensions.
//!
//! The DNS-rebinding guard: `Host` must name one of `allowed_hosts`, and a request carrying an
//! `Origin` is refused unless it is one of `allowed_origins` (none by default: agents are not web
//! pages). Request bodies are bounded.
//!
//! What it does not do: authenticate (the caller's layer does, before this service runs), or
//! bound the number of sessions (each needs a valid key; idle ones end after five minutes).

use paddock_control::{Principal, SandboxService};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::{McpSettings, PaddockMcp};

/// The largest request body `/mcp` reads (a `file_write` of a few MiB fits).
pub const MAX_REQUEST_BYTES: usize = 8 << 20;

/// The `/mcp` service over `service`.
pub fn service(
    service: SandboxService,
    settings: McpSettings,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
) -> StreamableHttpService<PaddockMcp, LocalSessionManager> {
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(allowed_hosts)
        .with_allowed_origins(allowed_origins)
        .enforce_origin_validation()
        .with_max_request_body_bytes(MAX_REQUEST_BYTES);
    let settings = std::sync::Arc::new(settings);
    StreamableHttpService::new(
        move || Ok(PaddockMcp::per_request(service.clone(), settings.clone())),
        LocalSessionManager::default().into(),
        config,
    )
}

/// Marks `principal` as the caller of an `/mcp` request (the authentication layer's part).
pub fn authenticate<B>(request: &mut http::Request<B>, principal: Principal) {
    request.extensions_mut().insert(principal);
}
