//! E2B's control-plane REST API (`/sandboxes`, `/v2/sandboxes`, `/snapshots`, `/templates`), as the
//! SDKs of 2.45.x and 2.6x call it, translated onto the service. Authorised by `X-API-KEY` (a
//! paddock key in either spelling).
//!
//! It does not: serve E2B's template builds, secrets, volumes or teams (answered 404 in E2B's error
//! shape) or logs (501; COMPATIBILITY.md lists each), keep any state of its own, or decide anything
//! the service decides (quotas, tenancy, limits).

mod extract;
mod list;
pub mod models;
mod sandboxes;
mod snapshots;
pub mod translate;

use axum::http::StatusCode;
use axum::routing::{delete, get, post, put};
use axum::Router;

pub use extract::API_KEY_HEADER;

use crate::{E2bError, E2bState};

/// The control plane's routes.
pub fn router(state: E2bState) -> Router {
    Router::new()
        .route("/sandboxes", post(sandboxes::create).get(list::list_v1))
        .route("/v2/sandboxes", post(sandboxes::create).get(list::list_v2))
        .route("/sandboxes/{id}", get(sandboxes::get).delete(sandboxes::kill))
        .route("/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/v2/sandboxes/{id}/connect", post(sandboxes::connect))
        .route("/sandboxes/{id}/timeout", post(sandboxes::set_timeout))
        .route("/sandboxes/{id}/pause", post(sandboxes::pause))
        .route("/sandboxes/{id}/resume", post(sandboxes::resume))
        .route("/sandboxes/{id}/metrics", get(sandboxes::metrics))
        .route("/sandboxes/{id}/network", put(sandboxes::update_network))
        .route("/sandboxes/{id}/logs", get(sandboxes::logs))
        .route("/v2/sandboxes/{id}/logs", get(sandboxes::logs))
        .route("/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/snapshots", get(snapshots::list))
        .route("/templates/{id}", delete(snapshots::delete))
        .fallback(unknown)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn unknown() -> E2bError {
    E2bError::new(
        StatusCode::NOT_FOUND,
        "no such endpoint of E2B's API is offered by paddock",
    )
}

async fn method_not_allowed() -> E2bError {
    E2bError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint",
    )
}
