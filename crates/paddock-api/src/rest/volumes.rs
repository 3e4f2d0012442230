//! Named volumes: persistent storage that outlives sandboxes and is mounted into several of them
//! (`CreateSandboxRequest.volumes`).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use paddock_control::SandboxService;
use paddock_types::api::{CreateVolumeRequest, ListVolumesQuery, VolumeInfo, VolumeList};

use crate::{ApiError, ApiJson, ApiPath, ApiQuery, Auth};

/// Creates an empty named volume. Mount it into sandboxes with `CreateSandboxRequest.volumes`; every
/// sandbox mounting it sees the same files (shared, never copied), and it outlives them all.
/// Snapshots, rollbacks and diffs of a sandbox leave its volumes out.
#[utoipa::path(
    post,
    path = "/v1/volumes",
    tag = "volumes",
    request_body = CreateVolumeRequest,
    responses(
        (status = 201, description = "The new volume", body = VolumeInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn create_volume(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiJson(req): ApiJson<CreateVolumeRequest>,
) -> Result<(StatusCode, Json<VolumeInfo>), ApiError> {
    Ok((StatusCode::CREATED, Json(service.create_volume(&p, req).await?)))
}

/// Lists the caller's volumes.
#[utoipa::path(
    get,
    path = "/v1/volumes",
    tag = "volumes",
    params(ListVolumesQuery),
    responses(
        (status = 200, description = "A page of volumes", body = VolumeList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_volumes(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiQuery(q): ApiQuery<ListVolumesQuery>,
) -> Result<Json<VolumeList>, ApiError> {
    Ok(Json(service.list_volumes(&p, q).await?))
}

/// One volume, by id or name, with the bytes it holds and the live sandboxes mounting it.
#[utoipa::path(
    get,
    path = "/v1/volumes/{volume_id}",
    tag = "volumes",
    params(("volume_id" = String, Path, description = "Volume id or name")),
    responses(
        (status = 200, description = "The volume", body = VolumeInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_volume(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(volume_id): ApiPath<String>,
) -> Result<Json<VolumeInfo>, ApiError> {
    Ok(Json(service.get_volume(&p, &volume_id).await?))
}

/// Deletes a volume and frees its storage. Refused with `volume_in_use` (409) while a live sandbox
/// mounts it.
#[utoipa::path(
    delete,
    path = "/v1/volumes/{volume_id}",
    tag = "volumes",
    params(("volume_id" = String, Path, description = "Volume id or name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn delete_volume(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(volume_id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    service.delete_volume(&p, &volume_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
