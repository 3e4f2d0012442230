//! The control plane's extractors: the caller (by `X-API-KEY`) and a JSON body, each refusing with
//! E2B's error shape.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use paddock_control::Principal;
use serde::de::DeserializeOwned;

use crate::{E2bError, E2bState};

/// The header E2B's SDKs send their key in.
pub const API_KEY_HEADER: &str = "x-api-key";
/// The largest control-plane body read (a create with metadata and env vars fits many times over).
const BODY_LIMIT: usize = 1 << 20;

/// The caller, authenticated by its API key (either spelling of a paddock key).
#[derive(Debug)]
pub struct Caller(pub Principal);

impl FromRequestParts<E2bState> for Caller {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, state: &E2bState) -> Result<Self, Self::Rejection> {
        let key = parts
            .headers
            .get(API_KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| {
                parts
                    .headers
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
                    .map(str::to_owned)
            });
        let Some(key) = key else {
            return Err(E2bError::new(
                StatusCode::UNAUTHORIZED,
                "missing API key: send it in the X-API-KEY header",
            ));
        };
        state
            .service
            .authenticate(key.trim())
            .await
            .map(Caller)
            .map_err(|e| E2bError::new(StatusCode::UNAUTHORIZED, e.message))
    }
}

/// A JSON body; an empty body reads as `{}` (the SDKs send none to some routes).
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<E2bState> for JsonBody<T> {
    type Rejection = E2bError;

    async fn from_request(req: Request, state: &E2bState) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|e| E2bError::bad_request(format!("failed to read the request body: {e}")))?;
        if bytes.len() > BODY_LIMIT {
            return Err(E2bError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over {BODY_LIMIT} bytes"),
            ));
        }
        let text: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &bytes
        };
        serde_json::from_slice(text)
            .map(JsonBody)
            .map_err(|e| E2bError::bad_request(format!("invalid request body: {e}")))
    }
}
