//! WebSockets: an interactive exec (`.../exec/ws`, events as JSON text messages) and a terminal
//! (`.../pty`, terminal bytes as binary messages).
//!
//! One session is two halves polled together: the pump sends the process's events (and the answers
//! to bad client messages) to the client, the reader turns the client's messages into stdin writes,
//! signals and resizes. When the process ends the pump sends a close frame; when the client leaves
//! first the session ends and drops the [`ExecStream`], which kills a foreground process.

use std::time::Duration;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::response::Response;
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt as _, StreamExt as _};
use paddock_control::{ExecOutput, ExecStream, Principal, SandboxService};
use paddock_types::api::{ErrorCode, ExecEvent, ExecRequest, PtySizeBody, SignalRequest};
use paddock_types::SandboxId;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use utoipa::{IntoParams, ToSchema};

use crate::stream::exec_event;
use crate::{ApiError, ApiQuery, Auth, SandboxPath};

/// The largest message a client may send (stdin chunks, requests).
const MAX_CLIENT_MESSAGE: usize = 1024 * 1024;
/// How long `.../exec/ws` waits for the `ExecRequest`.
const FIRST_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the server waits for the client's close frame after sending its own.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// Pings keep idle connections open through proxies and reveal a vanished client.
const PING_INTERVAL: Duration = Duration::from_secs(30);

/// The login shell of `.../pty` when no `cmd` is given: bash if the sandbox has it, else sh.
pub const DEFAULT_TERMINAL_SHELL: &str = "if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l";

/// A text message from the client of `.../exec/ws` or `.../pty` (binary messages are raw stdin).
/// A message that does not parse, or whose operation fails, is answered with an `error` event; the
/// session goes on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum WsClientMessage {
    /// Text for stdin.
    Stdin {
        /// The text (UTF-8).
        data: String,
    },
    /// Bytes for stdin, base64-encoded (standard alphabet).
    StdinB64 {
        /// The bytes.
        data: String,
    },
    /// Close stdin.
    CloseStdin,
    /// Send a signal to the process.
    Signal {
        /// Name (`TERM`, `SIGINT`) or number.
        #[schema(value_type = String, example = "TERM")]
        signal: serde_json::Value,
    },
    /// Resize the process's terminal.
    Resize {
        /// Rows.
        rows: u16,
        /// Columns.
        cols: u16,
    },
}

/// `GET .../pty` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PtyQuery {
    /// Terminal rows (default 24).
    #[serde(default)]
    pub rows: Option<u16>,
    /// Terminal columns (default 80).
    #[serde(default)]
    pub cols: Option<u16>,
    /// A shell command line to run instead of a login shell.
    #[serde(default)]
    pub cmd: Option<String>,
    /// Working directory.
    #[serde(default)]
    pub cwd: Option<String>,
    /// User to run as.
    #[serde(default)]
    pub user: Option<String>,
}

/// The process `.../pty` starts for `q`.
pub fn pty_request(q: PtyQuery) -> ExecRequest {
    ExecRequest {
        shell: Some(q.cmd.unwrap_or_else(|| DEFAULT_TERMINAL_SHELL.to_owned())),
        env: [("TERM".to_owned(), "xterm-256color".to_owned())].into(),
        cwd: q.cwd,
        user: q.user,
        stdin_open: true,
        pty: Some(PtySizeBody {
            rows: q.rows.unwrap_or(24),
            cols: q.cols.unwrap_or(80),
        }),
        ..ExecRequest::default()
    }
}

/// `WebSocketUpgrade` with an [`ApiError`] rejection (a plain HTTP request to a WebSocket endpoint).
pub(crate) struct Upgrade(pub(crate) WebSocketUpgrade);

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        WebSocketUpgrade::from_request_parts(parts, state)
            .await
            .map(|ws| Self(ws.max_message_size(MAX_CLIENT_MESSAGE)))
            .map_err(|e: WebSocketUpgradeRejection| {
                let mut error =
                    ApiError::invalid(None, format!("this endpoint is a WebSocket: {}", e.body_text()));
                error.set_status(e.status());
                error
            })
    }
}

/// Runs a process over a WebSocket.
///
/// The client's first text message is the `ExecRequest` (JSON); the server then sends each
/// `ExecEvent` as a JSON text message and closes (1000) after `exit`, or (1011) after an `error` that
/// ends the stream. The client sends `WsClientMessage`s as text and raw stdin as binary messages; a
/// message that is malformed or whose operation fails is answered with an `error` event and the
/// session goes on. A bad or missing first message is answered with an `error` event and a close
/// (1008). Disconnecting kills a foreground process.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/exec/ws",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 101, description = "Switching to the WebSocket protocol"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn exec_ws(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    Upgrade(ws): Upgrade,
    SandboxPath(id): SandboxPath,
) -> Response {
    ws.on_upgrade(move |socket| async move {
        let (mut sink, mut source) = socket.split();
        let req = match first_request(&mut source).await {
            Ok(Some(req)) => req,
            Ok(None) => return,
            Err(e) => return close_with_error(&mut sink, &e).await,
        };
        let stream = match service.exec(&p, &id, req).await {
            Ok(stream) => stream,
            Err(e) => return close_with_error(&mut sink, &e.into()).await,
        };
        run_session(Session {
            service,
            principal: p,
            id,
            stream,
            framing: Framing::Events,
            sink,
            source,
        })
        .await;
    })
}

/// A terminal over a WebSocket.
///
/// Runs a login shell (bash if the sandbox has it, else sh), or `cmd`, under a PTY of `rows`x`cols`
/// with `TERM=xterm-256color`. Binary messages carry the terminal's bytes both ways; the client's
/// text messages are `WsClientMessage`s (`resize` above all). When the process ends the server sends
/// its `exit` event as one text message and closes. Errors before the process starts are answered as
/// HTTP errors, before the upgrade. Disconnecting kills the shell.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/pty",
    tag = "processes",
    params(("id" = String, Path, description = "Sandbox id"), PtyQuery),
    responses(
        (status = 101, description = "Switching to the WebSocket protocol"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn pty_ws(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiQuery(q): ApiQuery<PtyQuery>,
    Upgrade(ws): Upgrade,
    SandboxPath(id): SandboxPath,
) -> Result<Response, ApiError> {
    // Started before the upgrade so a missing sandbox is a 404, not a closed socket. If the upgrade
    // never completes, the callback (and with it the stream) is dropped, which kills the shell.
    let stream = service.exec(&p, &id, pty_request(q)).await?;
    Ok(ws.on_upgrade(move |socket| async move {
        let (sink, source) = socket.split();
        run_session(Session {
            service,
            principal: p,
            id,
            stream,
            framing: Framing::Terminal,
            sink,
            source,
        })
        .await;
    }))
}

/// How events become messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Every event as a JSON text message.
    Events,
    /// Output as binary messages, `exit`/`error` as JSON text, `started` not at all.
    Terminal,
}

struct Session {
    service: SandboxService,
    principal: Principal,
    id: SandboxId,
    stream: ExecStream,
    framing: Framing,
    sink: SplitSink<WebSocket, Message>,
    source: SplitStream<WebSocket>,
}

async fn run_session(session: Session) {
    let Session {
        service,
        principal,
        id,
        stream,
        framing,
        mut sink,
        mut source,
    } = session;
    let pid = stream.pid();
    let (reply_tx, reply_rx) = mpsc::channel(8);
    let client_left = tokio::select! {
        () = pump(stream, &mut sink, reply_rx, framing) => false,
        () = read_client(&service, &principal, &id, pid, &mut source, reply_tx) => true,
    };
    // Here the stream is dropped (the pump owned it): a foreground process whose client left is killed.
    if !client_left {
        // The close frame is sent; let the client answer it so the close is clean.
        let _ = tokio::time::timeout(CLOSE_GRACE, async {
            while let Some(Ok(message)) = source.next().await {
                if matches!(message, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
}

/// Sends events (and replies) until the last event, then a close frame.
async fn pump(
    mut stream: ExecStream,
    sink: &mut SplitSink<WebSocket, Message>,
    mut replies: mpsc::Receiver<Message>,
    framing: Framing,
) {
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_INTERVAL, PING_INTERVAL);
    let mut close = CloseFrame {
        code: close_code::NORMAL,
        reason: "".into(),
    };
    loop {
        let message = tokio::select! {
            biased;
            Some(reply) = replies.recv() => reply,
            output = stream.recv() => {
                let Some(output) = output else { break };
                let last = output.is_last();
                if let ExecOutput::Error { code, .. } = &output {
                    close = CloseFrame {
                        code: close_code::ERROR,
                        reason: code.as_str().into(),
                    };
                }
                let message = frame(output, framing);
                if let Some(message) = message {
                    if sink.send(message).await.is_err() {
                        return;
                    }
                }
                if last {
                    break;
                }
                continue;
            }
            _ = ping.tick() => Message::Ping(Bytes::new()),
        };
        if sink.send(message).await.is_err() {
            return;
        }
    }
    let _ = sink.send(Message::Close(Some(close))).await;
}

/// The message carrying `output`, if any: a terminal's output as the process's bytes, anything
/// else as its `ExecEvent`.
fn frame(output: ExecOutput, framing: Framing) -> Option<Message> {
    match (framing, output) {
        (Framing::Terminal, ExecOutput::Started { .. }) => None,
        (Framing::Terminal, ExecOutput::Output { data, .. }) => Some(Message::Binary(data)),
        (_, output) => event_text(&exec_event(output)),
    }
}

fn event_text(event: &ExecEvent) -> Option<Message> {
    serde_json::to_string(event)
        .inspect_err(|e| tracing::error!(error = %e, "failed to serialize an exec event"))
        .ok()
        .map(Message::from)
}

fn error_text(error: &ApiError) -> Option<Message> {
    event_text(&ExecEvent::Error {
        code: error.code(),
        message: error.body().message.clone(),
    })
}

/// Applies the client's messages until it closes or goes away.
async fn read_client(
    service: &SandboxService,
    p: &Principal,
    id: &SandboxId,
    pid: u32,
    source: &mut SplitStream<WebSocket>,
    replies: mpsc::Sender<Message>,
) {
    while let Some(Ok(message)) = source.next().await {
        let result = match message {
            Message::Binary(bytes) => service
                .write_stdin(p, id, pid, bytes, false)
                .await
                .map_err(ApiError::from),
            Message::Text(text) => match parse_client_message(text.as_str()) {
                Ok(command) => apply(service, p, id, pid, command).await,
                Err(e) => Err(e),
            },
            Message::Close(_) => return,
            Message::Ping(_) | Message::Pong(_) => continue,
        };
        if let Err(e) = result {
            if let Some(reply) = error_text(&e) {
                if replies.send(reply).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn apply(
    service: &SandboxService,
    p: &Principal,
    id: &SandboxId,
    pid: u32,
    command: WsClientMessage,
) -> Result<(), ApiError> {
    match command {
        WsClientMessage::Stdin { data } => service.write_stdin(p, id, pid, data.into(), false).await,
        WsClientMessage::StdinB64 { data } => {
            let bytes = decode_b64(&data)?;
            service.write_stdin(p, id, pid, bytes.into(), false).await
        }
        WsClientMessage::CloseStdin => service.write_stdin(p, id, pid, Bytes::new(), true).await,
        WsClientMessage::Signal { signal } => {
            service.signal_process(p, id, pid, SignalRequest { signal }).await
        }
        WsClientMessage::Resize { rows, cols } => {
            service.resize_pty(p, id, pid, PtySizeBody { rows, cols }).await
        }
    }
    .map_err(ApiError::from)
}

fn decode_b64(data: &str) -> Result<Vec<u8>, ApiError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| ApiError::invalid(Some("data".to_owned()), format!("invalid base64: {e}")))
}

/// Parses a client text message.
pub(crate) fn parse_client_message(text: &str) -> Result<WsClientMessage, ApiError> {
    crate::extract::parse_json(text.as_bytes())
}

/// Waits for the `ExecRequest` of `.../exec/ws`; `Ok(None)` if the client left first.
async fn first_request(source: &mut SplitStream<WebSocket>) -> Result<Option<ExecRequest>, ApiError> {
    let wait = async {
        while let Some(Ok(message)) = source.next().await {
            match message {
                Message::Text(text) => return crate::extract::parse_json(text.as_bytes()).map(Some),
                Message::Binary(_) => {
                    return Err(ApiError::invalid(
                        None,
                        "the first message must be the ExecRequest as JSON text",
                    ))
                }
                Message::Close(_) => return Ok(None),
                Message::Ping(_) | Message::Pong(_) => {}
            }
        }
        Ok(None)
    };
    tokio::time::timeout(FIRST_MESSAGE_TIMEOUT, wait)
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                ErrorCode::Timeout,
                "no ExecRequest arrived within 30 seconds",
            ))
        })
}

/// Sends `error` as an `error` event, then closes (policy violation for bad requests, internal error
/// otherwise).
async fn close_with_error(sink: &mut SplitSink<WebSocket, Message>, error: &ApiError) {
    if let Some(message) = error_text(error) {
        let _ = sink.send(message).await;
    }
    let code = if error.code() == ErrorCode::InvalidRequest {
        close_code::POLICY
    } else {
        close_code::ERROR
    };
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: error.code().as_str().into(),
        })))
        .await;
}

#[cfg(test)]
mod tests {
    use paddock_control::OutputStream;
    use paddock_types::api::ExitInfo;

    use super::*;

    #[test]
    fn client_messages() {
        let cases = [
            (
                r#"{"type":"stdin","data":"ls\n"}"#,
                WsClientMessage::Stdin { data: "ls\n".into() },
            ),
            (
                r#"{"type":"stdin_b64","data":"AAE="}"#,
                WsClientMessage::StdinB64 { data: "AAE=".into() },
            ),
            (r#"{"type":"close_stdin"}"#, WsClientMessage::CloseStdin),
            (
                r#"{"type":"signal","signal":"TERM"}"#,
                WsClientMessage::Signal {
                    signal: serde_json::json!("TERM"),
                },
            ),
            (
                r#"{"type":"signal","signal":15}"#,
                WsClientMessage::Signal {
                    signal: serde_json::json!(15),
                },
            ),
            (
                r#"{"type":"resize","rows":50,"cols":132}"#,
                WsClientMessage::Resize { rows: 50, cols: 132 },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_client_message(text).expect(text), expected);
        }
    }

    #[test]
    fn bad_client_messages_become_error_events() {
        for text in [
            "not json",
            r#"{"type":"stdin"}"#,
            r#"{"type":"bogus"}"#,
            r#"{"data":"x"}"#,
            r#"{"type":"resize","rows":-1,"cols":80}"#,
            r#"{"type":"resize","rows":1,"cols":80,"extra":1}"#,
        ] {
            let e = parse_client_message(text).expect_err(text);
            assert_eq!(e.code(), ErrorCode::InvalidRequest, "{text}");
            let Some(Message::Text(reply)) = error_text(&e) else {
                panic!("an error event as text");
            };
            let event: ExecEvent = serde_json::from_str(reply.as_str()).expect("an ExecEvent");
            assert!(matches!(
                event,
                ExecEvent::Error {
                    code: ErrorCode::InvalidRequest,
                    ..
                }
            ));
        }
        assert_eq!(
            decode_b64("!!").expect_err("bad base64").body().field.as_deref(),
            Some("data")
        );
    }

    #[test]
    fn terminal_framing() {
        let out = || ExecOutput::Output {
            stream: OutputStream::Pty,
            offset: 0,
            data: Bytes::from_static(b"\x1b[2J"),
        };
        assert_eq!(
            frame(out(), Framing::Terminal),
            Some(Message::Binary(Bytes::from_static(b"\x1b[2J")))
        );
        assert_eq!(frame(ExecOutput::Started { pid: 3 }, Framing::Terminal), None);
        let info = ExitInfo {
            exit_code: 0,
            signal: None,
            timed_out: false,
            duration_ms: 1,
            cpu_time_us: 1,
            max_rss_kib: 1,
        };
        let Some(Message::Text(text)) = frame(ExecOutput::Exit(info), Framing::Terminal) else {
            panic!("exit is text");
        };
        assert_eq!(
            serde_json::from_str::<ExecEvent>(text.as_str()).expect("event"),
            ExecEvent::Exit(info)
        );
        // The events framing sends everything as JSON text.
        let Some(Message::Text(text)) = frame(out(), Framing::Events) else {
            panic!("text");
        };
        assert!(text.as_str().starts_with(r#"{"type":"pty""#));
        assert!(matches!(
            frame(ExecOutput::Started { pid: 3 }, Framing::Events),
            Some(Message::Text(_))
        ));
    }

    #[test]
    fn pty_requests() {
        let req = pty_request(PtyQuery::default());
        assert_eq!(req.shell.as_deref(), Some(DEFAULT_TERMINAL_SHELL));
        assert_eq!(req.pty, Some(PtySizeBody { rows: 24, cols: 80 }));
        assert!(req.stdin_open && !req.background);
        assert_eq!(req.argv, None);
        let req = pty_request(PtyQuery {
            rows: Some(40),
            cols: Some(100),
            cmd: Some("top".into()),
            cwd: Some("/tmp".into()),
            user: Some("root".into()),
        });
        assert_eq!(req.shell.as_deref(), Some("top"));
        assert_eq!(req.pty, Some(PtySizeBody { rows: 40, cols: 100 }));
        assert_eq!(req.cwd.as_deref(), Some("/tmp"));
        assert_eq!(req.user.as_deref(), Some("root"));
    }

    #[test]
    fn default_shell_falls_back_without_bash() {
        // dash exits when `exec` fails, so the fallback cannot be `exec bash || exec sh`.
        let out = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(
                DEFAULT_TERMINAL_SHELL
                    .replace("/bin/bash", "/nonexistent/bash")
                    .replace("-l", "-c 'echo fallback'"),
            )
            .output()
            .expect("sh runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "fallback");
    }
}
