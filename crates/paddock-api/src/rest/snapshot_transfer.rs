//! Export and import of snapshots as tar streams, to move a sandbox's files between hosts.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::Json;
use paddock_control::{ExportOptions, SandboxService};
use paddock_types::api::{ExportSnapshotQuery, ImportSnapshotQuery, SnapshotInfo};

use crate::rest::files::{body_stream, download};
use crate::{ApiError, ApiQuery, Auth, SnapshotPath};

/// Downloads a snapshot as a POSIX (pax) tar archive, streamed.
///
/// The archive holds the snapshot's tree (`etc/`, `home/`, `root/`, `tmp/`) with owners as the
/// sandbox sees them, permission bits, modification times, symlinks, hard links and file contents;
/// fifos, sockets and devices are left out. Setuid and setgid bits are cleared from every member
/// unless `keep_setid=true` (files the sandbox's root made are owned by uid 0 in the archive: a host
/// root unpacking it with permissions would otherwise create setuid-root programs); the
/// `snapshot.export` audit row says which, and from how many members they were cleared. A download
/// that breaks off ends with a connection error, never as a shorter archive.
#[utoipa::path(
    get,
    path = "/v1/snapshots/{snapshot_id}/export",
    tag = "snapshots",
    params(("snapshot_id" = String, Path, description = "Snapshot id"), ExportSnapshotQuery),
    responses(
        (status = 200, description = "The archive", content(("application/x-tar"))),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn export_snapshot(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SnapshotPath(snapshot_id): SnapshotPath,
    ApiQuery(q): ApiQuery<ExportSnapshotQuery>,
) -> Result<Response, ApiError> {
    let options = ExportOptions {
        keep_setid: q.keep_setid.unwrap_or(false),
    };
    let stream = service.export_snapshot(&p, &snapshot_id, options).await?;
    Ok(download("application/x-tar", None, stream))
}

/// Creates a read-only snapshot from a tar archive (the raw request body, streamed), as exports
/// write them; create sandboxes from it like from any snapshot.
///
/// The archive is checked as it is unpacked: `..` or absolute member names, members reached
/// through a symlink, hard links to anything but an earlier file of the archive, device nodes and
/// fifos, owners outside the sandbox id range (0-65535) and truncation are refused with
/// `invalid_archive`; an archive over the server's import limit with `payload_too_large`. A refused
/// archive leaves nothing behind.
#[utoipa::path(
    post,
    path = "/v1/snapshots/import",
    tag = "snapshots",
    params(ImportSnapshotQuery),
    request_body(description = "A tar archive", content(("application/x-tar"))),
    responses(
        (status = 201, description = "The new snapshot", body = SnapshotInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn import_snapshot(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiQuery(q): ApiQuery<ImportSnapshotQuery>,
    body: Body,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    let labels: BTreeMap<String, String> = match q.labels.as_deref() {
        None => BTreeMap::new(),
        Some(text) => serde_json::from_str(text).map_err(|e| {
            ApiError::invalid(
                Some("labels".to_owned()),
                format!("labels must be a JSON object of strings: {e}"),
            )
        })?,
    };
    let info = service
        .import_snapshot(&p, q.name, labels, body_stream(body))
        .await?;
    Ok((StatusCode::CREATED, Json(info)))
}
