//! MCP's Streamable HTTP transport for `paddock serve` (`/mcp`): rmcp's service, with both
//! protocol generations (sessions for the `initialize`-based one, stateless requests for
//! 2026-07-28), answering each request as the [`Principal`] the caller's authentication put in the
//! request's extensions.
//!
//! The DNS-rebinding guard: `Host` must name one of `allowed_hosts`, and a request carrying an
//! `Origin` is refused unless it is one of `allowed_origins` (none by default: agents are not web
//! pages). Request bodies are bounded.
//!
//! Sessions are bounded ([`BoundedSessions`]); each needs a valid key, and idle ones end after five
//! minutes.
//!
//! What it does not do: authenticate (the caller's layer does, before this service runs, and
//! refuses a new session while the bound is reached: [`opens_a_session`]).

use paddock_control::{Principal, SandboxService};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

pub use crate::sessions::BoundedSessions;
use crate::{McpSettings, PaddockMcp};

/// The largest request body `/mcp` reads (a `file_write` of a few MiB fits).
pub const MAX_REQUEST_BYTES: usize = 8 << 20;

/// Who may call `/mcp` and how many sessions it keeps.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// `Host` values answered (any other is refused).
    pub allowed_hosts: Vec<String>,
    /// `Origin` values allowed (a request with any other is refused; none without one).
    pub allowed_origins: Vec<String>,
    /// Sessions of the `initialize`-based generation open at once.
    pub max_sessions: usize,
}

/// The `/mcp` service over `service`, and its sessions (for the caller's layer to check
/// [`BoundedSessions::full`]).
pub fn service(
    service: SandboxService,
    settings: McpSettings,
    endpoint: EndpointConfig,
) -> (
    StreamableHttpService<PaddockMcp, BoundedSessions>,
    std::sync::Arc<BoundedSessions>,
) {
    let config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(endpoint.allowed_hosts)
        .with_allowed_origins(endpoint.allowed_origins)
        .enforce_origin_validation()
        .with_max_request_body_bytes(MAX_REQUEST_BYTES);
    let settings = std::sync::Arc::new(settings);
    let sessions = BoundedSessions::new(endpoint.max_sessions);
    let mcp = StreamableHttpService::new(
        move || Ok(PaddockMcp::per_request(service.clone(), settings.clone())),
        sessions.clone(),
        config,
    );
    (mcp, sessions)
}

/// Whether `request` would open a session of the `initialize`-based generation: a POST that names
/// no session and is not of the stateless generation (whose requests all carry `Mcp-Method`).
pub fn opens_a_session<B>(request: &http::Request<B>) -> bool {
    request.method() == http::Method::POST
        && !request.headers().contains_key("mcp-session-id")
        && !request.headers().contains_key("mcp-method")
}

/// Marks `principal` as the caller of an `/mcp` request (the authentication layer's part).
pub fn authenticate<B>(request: &mut http::Request<B>, principal: Principal) {
    request.extensions_mut().insert(principal);
}
