//! One listener, three doors: [`front`] sends each request to sandbox traffic, E2B's control plane
//! or the `/v1` router. The choice depends on headers, host and path only, never on a lookup.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use paddock_control::SandboxService;
use tower::ServiceExt as _;

use crate::target::{sandbox_target, TargetError};
use crate::{control, envd, E2bConfig, E2bState, ProxyError, ENVD_PORT};

/// Paths of E2B's control plane (none of them is a `/v1` path). The ones paddock does not serve
/// (template builds, secrets, volumes, teams) are listed too, so they answer in E2B's error shape.
const CONTROL_PREFIXES: [&str; 9] = [
    "/sandboxes",
    "/v2/sandboxes",
    "/snapshots",
    "/templates",
    "/v2/templates",
    "/v3/templates",
    "/secrets",
    "/volumes",
    "/teams",
];

#[derive(Clone)]
struct Doors {
    state: E2bState,
    v1: Router,
    control: Router,
    envd: Router,
    interpreter: Router,
}

/// The router of the whole listener: sandbox traffic (by `E2b-Sandbox-Id` or a per-sandbox host),
/// then E2B's control-plane paths, then `v1` for everything else.
pub fn front(service: SandboxService, v1: Router, config: E2bConfig) -> Router {
    front_with(E2bState::new(service, config), v1)
}

/// [`front`] over a state the caller made (and may watch: its pool of port connections).
pub fn front_with(state: E2bState, v1: Router) -> Router {
    let doors = Doors {
        control: control::router(state.clone()),
        envd: envd::router(state.clone()),
        interpreter: crate::interpreter::router(state.clone()),
        state,
        v1,
    };
    Router::new().fallback(dispatch).with_state(Arc::new(doors))
}

async fn dispatch(State(doors): State<Arc<Doors>>, req: Request<Body>) -> Response {
    match sandbox_target(req.headers(), doors.state.config.domain.as_deref()) {
        Some(Ok(target)) if target.port == ENVD_PORT => {
            let mut req = req;
            req.extensions_mut().insert(target);
            oneshot(doors.envd.clone(), req).await
        }
        Some(Ok(target)) if target.port == crate::interpreter::INTERPRETER_PORT => {
            let mut req = req;
            req.extensions_mut().insert(target);
            oneshot(doors.interpreter.clone(), req).await
        }
        Some(Ok(target)) => crate::ports::proxy(&doors.state, target, req).await,
        Some(Err(TargetError::BadId(id))) => ProxyError::NotFound { sandbox_id: id }.into_response(),
        Some(Err(TargetError::BadPort(p))) => {
            ProxyError::BadRequest(format!("{p:?} is not a port")).into_response()
        }
        None => {
            let path = req.uri().path();
            let is_control = CONTROL_PREFIXES
                .iter()
                .any(|p| path == *p || path.strip_prefix(p).is_some_and(|rest| rest.starts_with('/')));
            if is_control {
                oneshot(doors.control.clone(), req).await
            } else {
                oneshot(doors.v1.clone(), req).await
            }
        }
    }
}

async fn oneshot(router: Router, req: Request<Body>) -> Response {
    match router.oneshot(req).await {
        Ok(resp) => resp,
        Err(never) => match never {},
    }
}
