//! Snapshots, forks, step transactions (checkpoint / rollback / commit), pause, stop and resume.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use paddock_control::SandboxService;
use paddock_types::api::{
    CreateSnapshotRequest, DiffQuery, DiffResult, ForkRequest, ForkResult, ListSnapshotsQuery,
    RollbackRequest, SandboxInfo, SnapshotInfo, SnapshotList,
};

use crate::{ApiError, ApiJson, ApiQuery, Auth, OptionalJson, SandboxPath, SnapshotPath};

/// Takes a snapshot of a sandbox's files (its processes frozen for the instant; memory is not
/// captured).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/snapshots",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = CreateSnapshotRequest,
    responses(
        (status = 201, description = "The new snapshot", body = SnapshotInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn create_snapshot(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    OptionalJson(req): OptionalJson<CreateSnapshotRequest>,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(service.create_snapshot(&p, &id, req).await?),
    ))
}

/// Lists the caller's snapshots.
#[utoipa::path(
    get,
    path = "/v1/snapshots",
    tag = "snapshots",
    params(ListSnapshotsQuery),
    responses(
        (status = 200, description = "A page of snapshots", body = SnapshotList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_snapshots(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiQuery(q): ApiQuery<ListSnapshotsQuery>,
) -> Result<Json<SnapshotList>, ApiError> {
    Ok(Json(service.list_snapshots(&p, q).await?))
}

/// One snapshot, with the bytes it holds.
#[utoipa::path(
    get,
    path = "/v1/snapshots/{snapshot_id}",
    tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 200, description = "The snapshot", body = SnapshotInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_snapshot(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SnapshotPath(snapshot_id): SnapshotPath,
) -> Result<Json<SnapshotInfo>, ApiError> {
    Ok(Json(service.get_snapshot(&p, &snapshot_id).await?))
}

/// Deletes a snapshot.
#[utoipa::path(
    delete,
    path = "/v1/snapshots/{snapshot_id}",
    tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn delete_snapshot(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SnapshotPath(snapshot_id): SnapshotPath,
) -> Result<StatusCode, ApiError> {
    service.delete_snapshot(&p, &snapshot_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Forks a sandbox into `count` new sandboxes whose files start as copies of its own.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/fork",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "The copies", body = ForkResult),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn fork_sandbox(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<ForkRequest>,
) -> Result<(StatusCode, Json<ForkResult>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(service.fork_sandbox(&p, &id, req).await?),
    ))
}

/// Takes a checkpoint: return to it with `rollback`, drop it with `commit`.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/checkpoint",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 201, description = "The checkpoint", body = SnapshotInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn checkpoint(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    Ok((StatusCode::CREATED, Json(service.checkpoint(&p, &id).await?)))
}

/// Drops the newest checkpoint, keeping what was done since.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/commit",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The dropped checkpoint", body = SnapshotInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn commit(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SnapshotInfo>, ApiError> {
    Ok(Json(service.commit(&p, &id).await?))
}

/// Returns the sandbox's files to a snapshot of it (the newest checkpoint by default, consumed);
/// its processes restart, its id stays.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/rollback",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RollbackRequest,
    responses(
        (status = 200, description = "The sandbox, restarted", body = SandboxInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn rollback(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    OptionalJson(req): OptionalJson<RollbackRequest>,
) -> Result<Json<SandboxInfo>, ApiError> {
    Ok(Json(service.rollback(&p, &id, req).await?))
}

/// Freezes every process of the sandbox (no CPU used, memory kept).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/pause",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox, paused", body = SandboxInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn pause_sandbox(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxInfo>, ApiError> {
    Ok(Json(service.pause_sandbox(&p, &id).await?))
}

/// Stops a sandbox: its processes end, its files are kept (also across server restarts) until it is
/// resumed or deleted. A stopped sandbox does not count against the tenant's quota and does not
/// expire.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/stop",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox, stopped", body = SandboxInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn stop_sandbox(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxInfo>, ApiError> {
    Ok(Json(service.stop_sandbox(&p, &id).await?))
}

/// Thaws a paused sandbox, or starts a stopped one again on its files (same id; its processes start
/// afresh: memory is never kept across a stop). A timeout that paused or stopped it starts again.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/resume",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox, running", body = SandboxInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn resume_sandbox(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxInfo>, ApiError> {
    Ok(Json(service.resume_sandbox(&p, &id).await?))
}

/// What changed in the sandbox's files since one of its snapshots (the newest checkpoint by default).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/diff",
    tag = "snapshots",
    params(("id" = String, Path, description = "Sandbox id"), DiffQuery),
    responses(
        (status = 200, description = "Changed paths", body = DiffResult),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn diff_sandbox(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<DiffQuery>,
) -> Result<Json<DiffResult>, ApiError> {
    Ok(Json(service.diff_sandbox(&p, &id, q).await?))
}
