//! Traffic to a sandbox's own ports (anything but envd's): proxied into the sandbox's network
//! namespace. (Being written.)

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};

use crate::{E2bState, ProxyError, SandboxTarget};

/// Proxies `req` to `target`'s port.
pub async fn proxy(state: &E2bState, target: SandboxTarget, req: Request<Body>) -> Response {
    let _ = (state, req);
    ProxyError::PortClosed {
        sandbox_id: target.id.as_str().to_owned(),
        port: target.port,
    }
    .into_response()
}
