//! One host connection: reading frames, the handshake, and the writer task that drains the
//! connection's outbound queue.
//!
//! Requests are handled one after the other in arrival order; none blocks for long (stdin writes
//! are queued per process, output is forwarded by separate tasks). A malformed frame closes this
//! connection only; a well-formed frame with an unknown request gets `BadRequest`.

use std::io;
use std::rc::Rc;

use paddock_protocol::frame::{decode_prefix, PREFIX_LEN};
use paddock_protocol::{ErrorCode, FrameError, Reply, Request, PROTOCOL_VERSION};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use crate::agent::Agent;
use crate::dispatch::handle_request;
use crate::error_code::agent_error;
use crate::outbound::Outbound;

/// Frames queued for a connection before producers wait (output frames are at most 64 KiB).
const OUTBOUND_QUEUE: usize = 16;
/// Read buffer per connection.
const READ_BUFFER: usize = 16 * 1024;

/// Why a connection was closed by the agent.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("failed to read from the connection")]
    Read(#[source] io::Error),
    #[error("malformed frame")]
    Frame(#[source] FrameError),
    #[error("malformed frame header")]
    Header(#[source] serde_json::Error),
    #[error("the connection's writer is gone")]
    Closed,
}

/// A request header whose `request` is parsed separately, so an unknown request can still be
/// answered under its id.
#[derive(Debug, Deserialize)]
struct RawMessage {
    id: u64,
    request: serde_json::Value,
}

/// Serves one connection until the host closes it or sends a malformed frame.
pub(crate) async fn serve_connection(agent: Rc<Agent>, stream: UnixStream) {
    let conn = agent.next_connection_id();
    let (read, write) = stream.into_split();
    let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE);
    let writer = tokio::task::spawn_local(write_frames(write, rx));
    let out = Outbound::new(conn, tx);
    tracing::debug!(conn, "connection opened");
    let result = read_requests(&agent, read, &out).await;
    agent.disconnect(conn);
    drop(out);
    match result {
        Ok(()) => tracing::debug!(conn, "connection closed by the host"),
        Err(err) => {
            tracing::warn!(conn, error = %err, "closing connection");
            writer.abort();
        }
    }
}

async fn write_frames(mut write: OwnedWriteHalf, mut rx: mpsc::Receiver<Vec<u8>>) {
    while let Some(frame) = rx.recv().await {
        if let Err(err) = write.write_all(&frame).await {
            tracing::debug!(error = %err, "connection write failed");
            return;
        }
    }
}

async fn read_requests(
    agent: &Rc<Agent>,
    read: OwnedReadHalf,
    out: &Outbound,
) -> Result<(), ConnectionError> {
    let mut reader = BufReader::with_capacity(READ_BUFFER, read);
    let mut greeted = false;
    while let Some((header, payload)) = read_frame(&mut reader).await? {
        let raw: RawMessage = serde_json::from_slice(&header).map_err(ConnectionError::Header)?;
        let id = raw.id;
        let request = match serde_json::from_value::<Request>(raw.request) {
            Ok(request) => request,
            Err(err) => {
                let error = agent_error(
                    ErrorCode::BadRequest,
                    format!("unknown or malformed request: {err}"),
                );
                out.answer(id, Err(error))
                    .await
                    .map_err(|_| ConnectionError::Closed)?;
                continue;
            }
        };
        if greeted {
            handle_request(agent, out, id, request, payload)
                .await
                .map_err(|_| ConnectionError::Closed)?;
            continue;
        }
        let answer = match request {
            Request::Hello { version } if version == PROTOCOL_VERSION => {
                greeted = true;
                let agent_version = env!("CARGO_PKG_VERSION").to_owned();
                Ok((
                    Reply::Hello {
                        version: PROTOCOL_VERSION,
                        agent_version,
                    },
                    Vec::new(),
                ))
            }
            Request::Hello { version } => Err(agent_error(
                ErrorCode::UnsupportedVersion,
                format!("protocol version {version} is not supported; this agent speaks {PROTOCOL_VERSION}"),
            )),
            _ => Err(agent_error(
                ErrorCode::HandshakeRequired,
                "the first request must be hello",
            )),
        };
        out.answer(id, answer)
            .await
            .map_err(|_| ConnectionError::Closed)?;
    }
    Ok(())
}

/// Reads one frame: `None` at a clean end of stream (between frames).
async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<(Vec<u8>, Vec<u8>)>, ConnectionError> {
    let mut prefix = [0u8; PREFIX_LEN];
    if reader
        .read(&mut prefix[..1])
        .await
        .map_err(ConnectionError::Read)?
        == 0
    {
        return Ok(None);
    }
    reader
        .read_exact(&mut prefix[1..])
        .await
        .map_err(ConnectionError::Read)?;
    let (header_len, payload_len) = decode_prefix(prefix).map_err(ConnectionError::Frame)?;
    let mut header = vec![0u8; header_len];
    reader
        .read_exact(&mut header)
        .await
        .map_err(ConnectionError::Read)?;
    let mut payload = vec![0u8; payload_len];
    reader
        .read_exact(&mut payload)
        .await
        .map_err(ConnectionError::Read)?;
    Ok(Some((header, payload)))
}
