//! Code: cells run in a sandbox's code contexts (kernels that keep state), and the contexts.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use paddock_control::SandboxService;
use paddock_types::api::{
    CodeEvent, CodeRunResult, ContextInfo, ContextList, CreateContextRequest, RunCodeRequest,
};

use crate::negotiate::{negotiate, StreamFormat};
use crate::stream::event_stream_response;
use crate::{ApiError, ApiJson, Auth, ContextPath, OptionalJson, SandboxPath};

/// Runs a cell of code.
///
/// In `context`, or in the default context of `language` (`python` when neither is given; made at
/// the first cell). Cells of one context run one at a time, contexts side by side. The response
/// streams the cell's events as they happen: NDJSON (one `CodeEvent` per line) by default,
/// Server-Sent Events for `Accept: text/event-stream`; or, for `Accept: application/json`, waits for
/// the end and returns the collected cell (at most 16 MiB of output; `dropped_bytes` counts the
/// rest). Closing the connection before the end interrupts the cell.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/code",
    tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RunCodeRequest,
    responses(
        (status = 200, description = "The cell's events, or its collected result", content(
            (CodeEvent = "application/x-ndjson"),
            (CodeEvent = "text/event-stream"),
            (CodeRunResult = "application/json"),
        )),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn run_code(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    headers: HeaderMap,
    ApiJson(req): ApiJson<RunCodeRequest>,
) -> Result<Response, ApiError> {
    let stream = service.run_code(&p, &id, req).await?;
    Ok(
        match negotiate(
            &headers,
            &[StreamFormat::Ndjson, StreamFormat::Sse, StreamFormat::Json],
        ) {
            StreamFormat::Json => collected_cell(stream.collect().await),
            format => event_stream_response(stream, format),
        },
    )
}

/// One JSON document; the collected-output budget the cell holds is given back once the body is
/// sent or dropped.
fn collected_cell(cell: paddock_control::CollectedCell) -> Response {
    let (json, held) = cell.into_json();
    let body = futures_util::stream::once(async move {
        let _ = &held;
        Ok::<_, std::convert::Infallible>(bytes::Bytes::from(json))
    });
    (
        StatusCode::OK,
        [(
            axum::http::header::CONTENT_TYPE,
            axum::http::HeaderValue::from_static("application/json"),
        )],
        Body::from_stream(body),
    )
        .into_response()
}

/// Creates a code context: a new kernel with its own state.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/contexts",
    tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateContextRequest,
    responses(
        (status = 201, description = "Its kernel runs", body = ContextInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn create_context(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    OptionalJson(req): OptionalJson<CreateContextRequest>,
) -> Result<(StatusCode, Json<ContextInfo>), ApiError> {
    let info = service.create_context(&p, &id, req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// The sandbox's code contexts.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/contexts",
    tag = "code",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Oldest first", body = ContextList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_contexts(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<ContextList>, ApiError> {
    Ok(Json(service.list_contexts(&p, &id).await?))
}

/// Restarts a context: a new kernel (its state is gone; its id and settings stay).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/contexts/{context}/restart",
    tag = "code",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("context" = String, Path, description = "Context id"),
    ),
    responses(
        (status = 200, description = "Its new kernel runs", body = ContextInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn restart_context(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ContextPath(id, context): ContextPath,
) -> Result<Json<ContextInfo>, ApiError> {
    Ok(Json(service.restart_context(&p, &id, &context).await?))
}

/// Removes a context and stops its kernel.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/contexts/{context}",
    tag = "code",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("context" = String, Path, description = "Context id"),
    ),
    responses(
        (status = 204, description = "Removed"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn delete_context(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ContextPath(id, context): ContextPath,
) -> Result<StatusCode, ApiError> {
    service.delete_context(&p, &id, &context).await?;
    Ok(StatusCode::NO_CONTENT)
}
