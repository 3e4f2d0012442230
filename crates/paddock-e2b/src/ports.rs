//! Traffic to a sandbox's own ports (anything but envd's), proxied into the sandbox's network
//! namespace: HTTP/1.1 requests, and upgrades (WebSockets) piped both ways after the `101`.
//!
//! Access follows E2B: a sandbox's ports are public unless it was created private
//! (`allowPublicTraffic: false`, paddock's `public_ports: false`); then the request must carry the
//! sandbox's traffic access token in `E2B-Traffic-Access-Token`. A sandbox that is missing, ended,
//! paused or still in a warm pool answers 502 "The sandbox was not found" whatever the token, so a
//! request learns nothing more than a missing sandbox tells. The connection itself is the
//! service's `connect_port` under the sandbox tenant's principal (`e2b-traffic-token` or
//! `e2b-public` as its key id), so caps and audit rows are those of every other door.
//!
//! Connections are kept alive between requests ([`paddock_proxy::Pool`]), each for requests to
//! the same sandbox and port under the same kind of credential (so a connection's audit row names
//! who uses it); every request is still checked (the sandbox live and not paused, the token) before
//! one is used. An upgrade gets a connection of its own. The token, and the routing headers, never
//! reach the sandbox.

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use paddock_control::ServiceError;
use paddock_control::{PortDoor, Principal};
use paddock_proxy::{Forward, ForwardError, PooledError};
use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;

use crate::tokens::TokenKind;
use crate::{E2bState, ProxyError, SandboxTarget, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER};

/// What an idle connection to a sandbox's port is kept for: the sandbox, the port and the
/// credential kind the connection was opened under.
pub type PoolKey = (String, u16, &'static str);

/// The header carrying the traffic access token.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Fields that are for this proxy, not for the sandbox's server.
const STRIP: &[&str] = &[
    TRAFFIC_TOKEN_HEADER,
    SANDBOX_ID_HEADER,
    SANDBOX_PORT_HEADER,
    crate::envd::ACCESS_TOKEN_HEADER,
];

/// Who may use sandbox `id`'s ports by `headers` (see the module docs): the key id its audit rows
/// name (`e2b-traffic-token` or `e2b-public`) and a principal of its tenant, or the refusal
/// (502 for a sandbox that cannot be served, 401 for a private one without its
/// traffic token).
pub(crate) fn port_caller(
    state: &E2bState,
    id: &SandboxId,
    headers: &HeaderMap,
) -> Result<(&'static str, Principal), ProxyError> {
    let not_found = || ProxyError::NotFound {
        sandbox_id: id.as_str().to_owned(),
    };
    let public = state
        .service
        .live_sandbox_ports_public(id)
        .ok_or_else(not_found)?;
    let token_ok = headers
        .get(TRAFFIC_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| state.config.token_key.verify(TokenKind::Traffic, id, t));
    if !public && !token_ok {
        return Err(ProxyError::Unauthorized {
            header: "E2B-Traffic-Access-Token",
        });
    }
    let via = if token_ok {
        "e2b-traffic-token"
    } else {
        "e2b-public"
    };
    let principal = state
        .service
        .live_sandbox_principal(id, via)
        .ok_or_else(not_found)?;
    Ok((via, principal))
}

/// Proxies `req` to `target`'s port.
pub async fn proxy(state: &E2bState, target: SandboxTarget, req: Request<Body>) -> Response {
    let id = target.id;
    let (via, principal) = match port_caller(state, &id, req.headers()) {
        Ok(caller) => caller,
        Err(refusal) => return refusal.into_response(),
    };
    let fwd = Forward {
        client: req
            .extensions()
            .get::<ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0),
        proto: "http",
        host: None,
        path_and_query: None,
        strip: STRIP,
    };
    let key: PoolKey = (id.as_str().to_owned(), target.port, via);
    let connect = || {
        state
            .service
            .connect_port(&principal, &id, target.port, PortDoor::E2b)
    };
    match paddock_proxy::forward_pooled(req, &state.ports_pool, key, connect, &fwd).await {
        Ok(resp) => resp.map(Body::new),
        Err(PooledError::Connect(e)) => connect_error(&id, target.port, e),
        Err(PooledError::Forward(ForwardError::BadRequest(status, message))) => {
            ProxyError::Refused { status, message }.into_response()
        }
        Err(PooledError::Forward(e @ ForwardError::Upstream(_))) => ProxyError::Unreachable {
            sandbox_id: id.as_str().to_owned(),
            message: e.to_string(),
        }
        .into_response(),
    }
}

/// E2B's answer for a connection the service did not open.
fn connect_error(id: &paddock_types::SandboxId, port: u16, e: ServiceError) -> Response {
    match e.code {
        ErrorCode::PortClosed => ProxyError::PortClosed {
            sandbox_id: id.as_str().to_owned(),
            port,
        }
        .into_response(),
        ErrorCode::SandboxNotFound | ErrorCode::SandboxNotRunning | ErrorCode::SandboxRecovering => {
            ProxyError::NotFound {
                sandbox_id: id.as_str().to_owned(),
            }
            .into_response()
        }
        ErrorCode::QuotaExceeded | ErrorCode::Unavailable => ProxyError::Refused {
            status: StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            message: e.message,
        }
        .into_response(),
        _ => ProxyError::Unreachable {
            sandbox_id: id.as_str().to_owned(),
            message: e.message,
        }
        .into_response(),
    }
}
