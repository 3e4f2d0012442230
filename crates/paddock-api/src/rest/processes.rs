//! Processes: exec (streamed, collected or in the background), re-attach, stdin, signals, PTY size.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::BytesMut;
use futures_util::StreamExt as _;
use paddock_control::{ExecStream, SandboxService};
use paddock_types::api::{
    AttachQuery, ExecEvent, ExecRequest, ExecResult, KillRequest, ProcessList, PtySizeBody, SignalRequest,
};
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;

use crate::extract::body_read_error;
use crate::negotiate::{negotiate, StreamFormat};
use crate::stream::event_stream_response;
use crate::{ApiError, ApiJson, ApiQuery, Auth, OptionalJson, ProcessPath, SandboxPath};

/// Output kept per stream (stdout, stderr) when a foreground exec is answered as one JSON document,
/// counted as JSON-encoded text.
pub use paddock_control::COLLECT_LIMIT;

/// Stdin is passed on in pieces of about this size, so a large upload is never held whole.
const STDIN_CHUNK: usize = 64 * 1024;

/// `POST .../processes/{pid}/stdin` query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StdinQuery {
    /// Close stdin after writing the body.
    #[serde(default)]
    pub close: bool,
}

/// Answers a process's events as the client asked: NDJSON, SSE, or (once it ends) one JSON document.
async fn answer_events(headers: &HeaderMap, stream: ExecStream) -> Response {
    match negotiate(
        headers,
        &[StreamFormat::Ndjson, StreamFormat::Sse, StreamFormat::Json],
    ) {
        StreamFormat::Json => collected_response(stream.collect().await),
        format => event_stream_response(stream, format),
    }
}

/// One JSON document written around the collected buffers (no copy of them); the budget they hold
/// is given back once the body is sent or dropped.
fn collected_response(collected: paddock_control::CollectedOutput) -> Response {
    let (pieces, held) = collected.into_json();
    let length: usize = pieces.iter().map(bytes::Bytes::len).sum();
    let body = futures_util::stream::iter(pieces).map(move |piece| {
        let _ = &held;
        Ok::<_, std::convert::Infallible>(piece)
    });
    (
        StatusCode::OK,
        [
            (
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            ),
            (
                axum::http::header::CONTENT_LENGTH,
                axum::http::HeaderValue::from(length),
            ),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

/// Runs a process.
///
/// In the foreground the response streams its events, each as soon as it happens: NDJSON (one
/// `ExecEvent` per line) by default, Server-Sent Events for `Accept: text/event-stream`; or, for
/// `Accept: application/json`, waits for the end and returns the collected output (at most 16 MiB of
/// JSON-encoded text per stream, less when the server's budget for collected output is in use;
/// `stdout_truncated`/`stderr_truncated` say when output was cut). Closing the connection kills a
/// foreground process. With `background: true` the answer is `202 {"pid": N}` at once.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "Foreground: the process's events, or its collected result", content(
            (ExecEvent = "application/x-ndjson"),
            (ExecEvent = "text/event-stream"),
            (ExecResult = "application/json"),
        )),
        (status = 202, description = "Background: started", body = ExecResult),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn exec(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    headers: HeaderMap,
    ApiJson(req): ApiJson<ExecRequest>,
) -> Result<Response, ApiError> {
    let stream = service.exec(&p, &id, req).await?;
    if stream.is_background() {
        let started = ExecResult {
            pid: stream.pid(),
            stdout: None,
            stdout_truncated: false,
            stderr: None,
            stderr_truncated: false,
            exit: None,
        };
        return Ok((StatusCode::ACCEPTED, Json(started)).into_response());
    }
    Ok(answer_events(&headers, stream).await)
}

/// The sandbox's processes started through the API.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "Running processes and finished ones still remembered", body = ProcessList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_processes(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<ProcessList>, ApiError> {
    Ok(Json(service.list_processes(&p, &id).await?))
}

/// Re-attaches to a process.
///
/// Replays its kept output from the given offsets, then follows it until it exits (unless
/// `follow=false`). Same formats as exec. Closing the connection does not kill it.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes/{pid}/output",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = u32, Path, description = "Process id inside the sandbox"),
        AttachQuery,
    ),
    responses(
        (status = 200, description = "The process's events, or its collected result", content(
            (ExecEvent = "application/x-ndjson"),
            (ExecEvent = "text/event-stream"),
            (ExecResult = "application/json"),
        )),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn process_output(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ProcessPath(id, pid): ProcessPath,
    ApiQuery(q): ApiQuery<AttachQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let stream = service.attach_process(&p, &id, pid, q).await?;
    Ok(answer_events(&headers, stream).await)
}

/// Writes to a process's stdin.
///
/// The raw request body goes to the process's stdin (kept open with `stdin_open`), streamed through,
/// not buffered; `close=true` closes stdin afterwards.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{pid}/stdin",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = u32, Path, description = "Process id inside the sandbox"),
        StdinQuery,
    ),
    request_body(description = "Bytes for stdin", content(("application/octet-stream"))),
    responses(
        (status = 204, description = "Written"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn write_stdin(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ProcessPath(id, pid): ProcessPath,
    ApiQuery(q): ApiQuery<StdinQuery>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let mut data = body.into_data_stream();
    let mut pending = BytesMut::new();
    while let Some(chunk) = data.next().await {
        pending.extend_from_slice(&chunk.map_err(|_| body_read_error())?);
        if pending.len() >= STDIN_CHUNK {
            service
                .write_stdin(&p, &id, pid, pending.split().freeze(), false)
                .await?;
        }
    }
    // Always one last call: it carries `close`, and an empty body still checks the process exists.
    service
        .write_stdin(&p, &id, pid, pending.freeze(), q.close)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sends a signal to one process.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{pid}/signal",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = u32, Path, description = "Process id inside the sandbox"),
    ),
    request_body = SignalRequest,
    responses(
        (status = 204, description = "Sent"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn signal_process(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ProcessPath(id, pid): ProcessPath,
    ApiJson(req): ApiJson<SignalRequest>,
) -> Result<StatusCode, ApiError> {
    service.signal_process(&p, &id, pid, req).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Signals a process and all its descendants (`KILL` unless the optional body names another signal).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{pid}/kill",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = u32, Path, description = "Process id inside the sandbox"),
    ),
    request_body(content = Option<KillRequest>, description = "Optional: an empty body (or `null`) means `KILL`"),
    responses(
        (status = 204, description = "Sent"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn kill_process(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ProcessPath(id, pid): ProcessPath,
    OptionalJson(req): OptionalJson<KillRequest>,
) -> Result<StatusCode, ApiError> {
    service.kill_process(&p, &id, pid, req).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resizes a PTY process's terminal.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{pid}/resize",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("pid" = u32, Path, description = "Process id inside the sandbox"),
    ),
    request_body = PtySizeBody,
    responses(
        (status = 204, description = "Resized"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn resize_pty(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ProcessPath(id, pid): ProcessPath,
    ApiJson(size): ApiJson<PtySizeBody>,
) -> Result<StatusCode, ApiError> {
    service.resize_pty(&p, &id, pid, size).await?;
    Ok(StatusCode::NO_CONTENT)
}
