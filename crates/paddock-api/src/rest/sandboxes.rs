//! Sandbox lifecycle: create, get, list, kill, timeout, usage.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use paddock_control::SandboxService;
use paddock_types::api::{
    CreateSandboxRequest, ListSandboxesQuery, SandboxInfo, SandboxList, SandboxUsageBody, SetTimeoutRequest,
};

use crate::{ApiError, ApiJson, ApiQuery, Auth, SandboxPath};

/// Creates a sandbox.
#[utoipa::path(
    post,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "The new sandbox, running", body = SandboxInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn create_sandbox(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiJson(req): ApiJson<CreateSandboxRequest>,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    let info = service.create_sandbox(&p, req).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// Lists the caller's sandboxes.
#[utoipa::path(
    get,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    params(ListSandboxesQuery),
    responses(
        (status = 200, description = "A page of sandboxes", body = SandboxList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_sandboxes(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiQuery(q): ApiQuery<ListSandboxesQuery>,
) -> Result<Json<SandboxList>, ApiError> {
    Ok(Json(service.list_sandboxes(&p, q).await?))
}

/// One sandbox.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox", body = SandboxInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_sandbox(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxInfo>, ApiError> {
    Ok(Json(service.get_sandbox(&p, &id).await?))
}

/// Kills a sandbox and removes everything of it.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 204, description = "Killed"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn kill_sandbox(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<StatusCode, ApiError> {
    service.kill_sandbox(&p, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sets the sandbox to expire `timeout_secs` from now.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/timeout",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetTimeoutRequest,
    responses(
        (status = 200, description = "The sandbox with its new expiry", body = SandboxInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn set_timeout(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<SetTimeoutRequest>,
) -> Result<Json<SandboxInfo>, ApiError> {
    Ok(Json(service.set_timeout(&p, &id, req).await?))
}

/// What the sandbox uses right now.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/usage",
    tag = "sandboxes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Current usage", body = SandboxUsageBody),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn sandbox_usage(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxUsageBody>, ApiError> {
    Ok(Json(service.sandbox_usage(&p, &id).await?))
}
