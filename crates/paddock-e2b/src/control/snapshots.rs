//! Snapshots and forks: `POST /sandboxes/{id}/snapshots`, `GET /snapshots`, `DELETE /templates/{id}`
//! (E2B's snapshots are templates), `POST /sandboxes/{id}/fork`. A snapshot id is accepted as a
//! `templateID` by create.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use paddock_types::api::{CreateSnapshotRequest, ListSnapshotsQuery, SnapshotInfo};
use paddock_types::SnapshotId;
use serde::Deserialize;
use serde_json::json;

use super::extract::{Caller, JsonBody};
use super::models::{ForkRequest, SnapshotBody, SnapshotRequest};
use super::sandboxes::{sandbox_body, sandbox_id};
use crate::{E2bError, E2bState};

fn snapshot_body(s: &SnapshotInfo) -> SnapshotBody {
    SnapshotBody {
        snapshot_id: s.id.clone(),
        names: s.name.iter().cloned().collect(),
    }
}

/// `POST /sandboxes/{id}/snapshots`: 201 `{snapshotID, names}`.
pub(super) async fn create(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<SnapshotRequest>,
) -> Result<Response, E2bError> {
    let id = sandbox_id(&id)?;
    let info = state
        .service
        .create_snapshot(
            &p,
            &id,
            CreateSnapshotRequest {
                name: req.name,
                ..CreateSnapshotRequest::default()
            },
        )
        .await?;
    Ok((StatusCode::CREATED, Json(snapshot_body(&info))).into_response())
}

/// `GET /snapshots` query.
#[derive(Debug, Default, Deserialize)]
pub(super) struct ListQuery {
    #[serde(default, rename = "sandboxID")]
    sandbox_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    limit: Option<u32>,
    #[serde(default, rename = "nextToken")]
    next_token: Option<String>,
}

/// `GET /snapshots`: the tenant's named snapshots (checkpoints are paddock's own), paged.
pub(super) async fn list(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Query(q): Query<ListQuery>,
) -> Result<Response, E2bError> {
    let page = state
        .service
        .list_snapshots(
            &p,
            ListSnapshotsQuery {
                sandbox: q.sandbox_id.clone(),
                kind: Some("snapshot".into()),
                limit: Some(q.limit.unwrap_or(100).clamp(1, 100)),
                cursor: q.next_token.clone().filter(|t| !t.is_empty()),
            },
        )
        .await?;
    let items: Vec<_> = page
        .snapshots
        .iter()
        .filter(|s| q.name.as_deref().is_none_or(|n| s.name.as_deref() == Some(n)))
        .map(snapshot_body)
        .collect();
    let mut resp = Json(items).into_response();
    if let Some(next) = page.next_cursor.and_then(|c| HeaderValue::from_str(&c).ok()) {
        resp.headers_mut()
            .insert(HeaderName::from_static("x-next-token"), next);
    }
    Ok(resp)
}

/// `DELETE /templates/{id}`: deletes a snapshot (204); a template of the server cannot be deleted.
pub(super) async fn delete(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let not_found = || E2bError::new(StatusCode::NOT_FOUND, format!("template '{id}' not found"));
    let snapshot: SnapshotId = id.parse().map_err(|_| not_found())?;
    state
        .service
        .delete_snapshot(&p, &snapshot)
        .await
        .map_err(|_| not_found())?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/fork`: 201 with one `{sandbox}` per copy.
pub(super) async fn fork(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ForkRequest>,
) -> Result<Response, E2bError> {
    let id = sandbox_id(&id)?;
    let result = state
        .service
        .fork_sandbox(
            &p,
            &id,
            paddock_types::api::ForkRequest {
                count: req.count.unwrap_or(1),
                labels: None,
                timeout_secs: req.timeout.filter(|t| *t > 0),
            },
        )
        .await?;
    let mut items = Vec::new();
    for info in &result.sandboxes {
        items.push(json!({ "sandbox": sandbox_body(&state, info)? }));
    }
    Ok((StatusCode::CREATED, Json(items)).into_response())
}
