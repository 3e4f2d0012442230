//! Health, metrics, the OpenAPI document and the template list.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use paddock_control::SandboxService;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{ApiError, Auth};

/// `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct HealthBody {
    /// Always `ok` while the server answers.
    pub status: String,
}

/// The Prometheus text exposition format.
const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Liveness: the server answers. Needs no key.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "meta",
    security(()),
    responses((status = 200, description = "The server is up", body = HealthBody))
)]
pub(crate) async fn healthz() -> Json<HealthBody> {
    Json(HealthBody {
        status: "ok".to_owned(),
    })
}

/// Metrics in the Prometheus text format (admin keys).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "meta",
    responses(
        (status = 200, description = "Prometheus text exposition", body = String,
            content_type = "text/plain; version=0.0.4"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn metrics(
    Auth(p): Auth,
    State(service): State<SandboxService>,
) -> Result<Response, ApiError> {
    let text = service.render_metrics(&p)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(METRICS_CONTENT_TYPE),
        )],
        text,
    )
        .into_response())
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "meta",
    responses(
        (status = 200, description = "The OpenAPI document", body = Object, content_type = "application/json"),
        (status = "4XX", response = ApiError),
    )
)]
pub(crate) async fn openapi_json(_auth: Auth) -> Response {
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        crate::router::openapi_text(),
    )
        .into_response()
}
