//! E2B's control-plane REST API (`/sandboxes`, `/v2/sandboxes`, `/snapshots`, `/templates`), as the
//! SDKs of 2.45.x and 2.6x call it, translated onto the service. Authorised by `X-API-KEY`.

use axum::Router;

use crate::E2bState;

/// The control plane's routes.
pub fn router(state: E2bState) -> Router {
    Router::new().with_state(state)
}
