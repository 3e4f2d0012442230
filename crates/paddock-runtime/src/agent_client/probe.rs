//! A blocking handshake with an agent: is one there, and does it speak our protocol version? For
//! callers on a blocking thread without an async runtime (a backend adopting a sandbox after a
//! restart). The connection is closed afterwards; talking to the agent is [`super::AgentClient`]'s.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use paddock_protocol::{
    decode_prefix, encode_frame, AgentMessage, ClientMessage, Reply, Request, PREFIX_LEN, PROTOCOL_VERSION,
};

use super::{unexpected, AgentClientError};

/// Frames the agent may send before its answer to the hello (none today; a bound all the same).
const MAX_FRAMES_BEFORE_HELLO: usize = 16;

/// Connects to the agent at `path` and completes the handshake within `timeout`.
pub fn probe(path: &Path, timeout: Duration) -> Result<(), AgentClientError> {
    let deadline = Instant::now() + timeout;
    let connect_error = |source| AgentClientError::Connect {
        path: path.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(path).map_err(connect_error)?;
    let io_error = |op| move |source| AgentClientError::Io { op, source };
    stream
        .set_write_timeout(Some(timeout))
        .map_err(io_error("set a timeout"))?;
    let mut frame = Vec::new();
    let hello = ClientMessage {
        id: 1,
        request: Request::Hello {
            version: PROTOCOL_VERSION,
        },
    };
    encode_frame(&hello, &[], &mut frame).map_err(|e| AgentClientError::Protocol {
        detail: e.to_string(),
    })?;
    stream.write_all(&frame).map_err(io_error("send the hello"))?;
    for _ in 0..MAX_FRAMES_BEFORE_HELLO {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(AgentClientError::Timeout {
                op: "hello",
                after: timeout,
            });
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(io_error("set a timeout"))?;
        match read_message(&mut stream).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => AgentClientError::Timeout {
                op: "hello",
                after: timeout,
            },
            _ => AgentClientError::Io {
                op: "read the hello",
                source: e,
            },
        })? {
            AgentMessage::Reply {
                id: 1,
                body:
                    Reply::Hello {
                        version: PROTOCOL_VERSION,
                        ..
                    },
            } => return Ok(()),
            AgentMessage::Reply { id: 1, body } => return Err(unexpected("hello", &body)),
            AgentMessage::Error { id: 1, error } => return Err(AgentClientError::Agent(error)),
            _ => continue,
        }
    }
    Err(AgentClientError::Protocol {
        detail: "no answer to the hello among the agent's first frames".into(),
    })
}

/// Reads one frame (bounded by the protocol's limits, checked before any allocation) and decodes its
/// header.
fn read_message(stream: &mut UnixStream) -> io::Result<AgentMessage> {
    let mut prefix = [0u8; PREFIX_LEN];
    stream.read_exact(&mut prefix)?;
    let (header_len, payload_len) = decode_prefix(prefix).map_err(io::Error::other)?;
    let mut header = vec![0u8; header_len];
    stream.read_exact(&mut header)?;
    io::copy(&mut (&mut *stream).take(payload_len as u64), &mut io::sink())?;
    serde_json::from_slice(&header).map_err(io::Error::other)
}
