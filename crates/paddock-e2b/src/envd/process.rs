//! (being written)

use axum::Router;

use crate::E2bState;

/// The process service's routes.
pub fn routes() -> Router<E2bState> {
    Router::new()
}
