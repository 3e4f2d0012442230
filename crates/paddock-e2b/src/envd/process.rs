//! envd's `process.Process` service, answered from the service's process operations: Start,
//! Connect, List, SendInput, StreamInput, CloseStdin, SendSignal and Update.
//!
//! A process started here is the service's *background* process followed by a re-attach, never a
//! foreground exec: closing the Start stream must not kill it (E2B's semantics), and a later
//! Connect re-attaches to it by pid or tag. `Connect-Timeout-Ms` on Start is the process's lifetime
//! (the exec timeout); when it kills the process the stream ends with `deadline_exceeded`.
//!
//! Differences from envd, all from what the service offers: pids are the agent's pids inside the
//! sandbox; a late Connect gets only new output (as envd) and, for a process that has exited,
//! `start` and `end` for as long as the agent remembers it (its last 256 exited processes rather
//! than envd's 30 seconds); List reports `cmd` and `args` but not `envs` or `cwd` (the service
//! does not keep them); signals go to the process's whole tree; writing to a PTY process's stdin
//! is not refused (it reaches the terminal).
//!
//! It does not: run anything itself, write audit rows (the service does), or keep state between
//! calls.

use std::time::Duration;

use axum::extract::State;
use axum::response::Response;
use axum::routing::any;
use axum::Router;
use bytes::Bytes;
use futures_util::Stream;
use paddock_control::{ExecOutput, ExecStream, OutputStream, ServiceError};
use paddock_types::api::{
    AttachQuery, ErrorCode, ExecRequest, ExitInfo, KillRequest, ProcessCommand, PtySizeBody,
};

use crate::envd::connect::{
    client_stream_response, rpc, service_error, stream_error, stream_response, unary_response, unknown_rpc,
    CallMeta, ClientStream, StreamCall, StreamOptions, Unary,
};
use crate::envd::filesystem::paths::{resolve_path, UserContext};
use crate::envd::proto::process::{
    self as pb, process_event, process_input, process_selector, stream_input_request,
};
use crate::envd::EnvdCaller;
use crate::{ConnectCode, ConnectError, E2bState};

/// How long a Start stream outlives its process's deadline waiting for the exit the deadline
/// causes, before it ends with `deadline_exceeded` by itself.
const DEADLINE_GRACE: Duration = Duration::from_secs(5);

/// Tags of processes the service runs for its own operations (tar transfers): not listed.
const INTERNAL_TAG_PREFIX: &str = "paddock:";

/// The process service's routes.
pub fn routes() -> Router<E2bState> {
    Router::new()
        .route("/process.Process/Start", rpc(start))
        .route("/process.Process/Connect", rpc(connect))
        .route("/process.Process/List", rpc(list))
        .route("/process.Process/SendInput", rpc(send_input))
        .route("/process.Process/StreamInput", rpc(stream_input))
        .route("/process.Process/CloseStdin", rpc(close_stdin))
        .route("/process.Process/SendSignal", rpc(send_signal))
        .route("/process.Process/Update", rpc(update))
        .route("/process.Process/{*method}", any(unknown))
}

async fn unknown(uri: axum::http::Uri) -> Response {
    unknown_rpc(uri.path())
}

/// The events of a Start or Connect stream (both wrap a `ProcessEvent`).
trait EventMessage: crate::envd::proto::RpcMessage {
    fn wrap(event: process_event::Event) -> Self;
}

impl EventMessage for pb::StartResponse {
    fn wrap(event: process_event::Event) -> Self {
        Self {
            event: Some(pb::ProcessEvent { event: Some(event) }),
        }
    }
}

impl EventMessage for pb::ConnectResponse {
    fn wrap(event: process_event::Event) -> Self {
        Self {
            event: Some(pb::ProcessEvent { event: Some(event) }),
        }
    }
}

fn keepalive<M: EventMessage>() -> M {
    M::wrap(process_event::Event::Keepalive(process_event::KeepAlive {}))
}

/// A process error: an unknown pid as envd says it, else the service's error.
fn process_error(e: ServiceError, pid: u32) -> ConnectError {
    match e.code {
        ErrorCode::ProcessNotFound => {
            ConnectError::new(ConnectCode::NotFound, format!("process with pid {pid} not found"))
        }
        _ => service_error(e),
    }
}

async fn start(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: StreamCall<pb::StartRequest>,
) -> Response {
    let StreamCall { meta, msg } = call;
    let options = StreamOptions {
        codec: meta.codec,
        deadline: meta.deadline().map(|d| d + DEADLINE_GRACE),
        keepalive: meta.keepalive,
    };
    match start_process(&state, &caller, &meta, msg).await {
        Ok(stream) => stream_response(
            options,
            process_events::<pb::StartResponse>(stream, true),
            keepalive::<pb::StartResponse>,
        ),
        Err(e) => stream_error(meta.codec, e),
    }
}

async fn start_process(
    state: &E2bState,
    caller: &EnvdCaller,
    meta: &CallMeta,
    msg: pb::StartRequest,
) -> Result<ExecStream, ConnectError> {
    let config = msg
        .process
        .ok_or_else(|| ConnectError::new(ConnectCode::InvalidArgument, "process config is required"))?;
    if config.cmd.is_empty() {
        return Err(ConnectError::new(ConnectCode::InvalidArgument, "cmd is required"));
    }
    // The user's home is needed only to resolve a relative or `~` directory: otherwise the user
    // (known or not) and the default directory (the sandbox's working directory, else the user's
    // home) are the service's and the agent's to settle, as for a `/v1` exec, saving two reads of
    // the sandbox's account files on every command.
    let (cwd, user) = match config.cwd.as_deref().filter(|c| !c.is_empty()) {
        None => (None, meta.user.clone()),
        Some(cwd) if cwd.starts_with('/') => (Some(resolve_path(cwd, "/")?), meta.user.clone()),
        Some(cwd) => {
            let user = UserContext::load(state, caller, meta.user.as_deref()).await?;
            (Some(resolve_path(cwd, &user.home)?), Some(user.name))
        }
    };
    let pty = msg
        .pty
        .map(|p| pty_size(p.size.unwrap_or(pb::pty::Size { cols: 80, rows: 24 })));
    let user_name = user.clone().unwrap_or_default();
    let mut argv = vec![config.cmd];
    argv.extend(config.args);
    let request = ExecRequest {
        argv: Some(argv),
        shell: None,
        env: config.envs,
        cwd: cwd.clone(),
        user,
        timeout_ms: meta.timeout.map(|t| t.as_millis() as u64).filter(|ms| *ms > 0),
        stdin: None,
        stdin_open: msg.stdin.unwrap_or(true) || pty.is_some(),
        background: true,
        tag: msg.tag,
        pty,
        approval_id: None,
        approval_wait_ms: None,
    };
    let started = state
        .service
        .exec(&caller.principal, &caller.id, request)
        .await
        .map_err(|e| exec_error(e, cwd.as_deref().unwrap_or("~"), &user_name))?;
    let pid = started.pid();
    let query = AttachQuery {
        stdout_from: 0,
        stderr_from: 0,
        follow: Some(true),
    };
    state
        .service
        .attach_process(&caller.principal, &caller.id, pid, query)
        .await
        .map_err(|e| process_error(e, pid))
}

/// envd's terminal size in paddock's terms (a dimension past `u16` is the largest one).
fn pty_size(size: pb::pty::Size) -> PtySizeBody {
    PtySizeBody {
        rows: u16::try_from(size.rows).unwrap_or(u16::MAX),
        cols: u16::try_from(size.cols).unwrap_or(u16::MAX),
    }
}

/// A failed exec as envd reports it: a bad working directory or user by envd's words.
fn exec_error(e: ServiceError, cwd: &str, user: &str) -> ConnectError {
    match e.field.as_deref() {
        Some("cwd") => ConnectError::new(
            ConnectCode::InvalidArgument,
            format!("cwd '{cwd}' does not exist"),
        ),
        Some("user") => ConnectError::new(
            ConnectCode::Unauthenticated,
            format!("invalid username: '{user}'"),
        ),
        _ => service_error(e),
    }
}

/// A process's events as envd sends them: `start`, `data`, then `end` (or, for a Start whose
/// deadline killed the process, `deadline_exceeded`; for a sandbox gone, `unavailable`).
fn process_events<M: EventMessage>(
    stream: ExecStream,
    deadline_is_error: bool,
) -> impl Stream<Item = Result<M, ConnectError>> + Send + 'static {
    futures_util::stream::unfold(Some(stream), move |stream| async move {
        let mut stream = stream?;
        let item = match stream.recv().await? {
            ExecOutput::Started { pid } => {
                Ok(M::wrap(process_event::Event::Start(process_event::StartEvent {
                    pid,
                })))
            }
            ExecOutput::Output {
                stream: which, data, ..
            } => {
                let data = data.to_vec();
                let output = match which {
                    OutputStream::Stdout => process_event::data_event::Output::Stdout(data),
                    OutputStream::Stderr => process_event::data_event::Output::Stderr(data),
                    OutputStream::Pty => process_event::data_event::Output::Pty(data),
                };
                Ok(M::wrap(process_event::Event::Data(process_event::DataEvent {
                    output: Some(output),
                })))
            }
            ExecOutput::Exit(info) if info.timed_out && deadline_is_error => {
                return Some((
                    Err(ConnectError::new(
                        ConnectCode::DeadlineExceeded,
                        "the process was killed when the call's deadline passed",
                    )),
                    None,
                ));
            }
            ExecOutput::Exit(info) => {
                return Some((Ok(M::wrap(process_event::Event::End(end_event(&info)))), None));
            }
            ExecOutput::Error { code, message } => {
                return Some((Err(service_error(ServiceError::new(code, message))), None));
            }
        };
        Some((item, Some(stream)))
    })
}

/// An exit as envd reports it (Go's `ProcessState`): a signal gives exit code -1, `exited` false
/// and `signal: <name>`; an exit `exit status N`. A non-zero end carries its status as `error`,
/// as Go's `Wait` error reads.
pub fn end_event(info: &ExitInfo) -> process_event::EndEvent {
    match info.signal {
        Some(signal) => {
            let status = format!("signal: {}", signal_name(signal));
            process_event::EndEvent {
                exit_code: -1,
                exited: false,
                error: Some(status.clone()),
                status,
            }
        }
        None => {
            let status = format!("exit status {}", info.exit_code);
            process_event::EndEvent {
                exit_code: info.exit_code,
                exited: true,
                error: (info.exit_code != 0).then(|| status.clone()),
                status,
            }
        }
    }
}

/// Go's name of a Linux signal (`syscall.Signal.String()`).
fn signal_name(signal: i32) -> String {
    let name = match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}

/// The pid a selector names: a pid as given, a tag by the running process that has it.
async fn selected_pid(
    state: &E2bState,
    caller: &EnvdCaller,
    selector: Option<pb::ProcessSelector>,
) -> Result<u32, ConnectError> {
    match selector.and_then(|s| s.selector) {
        Some(process_selector::Selector::Pid(pid)) => Ok(pid),
        Some(process_selector::Selector::Tag(tag)) => {
            let list = state
                .service
                .list_processes(&caller.principal, &caller.id)
                .await
                .map_err(service_error)?;
            list.processes
                .iter()
                .filter(|p| p.tag.as_deref() == Some(tag.as_str()))
                .max_by_key(|p| (p.running, p.started_at.clone()))
                .map(|p| p.pid)
                .ok_or_else(|| {
                    ConnectError::new(ConnectCode::NotFound, format!("process with tag {tag} not found"))
                })
        }
        None => Err(ConnectError::new(
            ConnectCode::InvalidArgument,
            "a process selector (pid or tag) is required",
        )),
    }
}

/// The selected process if it is still running: envd signals live processes only (an exited one
/// answers `not_found`, so the SDK's `kill` returns false), while the agent remembers exited ones.
async fn running_pid(
    state: &E2bState,
    caller: &EnvdCaller,
    selector: Option<pb::ProcessSelector>,
) -> Result<u32, ConnectError> {
    let pid = selected_pid(state, caller, selector).await?;
    let list = state
        .service
        .list_processes(&caller.principal, &caller.id)
        .await
        .map_err(service_error)?;
    if list.processes.iter().any(|p| p.pid == pid && p.running) {
        Ok(pid)
    } else {
        Err(ConnectError::new(
            ConnectCode::NotFound,
            format!("process with pid {pid} not found"),
        ))
    }
}

async fn connect(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: StreamCall<pb::ConnectRequest>,
) -> Response {
    let StreamCall { meta, msg } = call;
    let options = StreamOptions {
        codec: meta.codec,
        deadline: meta.deadline(),
        keepalive: meta.keepalive,
    };
    let attached = async {
        let pid = selected_pid(&state, &caller, msg.process).await?;
        // Only new output, as envd's late Connect: the cursors start at the end of what is buffered.
        let query = AttachQuery {
            stdout_from: u64::MAX,
            stderr_from: u64::MAX,
            follow: Some(true),
        };
        state
            .service
            .attach_process(&caller.principal, &caller.id, pid, query)
            .await
            .map_err(|e| process_error(e, pid))
    };
    match attached.await {
        Ok(stream) => stream_response(
            options,
            process_events::<pb::ConnectResponse>(stream, false),
            keepalive::<pb::ConnectResponse>,
        ),
        Err(e) => stream_error(meta.codec, e),
    }
}

async fn list(caller: EnvdCaller, State(state): State<E2bState>, call: Unary<pb::ListRequest>) -> Response {
    let result = state
        .service
        .list_processes(&caller.principal, &caller.id)
        .await
        .map_err(service_error)
        .map(|list| pb::ListResponse {
            processes: list
                .processes
                .into_iter()
                .filter(|p| p.running)
                .filter(|p| {
                    !p.tag
                        .as_deref()
                        .is_some_and(|t| t.starts_with(INTERNAL_TAG_PREFIX))
                })
                .map(|p| {
                    let (cmd, args) = match p.command {
                        ProcessCommand::Argv { mut argv } => {
                            let cmd = if argv.is_empty() {
                                String::new()
                            } else {
                                argv.remove(0)
                            };
                            (cmd, argv)
                        }
                        ProcessCommand::Shell { script } => {
                            ("/bin/sh".to_owned(), vec!["-c".to_owned(), script])
                        }
                    };
                    pb::ProcessInfo {
                        config: Some(pb::ProcessConfig {
                            cmd,
                            args,
                            envs: Default::default(),
                            cwd: None,
                        }),
                        pid: p.pid,
                        tag: p.tag,
                    }
                })
                .collect(),
        });
    unary_response(call.meta.codec, result)
}

/// Writes input to a process (stdin and terminal input both go to the process's input).
async fn write_input(
    state: &E2bState,
    caller: &EnvdCaller,
    pid: u32,
    input: Option<pb::ProcessInput>,
) -> Result<(), ConnectError> {
    let data = match input.and_then(|i| i.input) {
        Some(process_input::Input::Stdin(data) | process_input::Input::Pty(data)) => data,
        None => return Ok(()),
    };
    state
        .service
        .write_stdin(&caller.principal, &caller.id, pid, Bytes::from(data), false)
        .await
        .map_err(|e| stdin_error(e, pid))
}

/// A refused write: no such process, or one without stdin (envd's words).
fn stdin_error(e: ServiceError, pid: u32) -> ConnectError {
    match e.code {
        ErrorCode::ProcessNotFound if e.message.ends_with("has exited") => {
            ConnectError::new(ConnectCode::NotFound, format!("process with pid {pid} not found"))
        }
        ErrorCode::ProcessNotFound => process_error(e, pid),
        ErrorCode::InvalidRequest => ConnectError::new(ConnectCode::Internal, "stdin not enabled or closed"),
        _ => service_error(e),
    }
}

async fn send_input(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: Unary<pb::SendInputRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let pid = selected_pid(&state, &caller, msg.process).await?;
        write_input(&state, &caller, pid, msg.input).await?;
        Ok(pb::SendInputResponse {})
    };
    unary_response(meta.codec, result.await)
}

async fn stream_input(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: ClientStream<pb::StreamInputRequest>,
) -> Response {
    let ClientStream { meta, mut messages } = call;
    let result = async {
        let mut pid = None;
        while let Some(message) = messages.next().await {
            match (message?.event, pid) {
                (Some(stream_input_request::Event::Start(start)), None) => {
                    pid = Some(selected_pid(&state, &caller, start.process).await?);
                }
                (Some(stream_input_request::Event::Start(_)), Some(_)) => {
                    return Err(ConnectError::new(
                        ConnectCode::InvalidArgument,
                        "the input stream has already started",
                    ));
                }
                (Some(stream_input_request::Event::Data(data)), Some(pid)) => {
                    write_input(&state, &caller, pid, data.input).await?;
                }
                (Some(stream_input_request::Event::Data(_)), None) => {
                    return Err(ConnectError::new(
                        ConnectCode::FailedPrecondition,
                        "the input stream must start with a start event",
                    ));
                }
                (Some(stream_input_request::Event::Keepalive(_)) | None, _) => {}
            }
        }
        Ok(pb::StreamInputResponse {})
    };
    client_stream_response(meta.codec, result.await)
}

async fn close_stdin(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: Unary<pb::CloseStdinRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let pid = selected_pid(&state, &caller, msg.process).await?;
        state
            .service
            .write_stdin(&caller.principal, &caller.id, pid, Bytes::new(), true)
            .await
            .map_err(|e| stdin_error(e, pid))?;
        Ok(pb::CloseStdinResponse {})
    };
    unary_response(meta.codec, result.await)
}

async fn send_signal(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: Unary<pb::SendSignalRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let name = match pb::Signal::try_from(msg.signal) {
            Ok(pb::Signal::Sigkill) => "KILL",
            Ok(pb::Signal::Sigterm) => "TERM",
            _ => {
                return Err(ConnectError::new(
                    ConnectCode::Unimplemented,
                    format!("invalid signal: {}", msg.signal),
                ))
            }
        };
        let pid = running_pid(&state, &caller, msg.process).await?;
        let request = KillRequest {
            signal: Some(serde_json::Value::String(name.to_owned())),
        };
        state
            .service
            .kill_process(&caller.principal, &caller.id, pid, request)
            .await
            .map_err(|e| process_error(e, pid))?;
        Ok(pb::SendSignalResponse {})
    };
    unary_response(meta.codec, result.await)
}

async fn update(
    caller: EnvdCaller,
    State(state): State<E2bState>,
    call: Unary<pb::UpdateRequest>,
) -> Response {
    let Unary { meta, msg } = call;
    let result = async {
        let pid = selected_pid(&state, &caller, msg.process).await?;
        if let Some(size) = msg.pty.and_then(|p| p.size) {
            let size = pty_size(size);
            state
                .service
                .resize_pty(&caller.principal, &caller.id, pid, size)
                .await
                .map_err(|e| match e.code {
                    ErrorCode::InvalidRequest => ConnectError::new(ConnectCode::InvalidArgument, e.message),
                    _ => process_error(e, pid),
                })?;
        }
        Ok(pb::UpdateResponse {})
    };
    unary_response(meta.codec, result.await)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32, signal: Option<i32>) -> ExitInfo {
        ExitInfo {
            exit_code: code,
            signal,
            timed_out: false,
            duration_ms: 1,
            cpu_time_us: 0,
            max_rss_kib: 0,
        }
    }

    #[test]
    fn exits_read_as_gos_process_state() {
        let ok = end_event(&exit(0, None));
        assert_eq!(
            (ok.exit_code, ok.exited, ok.status.as_str(), ok.error),
            (0, true, "exit status 0", None)
        );
        let failed = end_event(&exit(3, None));
        assert_eq!(failed.status, "exit status 3");
        assert_eq!(failed.error.as_deref(), Some("exit status 3"));
        let killed = end_event(&exit(137, Some(9)));
        assert_eq!((killed.exit_code, killed.exited), (-1, false));
        assert_eq!(killed.status, "signal: killed");
        assert_eq!(end_event(&exit(143, Some(15))).status, "signal: terminated");
        assert_eq!(end_event(&exit(128 + 40, Some(40))).status, "signal: signal 40");
    }
}
