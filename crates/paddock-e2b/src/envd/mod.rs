//! envd's protocol (port 49983 of a sandbox), answered by paddock from the service instead of by a
//! daemon inside the sandbox: the agent stays one binary speaking one protocol, and every envd call
//! becomes the same service call (tenant, audit row, limits) as its `/v1` twin.
//!
//! - `GET /health`: 204 while the sandbox runs (the SDK's `is_running`);
//! - Connect-RPC `process.Process/*` and `filesystem.Filesystem/*` ([`connect`], [`process`],
//!   [`filesystem`]);
//! - plain HTTP `GET/POST /files` and `GET /envs` ([`files`]).
//!
//! Every request is authorised by the sandbox's envd access token (`X-Access-Token`), except
//! `/health` and the `/files` requests that carry a valid URL signature instead ([`EnvdCaller`]).
//! A sandbox that is missing, ended, paused or another tenant's is answered as E2B's proxy does (502
//! "The sandbox was not found"), whatever the token.

pub mod connect;
pub mod files;
pub mod filesystem;
pub mod process;
pub mod proto;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use paddock_control::Principal;
use paddock_types::SandboxId;

use crate::tokens::TokenKind;
use crate::{E2bState, ProxyError, SandboxTarget};

/// The header carrying the envd access token.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// The key id envd calls are recorded under in audit rows (they carry no API key).
pub const ENVD_KEY_ID: &str = "e2b-envd-token";

/// envd's routes (the front-end has already put the request's [`SandboxTarget`] in its extensions).
pub fn router(state: E2bState) -> Router {
    Router::new()
        .route("/health", get(health))
        .merge(process::routes())
        .merge(filesystem::routes())
        .merge(files::routes())
        .fallback(not_found)
        .with_state(state)
}

async fn not_found(uri: axum::http::Uri) -> Response {
    if connect::looks_like_rpc(uri.path()) {
        return connect::unknown_rpc(uri.path());
    }
    crate::ConnectError::new(crate::ConnectCode::NotFound, "no such envd endpoint").into_response()
}

/// `GET /health`: 204 while the sandbox runs (no token needed, as in E2B; it says nothing more
/// than the 502 a gone sandbox gets).
async fn health(caller: SandboxOnly) -> StatusCode {
    let _ = caller;
    StatusCode::NO_CONTENT
}

/// The sandbox an envd request is for, running and owned, without checking the access token (for
/// `/health` and for `/files`, which check a signature when the token is absent).
#[derive(Debug)]
pub struct SandboxOnly {
    /// The sandbox.
    pub id: SandboxId,
    /// A principal of its tenant.
    pub principal: Principal,
    /// The `X-Access-Token` the request carried, if it was the right one.
    pub token_ok: bool,
    /// The sandbox's envd token (for checking signatures).
    pub envd_token: String,
}

impl FromRequestParts<E2bState> for SandboxOnly {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &E2bState) -> Result<Self, Self::Rejection> {
        let target = parts
            .extensions
            .get::<SandboxTarget>()
            .cloned()
            .ok_or_else(|| ProxyError::BadRequest("no sandbox named".into()).into_response())?;
        let principal = state
            .service
            .live_sandbox_principal(&target.id, ENVD_KEY_ID)
            .ok_or_else(|| {
                ProxyError::NotFound {
                    sandbox_id: target.id.as_str().to_owned(),
                }
                .into_response()
            })?;
        let envd_token = state.config.token_key.token(TokenKind::Envd, &target.id);
        let token_ok = parts
            .headers
            .get(ACCESS_TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| state.config.token_key.verify(TokenKind::Envd, &target.id, t));
        Ok(Self {
            id: target.id,
            principal,
            token_ok,
            envd_token,
        })
    }
}

/// An envd request authorised by the sandbox's access token: the sandbox and a principal of its
/// tenant. A missing or wrong token answers 401 as envd does.
#[derive(Debug)]
pub struct EnvdCaller {
    /// The sandbox.
    pub id: SandboxId,
    /// A principal of its tenant.
    pub principal: Principal,
}

impl FromRequestParts<E2bState> for EnvdCaller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &E2bState) -> Result<Self, Self::Rejection> {
        let s = SandboxOnly::from_request_parts(parts, state).await?;
        if !s.token_ok {
            return Err(unauthorized());
        }
        Ok(Self {
            id: s.id,
            principal: s.principal,
        })
    }
}

/// envd's answer to a request without the right access token.
pub fn unauthorized() -> Response {
    let body = serde_json::json!({
        "code": 401,
        "message": "unauthorized access, please provide a valid access token or method signing if supported",
    });
    (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response()
}
