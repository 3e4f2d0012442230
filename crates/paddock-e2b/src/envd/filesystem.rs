//! (being written)

use axum::Router;

use crate::E2bState;

/// The filesystem service's routes.
pub fn routes() -> Router<E2bState> {
    Router::new()
}
