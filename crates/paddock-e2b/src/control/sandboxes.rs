//! Sandbox routes: create, connect, get, kill, timeout, pause and resume, metrics, network.

use std::time::SystemTime;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use paddock_control::host_cpus;
use paddock_types::api::{SandboxInfo, SandboxStateBody, SetNetworkRequest, SetTimeoutRequest};
use paddock_types::SandboxId;
use serde::Deserialize;

use super::extract::{Caller, JsonBody};
use super::models::{ConnectRequest, Metric, NetworkConfig, NewSandbox, SandboxBody, TimeoutRequest};
use super::translate::{self, parse_time, unix_secs};
use crate::tokens::TokenKind;
use crate::{E2bError, E2bState, ENVD_VERSION};

/// A path's sandbox id; a malformed one answers as a missing sandbox.
pub(super) fn sandbox_id(text: &str) -> Result<SandboxId, E2bError> {
    text.parse().map_err(|_| E2bError::sandbox_not_found(text))
}

/// The `Sandbox` body for a sandbox.
pub(super) fn sandbox_body(state: &E2bState, info: &SandboxInfo) -> Result<SandboxBody, E2bError> {
    let id = sandbox_id(&info.id)?;
    Ok(SandboxBody {
        template_id: translate::template_alias(&info.template),
        alias: translate::template_alias(&info.template),
        sandbox_id: info.id.clone(),
        client_id: "paddock",
        envd_version: ENVD_VERSION,
        envd_access_token: state.config.token_key.token(TokenKind::Envd, &id),
        // Only a sandbox whose ports are private needs it (E2B sends null otherwise).
        traffic_access_token: (!info.public_ports)
            .then(|| state.config.token_key.token(TokenKind::Traffic, &id)),
        domain: state.config.domain.clone(),
    })
}

/// `POST /sandboxes` and `POST /v2/sandboxes`: 201 with the new sandbox.
pub(super) async fn create(
    State(state): State<E2bState>,
    Caller(p): Caller,
    JsonBody(req): JsonBody<NewSandbox>,
) -> Result<Response, E2bError> {
    // The server's templates and the caller's built ones: an E2B template id can name either.
    let known = state.service.template_names(&p).await?;
    let template = translate::template_ref(&req.template_id, &known)?;
    let create = translate::create_request(&req, template, state.config.internet_access)?;
    let info = state.service.create_sandbox(&p, create).await.map_err(|e| {
        if e.code == paddock_types::api::ErrorCode::SnapshotNotFound {
            translate::template_not_found(req.template_id.trim())
        } else {
            E2bError::from(e)
        }
    })?;
    Ok((StatusCode::CREATED, Json(sandbox_body(&state, &info)?)).into_response())
}

/// `POST /sandboxes/{id}/connect` and `/v2/...`: 200 for a running sandbox, 201 for one this call
/// resumed; the timeout is only ever extended.
pub(super) async fn connect(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ConnectRequest>,
) -> Result<Response, E2bError> {
    let id = sandbox_id(&id)?;
    let mut info = state
        .service
        .get_sandbox(&p, &id)
        .await
        .map_err(|_| not_found(&id))?;
    let status = match info.state {
        SandboxStateBody::Running if !info.paused => StatusCode::OK,
        SandboxStateBody::Running | SandboxStateBody::Stopped => {
            info = state.service.resume_sandbox(&p, &id).await?;
            StatusCode::CREATED
        }
        _ => return Err(not_found(&id)),
    };
    if let Some(timeout) = req.timeout.filter(|t| *t > 0) {
        let wanted = unix_secs(SystemTime::now()) + timeout as i64;
        let current = info.expires_at.as_deref().and_then(parse_time).map(unix_secs);
        if current.is_some_and(|c| c < wanted) {
            info = state
                .service
                .set_timeout(
                    &p,
                    &id,
                    SetTimeoutRequest {
                        timeout_secs: timeout,
                    },
                )
                .await?;
        }
    }
    Ok((status, Json(sandbox_body(&state, &info)?)).into_response())
}

fn not_found(id: &SandboxId) -> E2bError {
    E2bError::sandbox_not_found(id.as_str())
}

/// `GET /sandboxes/{id}`.
pub(super) async fn get(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let id = sandbox_id(&id)?;
    let info = state.service.get_sandbox(&p, &id).await?;
    if !is_alive(&info) {
        return Err(not_found(&id));
    }
    let token = state.config.token_key.token(TokenKind::Envd, &id);
    let detail = translate::detail(&info, host_cpus(), Some(token), state.config.domain.clone());
    Ok(Json(detail).into_response())
}

/// Running, paused or stopped: what E2B still lists and answers for.
pub(super) fn is_alive(info: &SandboxInfo) -> bool {
    matches!(
        info.state,
        SandboxStateBody::Running | SandboxStateBody::Creating | SandboxStateBody::Stopped
    )
}

/// `DELETE /sandboxes/{id}`: 204.
pub(super) async fn kill(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let id = sandbox_id(&id)?;
    state.service.kill_sandbox(&p, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/timeout`: the sandbox now ends `timeout` seconds from now (204).
pub(super) async fn set_timeout(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<TimeoutRequest>,
) -> Result<StatusCode, E2bError> {
    let id = sandbox_id(&id)?;
    // E2B takes 0 as "now"; paddock's shortest timeout is a second.
    let timeout_secs = req.timeout.max(1);
    state
        .service
        .set_timeout(&p, &id, SetTimeoutRequest { timeout_secs })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/pause` body.
#[derive(Debug, Default, Deserialize)]
pub(super) struct PauseRequest {
    /// `false` (E2B's "filesystem" mode): keep the files only; paddock stops the sandbox.
    #[serde(default)]
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204, or 409 when it already is. Memory kept: paddock's pause
/// (every process frozen); `memory: false`: paddock's stop (files kept, processes ended).
pub(super) async fn pause(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<PauseRequest>,
) -> Result<StatusCode, E2bError> {
    let id = sandbox_id(&id)?;
    let info = state.service.get_sandbox(&p, &id).await?;
    if info.paused || info.state == SandboxStateBody::Stopped {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    if !is_alive(&info) {
        return Err(not_found(&id));
    }
    if req.memory == Some(false) {
        state.service.stop_sandbox(&p, &id).await?;
    } else {
        state.service.pause_sandbox(&p, &id).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/resume` (deprecated by E2B in favour of connect): 201.
pub(super) async fn resume(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
) -> Result<Response, E2bError> {
    let id = sandbox_id(&id)?;
    let info = state.service.get_sandbox(&p, &id).await?;
    if info.state == SandboxStateBody::Running && !info.paused {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already running"),
        ));
    }
    let info = state.service.resume_sandbox(&p, &id).await?;
    Ok((StatusCode::CREATED, Json(sandbox_body(&state, &info)?)).into_response())
}

/// `GET /sandboxes/{id}/metrics` query (Unix seconds).
#[derive(Debug, Deserialize)]
pub(super) struct MetricsQuery {
    #[serde(default)]
    start: Option<i64>,
    #[serde(default)]
    end: Option<i64>,
}

/// `GET /sandboxes/{id}/metrics`: paddock keeps no history, so the answer is one sample taken now
/// when the window holds the present, and nothing for a window in the past.
pub(super) async fn metrics(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    Query(q): Query<MetricsQuery>,
) -> Result<Response, E2bError> {
    let id = sandbox_id(&id)?;
    let info = state.service.get_sandbox(&p, &id).await?;
    let now = SystemTime::now();
    let now_secs = unix_secs(now);
    let in_window = q.start.is_none_or(|s| s <= now_secs) && q.end.is_none_or(|e| e >= now_secs);
    if !in_window || !is_alive(&info) || info.state == SandboxStateBody::Stopped {
        return Ok(Json(Vec::<Metric>::new()).into_response());
    }
    let usage = state.service.sandbox_usage(&p, &id).await?;
    let cpu_count = translate::detail(&info, host_cpus(), None, None).cpu_count;
    let started = parse_time(&info.created_at).unwrap_or(now);
    let wall_us = now
        .duration_since(started)
        .map(|d| d.as_micros() as f64)
        .unwrap_or(0.0);
    let cpu_used_pct = if wall_us > 0.0 {
        (usage.cpu_time_us as f64 / (wall_us * f64::from(cpu_count)) * 100.0).min(100.0)
    } else {
        0.0
    };
    let metric = Metric {
        timestamp: humantime::format_rfc3339_seconds(now).to_string(),
        timestamp_unix: now_secs,
        cpu_count,
        cpu_used_pct,
        mem_used: usage.memory_bytes,
        mem_total: usage.memory_limit_bytes.unwrap_or(0),
        mem_cache: 0,
        disk_used: usage.disk_bytes,
        disk_total: usage.disk_limit_bytes.unwrap_or(0),
    };
    Ok(Json(vec![metric]).into_response())
}

/// `PUT /sandboxes/{id}/network`: replaces the egress lists (204). A sandbox created without a
/// network keeps having none (paddock cannot add a network to a running sandbox).
pub(super) async fn update_network(
    State(state): State<E2bState>,
    Caller(p): Caller,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<NetworkConfig>,
) -> Result<StatusCode, E2bError> {
    let id = sandbox_id(&id)?;
    let policy = translate::network_policy(
        Some(&body),
        body.allow_internet_access,
        state.config.internet_access,
    )?
    .unwrap_or_default();
    state
        .service
        .set_network(
            &p,
            &id,
            SetNetworkRequest {
                policy: Some(policy),
                secrets: None,
            },
        )
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}/logs` and `/v2/...`: not offered (the audit log is paddock's record).
pub(super) async fn logs(Caller(_p): Caller, Path(_id): Path<String>) -> E2bError {
    E2bError::new(
        StatusCode::NOT_IMPLEMENTED,
        "sandbox logs are not offered by paddock; read the sandbox's audit rows with GET /v1/audit",
    )
}
