//! One host connection to the double: frames in (bounded by the protocol's limits), the handshake,
//! requests answered in arrival order, and a writer task draining the connection's bounded queue.
//! A malformed frame closes the connection; a well-formed unknown request gets `bad_request`, as the
//! real agent's `connection.rs`.

use std::sync::Arc;

use paddock_protocol::frame::{decode_prefix, PREFIX_LEN};
use paddock_protocol::{ErrorCode, Reply, Request, PROTOCOL_VERSION};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::outbound::{agent_error, Answer, ConnectionClosed, Outbound};
use super::{files, lock, process, watch, Agent};

/// Frames queued for a connection before producers wait.
const OUTBOUND_QUEUE: usize = 16;

/// A request header whose `request` is parsed separately, so an unknown one can still be answered.
#[derive(Debug, Deserialize)]
struct RawMessage {
    id: u64,
    request: serde_json::Value,
}

/// Serves one connection until the host closes it or sends a malformed frame.
pub(crate) async fn serve(agent: Arc<Agent>, stream: UnixStream) {
    let conn = agent.next_connection();
    let (read, write) = stream.into_split();
    let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
    agent.spawn(write_frames(write, rx));
    let out = Outbound::new(conn, tx);
    let mut reader = BufReader::new(read);
    let mut greeted = false;
    while let Ok(Some((header, payload))) = read_frame(&mut reader).await {
        // A frozen agent reads nothing more until it is thawed.
        agent.until_running().await;
        let Ok(raw) = serde_json::from_slice::<RawMessage>(&header) else {
            break;
        };
        let request = match serde_json::from_value::<Request>(raw.request) {
            Ok(request) => request,
            Err(err) => {
                let error = agent_error(
                    ErrorCode::BadRequest,
                    format!("unknown or malformed request: {err}"),
                );
                if out.answer(raw.id, Err(error)).await.is_err() {
                    break;
                }
                continue;
            }
        };
        let handled = if greeted {
            handle(&agent, &out, raw.id, request, payload).await
        } else {
            let answer = match request {
                Request::Hello { version } if version == PROTOCOL_VERSION => {
                    greeted = true;
                    Ok((
                        Reply::Hello {
                            version: PROTOCOL_VERSION,
                            agent_version: format!("fake-{}", env!("CARGO_PKG_VERSION")),
                        },
                        Vec::new(),
                    ))
                }
                Request::Hello { version } => Err(agent_error(
                    ErrorCode::UnsupportedVersion,
                    format!(
                        "protocol version {version} is not supported; this agent speaks {PROTOCOL_VERSION}"
                    ),
                )),
                _ => Err(agent_error(
                    ErrorCode::HandshakeRequired,
                    "the first request must be hello",
                )),
            };
            out.answer(raw.id, answer).await
        };
        if handled.is_err() {
            break;
        }
    }
    agent.disconnect(conn);
}

async fn write_frames(mut write: OwnedWriteHalf, mut rx: mpsc::Receiver<Vec<u8>>) {
    while let Some(frame) = rx.recv().await {
        if write.write_all(&frame).await.is_err() {
            return;
        }
    }
}

/// Reads one frame: `None` at a clean end of stream.
async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut prefix = [0u8; PREFIX_LEN];
    if reader.read(&mut prefix[..1]).await? == 0 {
        return Ok(None);
    }
    reader.read_exact(&mut prefix[1..]).await?;
    let (header_len, payload_len) = decode_prefix(prefix).map_err(std::io::Error::other)?;
    let mut header = vec![0u8; header_len];
    reader.read_exact(&mut header).await?;
    let mut payload = vec![0u8; payload_len];
    reader.read_exact(&mut payload).await?;
    Ok(Some((header, payload)))
}

/// Handles request `id` after the handshake; fails only when the connection is gone.
async fn handle(
    agent: &Arc<Agent>,
    out: &Outbound,
    id: u64,
    request: Request,
    payload: Vec<u8>,
) -> Result<(), ConnectionClosed> {
    match request {
        Request::Spawn(spawn) => {
            let process = match process::spawn(agent, &spawn) {
                Ok(process) => process,
                Err(err) => return out.answer(id, Err(err)).await,
            };
            if !spawn.detached {
                process.add_cursors(out.conn(), 0, 0);
            }
            let pid = process.pid();
            if let Err(closed) = out.answer(id, Ok((Reply::Spawned { pid }, Vec::new()))).await {
                process.unsubscribe(out.conn());
                return Err(closed);
            }
            if !spawn.detached {
                process::start_forwarding(agent, &process, out.clone());
            }
            Ok(())
        }
        Request::Attach {
            pid,
            stdout_from,
            stderr_from,
        } => {
            let found = lock(&agent.processes).get(pid);
            let process = match found {
                Ok(process) => process,
                Err(err) => return out.answer(id, Err(err)).await,
            };
            let (stdout_from, stderr_from) = process.add_cursors(out.conn(), stdout_from, stderr_from);
            let reply = Reply::Attached {
                stdout_from,
                stderr_from,
            };
            if let Err(closed) = out.answer(id, Ok((reply, Vec::new()))).await {
                process.unsubscribe(out.conn());
                return Err(closed);
            }
            process::start_forwarding(agent, &process, out.clone());
            Ok(())
        }
        Request::WriteStdin { pid, close } => {
            process::queue_stdin(agent, out, id, pid, close, payload).await;
            Ok(())
        }
        Request::Watch { path, recursive } => {
            watch::start(agent, out, id, &path, recursive).await;
            Ok(())
        }
        other => out.answer(id, answer(agent, out.conn(), other, &payload)).await,
    }
}

/// Requests answered at once.
fn answer(agent: &Agent, conn: u64, request: Request, payload: &[u8]) -> Answer {
    let done = Ok((Reply::Done, Vec::new()));
    let exited = |pid: u32| agent_error(ErrorCode::ProcessExited, format!("process {pid} has exited"));
    match request {
        Request::Hello { .. } => Err(agent_error(
            ErrorCode::HandshakeRequired,
            "hello was already received",
        )),
        Request::Signal { pid, signal } => {
            let process = lock(&agent.processes).get(pid)?;
            if !(0..=64).contains(&signal) {
                return Err(agent_error(
                    ErrorCode::BadRequest,
                    format!("invalid signal {signal}"),
                ));
            }
            if !process.signal(signal) {
                return Err(exited(pid));
            }
            done
        }
        Request::KillTree { pid, signal } => {
            let signal = signal.unwrap_or(libc::SIGKILL);
            if !(1..=64).contains(&signal) {
                return Err(agent_error(
                    ErrorCode::BadRequest,
                    format!("invalid signal {signal}"),
                ));
            }
            lock(&agent.processes).get(pid)?.signal(signal);
            done
        }
        Request::Resize { pid, size } => {
            let process = lock(&agent.processes).get(pid)?;
            if process.exit_status().is_some() {
                return Err(exited(pid));
            }
            if !process.resize(size) {
                return Err(agent_error(
                    ErrorCode::BadRequest,
                    format!("process {pid} has no PTY"),
                ));
            }
            done
        }
        // The fake agent is not a sandbox's PID 1: there is nothing for a hold to end.
        Request::Hold => done,
        Request::ListProcesses => Ok((
            Reply::Processes {
                processes: lock(&agent.processes).list(),
            },
            Vec::new(),
        )),
        Request::Detach { pid } => {
            lock(&agent.processes).get(pid)?.unsubscribe(conn);
            done
        }
        Request::Unwatch { watch_id } => watch::unwatch(agent, conn, watch_id),
        Request::Spawn(_) | Request::Attach { .. } | Request::WriteStdin { .. } | Request::Watch { .. } => {
            Err(agent_error(ErrorCode::BadRequest, "request handled elsewhere"))
        }
        file_request => files::answer(agent, file_request, payload),
    }
}
