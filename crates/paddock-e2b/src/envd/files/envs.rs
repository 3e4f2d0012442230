//! `GET /envs`: the sandbox's environment variables with their values, as envd answers the code
//! interpreter (which forwards the SDK's `X-Access-Token` to it). Needs the token: no signature
//! opens it.
//!
//! It shows nothing a holder of the token could not see by running `env` in the sandbox, and no
//! secret's value (secret variables hold placeholders). It does not include the variables a
//! process gets from its own request or from its shell (`PATH`, `HOME`).

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::FilesError;
use crate::envd::EnvdCaller;
use crate::E2bState;

/// `GET /envs`.
pub async fn get_envs(State(state): State<E2bState>, caller: EnvdCaller) -> Response {
    match state.service.sandbox_env(&caller.principal, &caller.id).await {
        Ok(env) => {
            let mut resp = Json(env).into_response();
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            resp
        }
        Err(e) => FilesError::from_service(e, &caller.id, "").into_response(),
    }
}
