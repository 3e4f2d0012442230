//! E2B's code-interpreter server (port 49999 of a sandbox), answered by paddock from the service:
//! `POST /execute` streams a cell's events as JSON lines in the shapes `e2b-code-interpreter`
//! reads, and `/contexts` creates, lists, restarts and removes code contexts. A thin translation
//! onto `SandboxService::{run_code, create_context, ...}` (same tenant checks, audit rows and
//! bounds as `/v1/sandboxes/{id}/code`).
//!
//! Access is that of the sandbox's other ports (the SDK sends the envd access token with `/execute`
//! but nothing with `/contexts`): the envd access token, or, for a sandbox whose ports are public,
//! nothing, else its traffic access token. Errors are plain text with E2B's statuses (the SDK turns
//! 404 into `NotFoundException` and shows other bodies).
//!
//! `env_vars` are the cell's own variables (`RunCodeRequest::env`: set before it, restored after).
//!
//! What it does not do: languages paddock has no kernel for (400 naming the known ones).

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use bytes::Bytes;
use paddock_control::{CodeStream, Principal, ServiceError};
use paddock_types::api::{CodeEvent, CodeResult, ContextInfo, CreateContextRequest, RunCodeRequest};
use paddock_types::SandboxId;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::envd::SandboxOnly;
use crate::E2bState;

/// A request to the interpreter of a running sandbox the caller may reach (see the module docs).
#[derive(Debug)]
struct Caller {
    id: SandboxId,
    principal: Principal,
}

impl FromRequestParts<E2bState> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &E2bState) -> Result<Self, Self::Rejection> {
        // The envd door's check: the sandbox served, and whether the envd token came with it.
        let envd = SandboxOnly::from_request_parts(parts, state).await?;
        let principal = if envd.token_ok {
            envd.principal
        } else {
            crate::ports::port_caller(state, &envd.id, &parts.headers)
                .map_err(IntoResponse::into_response)?
                .1
        };
        let id = envd.id;
        Ok(Self { id, principal })
    }
}

/// The interpreter's port.
pub const INTERPRETER_PORT: u16 = 49999;

/// The interpreter's routes (the front-end has put the request's target in its extensions).
pub fn router(state: E2bState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{context}", delete(delete_context))
        .route("/contexts/{context}/restart", post(restart_context))
        .fallback(|| async { text(StatusCode::NOT_FOUND, "Not Found") })
        .with_state(state)
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

/// A service error as the interpreter answers it: its status, the message as plain text.
fn failure(e: ServiceError) -> Response {
    let status = StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    text(status, e.message)
}

async fn health(_caller: Caller) -> Response {
    text(StatusCode::OK, "OK")
}

/// `POST /execute`'s body, as the Python and JS SDKs send it.
#[derive(Debug, Deserialize)]
struct ExecuteBody {
    code: String,
    #[serde(default)]
    context_id: Option<String>,
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    env_vars: Option<Map<String, Value>>,
}

async fn execute(caller: Caller, State(state): State<E2bState>, body: Bytes) -> Response {
    let body: ExecuteBody = match serde_json::from_slice(&body) {
        Ok(body) => body,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("invalid request body: {e}")),
    };
    if body.context_id.is_some() && body.language.is_some() {
        return text(
            StatusCode::BAD_REQUEST,
            "Only one of context_id or language can be provided",
        );
    }
    let mut env = std::collections::BTreeMap::new();
    for (name, value) in body.env_vars.unwrap_or_default() {
        let value = match value {
            Value::String(s) => s,
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            other => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("env_vars.{name} must be a string, not {other}"),
                )
            }
        };
        env.insert(name, value);
    }
    let request = RunCodeRequest {
        code: body.code,
        language: body.language,
        context: body.context_id,
        timeout_ms: None,
        env,
    };
    let stream = match state
        .service
        .run_code(&caller.principal, &caller.id, request)
        .await
    {
        Ok(stream) => stream,
        Err(e) => return failure(e),
    };
    let body = Body::from_stream(futures_util::stream::unfold(Some(stream), |stream| async move {
        let mut stream: CodeStream = stream?;
        loop {
            let event = stream.recv().await?;
            let last = matches!(event, CodeEvent::End { .. } | CodeEvent::Failed { .. });
            if let Some(lines) = e2b_lines(event) {
                let next = (!last).then_some(stream);
                return Some((Ok::<_, std::convert::Infallible>(Bytes::from(lines)), next));
            }
        }
    }));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        body,
    )
        .into_response()
}

/// The JSON lines of one event in E2B's shapes (`None`: an event E2B has no line for).
fn e2b_lines(event: CodeEvent) -> Option<String> {
    let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
    let values: Vec<Value> = match event {
        CodeEvent::Started { .. } => return None,
        CodeEvent::ExecutionCount { execution_count } => {
            vec![json!({"type": "number_of_executions", "execution_count": execution_count})]
        }
        CodeEvent::Stdout { text } => vec![json!({"type": "stdout", "text": text, "timestamp": now})],
        CodeEvent::Stderr { text } => vec![json!({"type": "stderr", "text": text, "timestamp": now})],
        CodeEvent::Result(result) => vec![result_line(*result)],
        CodeEvent::Error(error) => vec![json!({
            "type": "error",
            "name": error.name,
            "value": error.value,
            "traceback": error.traceback,
        })],
        CodeEvent::End { status, .. } => {
            use paddock_types::api::CodeStatus;
            let mut lines = Vec::new();
            match status {
                CodeStatus::TimedOut | CodeStatus::Interrupted => lines.push(json!({
                    "type": "error",
                    "name": "TimeoutError",
                    "value": "the cell was interrupted",
                    "traceback": "",
                })),
                CodeStatus::KernelDied => lines.push(json!({
                    "type": "error",
                    "name": "UnexpectedEndOfExecution",
                    "value": "the kernel died while the cell ran; restart the context",
                    "traceback": "",
                })),
                CodeStatus::Ok | CodeStatus::Error => {}
            }
            lines.push(json!({"type": "end_of_execution"}));
            lines
        }
        CodeEvent::Failed { message, .. } => vec![
            json!({"type": "error", "name": "UnexpectedEndOfExecution", "value": message, "traceback": ""}),
            json!({"type": "end_of_execution"}),
        ],
    };
    let mut out = String::new();
    for v in values {
        out.push_str(&v.to_string());
        out.push('\n');
    }
    Some(out)
}

/// A result line: E2B's field per representation, `extra` for the rest.
fn result_line(r: CodeResult) -> Value {
    let mut line = Map::new();
    line.insert("type".into(), json!("result"));
    let fields = [
        ("text", r.text),
        ("html", r.html),
        ("markdown", r.markdown),
        ("svg", r.svg),
        ("png", r.png),
        ("jpeg", r.jpeg),
        ("pdf", r.pdf),
        ("latex", r.latex),
        ("javascript", r.javascript),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            line.insert(name.into(), Value::String(value));
        }
    }
    if let Some(json) = r.json {
        line.insert("json".into(), json);
    }
    if let Some(chart) = r.chart {
        line.insert("chart".into(), chart);
    }
    let mut extra = r.extra;
    // E2B's own representations travel as MIME types of their own.
    if let Some(data) = extra.remove("e2b/data") {
        line.insert("data".into(), data);
    }
    if let Some(chart) = extra.remove("e2b/chart") {
        line.insert("chart".into(), chart);
    }
    if !extra.is_empty() {
        line.insert("extra".into(), Value::Object(extra.into_iter().collect()));
    }
    line.insert("is_main_result".into(), json!(r.is_main_result));
    Value::Object(line)
}

/// `POST /contexts`'s body.
#[derive(Debug, Default, Deserialize)]
struct ContextBody {
    #[serde(default)]
    language: Option<String>,
    #[serde(default)]
    cwd: Option<String>,
}

/// A context in E2B's shape.
fn context_json(c: &ContextInfo) -> Value {
    json!({"id": c.id, "language": c.language, "cwd": c.cwd.clone().unwrap_or_else(|| "/home/user".to_owned())})
}

async fn create_context(caller: Caller, State(state): State<E2bState>, body: Bytes) -> Response {
    let body: ContextBody = if body.is_empty() {
        ContextBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(body) => body,
            Err(e) => return text(StatusCode::BAD_REQUEST, format!("invalid request body: {e}")),
        }
    };
    let request = CreateContextRequest {
        language: body.language,
        cwd: body.cwd,
        env: Default::default(),
    };
    match state
        .service
        .create_context(&caller.principal, &caller.id, request)
        .await
    {
        Ok(info) => Json(context_json(&info)).into_response(),
        Err(e) => failure(e),
    }
}

/// The default contexts E2B's server lists from the start; paddock makes them at their first
/// cell (by language or by this id), and lists them before that as they will be.
const DEFAULT_CONTEXTS: [&str; 2] = ["python", "javascript"];

async fn list_contexts(caller: Caller, State(state): State<E2bState>) -> Response {
    match state.service.list_contexts(&caller.principal, &caller.id).await {
        Ok(list) => {
            let mut listed: Vec<Value> = list.contexts.iter().map(context_json).collect();
            for language in DEFAULT_CONTEXTS {
                if !list.contexts.iter().any(|c| c.id == language) {
                    listed.push(json!({"id": language, "language": language, "cwd": "/home/user"}));
                }
            }
            Json(Value::Array(listed)).into_response()
        }
        Err(e) => failure(e),
    }
}

async fn restart_context(
    caller: Caller,
    State(state): State<E2bState>,
    Path(context): Path<String>,
) -> Response {
    match state
        .service
        .restart_context(&caller.principal, &caller.id, &context)
        .await
    {
        Ok(_) => Json(json!({})).into_response(),
        Err(e) => failure(e),
    }
}

async fn delete_context(
    caller: Caller,
    State(state): State<E2bState>,
    Path(context): Path<String>,
) -> Response {
    match state
        .service
        .delete_context(&caller.principal, &caller.id, &context)
        .await
    {
        Ok(()) => Json(json!({})).into_response(),
        Err(e) => failure(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_types::api::{CodeError, CodeStatus};

    fn lines(event: CodeEvent) -> Vec<Value> {
        e2b_lines(event)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("json"))
            .collect()
    }

    #[test]
    fn events_take_e2bs_shapes() {
        assert!(e2b_lines(CodeEvent::Started {
            context: "python".into(),
            language: "python".into()
        })
        .is_none());
        let out = lines(CodeEvent::Stdout { text: "hi\n".into() });
        assert_eq!(
            (out[0]["type"].as_str(), out[0]["text"].as_str()),
            (Some("stdout"), Some("hi\n"))
        );
        assert!(out[0]["timestamp"].is_string());
        let mut result = CodeResult {
            is_main_result: true,
            text: Some("2".into()),
            png: Some("iVBOR".into()),
            ..CodeResult::default()
        };
        result.extra.insert("e2b/chart".into(), json!({"type": "line"}));
        result.extra.insert("application/x-other".into(), json!(1));
        let out = lines(CodeEvent::Result(Box::new(result)));
        assert_eq!(
            out[0],
            json!({"type": "result", "text": "2", "png": "iVBOR", "chart": {"type": "line"},
                   "extra": {"application/x-other": 1}, "is_main_result": true})
        );
        let out = lines(CodeEvent::Error(CodeError {
            name: "NameError".into(),
            value: "x".into(),
            traceback: "tb".into(),
        }));
        assert_eq!(out[0]["name"], "NameError");
        let out = lines(CodeEvent::End {
            status: CodeStatus::Ok,
            dropped_bytes: 0,
        });
        assert_eq!(out, [json!({"type": "end_of_execution"})]);
        let out = lines(CodeEvent::End {
            status: CodeStatus::KernelDied,
            dropped_bytes: 0,
        });
        assert_eq!(
            (out[0]["name"].as_str(), out[1]["type"].as_str()),
            (Some("UnexpectedEndOfExecution"), Some("end_of_execution"))
        );
        let out = lines(CodeEvent::ExecutionCount { execution_count: 3 });
        assert_eq!(
            out[0],
            json!({"type": "number_of_executions", "execution_count": 3})
        );
    }
}
