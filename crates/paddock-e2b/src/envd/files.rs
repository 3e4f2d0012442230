//! (being written)

use axum::Router;

use crate::E2bState;

/// The `/files` and `/envs`'s routes.
pub fn routes() -> Router<E2bState> {
    Router::new()
}
