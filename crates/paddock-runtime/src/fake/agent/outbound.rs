//! Sending frames to one connection through one bounded queue that its writer task drains, so a
//! host that stops reading stops whatever produces for it (as the real agent's `outbound.rs`).

use paddock_protocol::{encode_frame, AgentError, AgentMessage, ErrorCode, Reply};
use tokio::sync::mpsc;

/// A successful answer: the reply and its payload.
pub(crate) type Answer = Result<(Reply, Vec<u8>), AgentError>;

/// The connection is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionClosed;

/// The sending side of one connection.
#[derive(Debug, Clone)]
pub(crate) struct Outbound {
    conn: u64,
    tx: mpsc::Sender<Vec<u8>>,
}

/// An [`AgentError`] with `code` and `message`.
pub(crate) fn agent_error(code: ErrorCode, message: impl Into<String>) -> AgentError {
    AgentError {
        code,
        message: message.into(),
    }
}

impl Outbound {
    pub(crate) fn new(conn: u64, tx: mpsc::Sender<Vec<u8>>) -> Self {
        Self { conn, tx }
    }

    pub(crate) fn conn(&self) -> u64 {
        self.conn
    }

    /// Queues one message with its payload, waiting while the queue is full.
    pub(crate) async fn send(&self, message: &AgentMessage, payload: &[u8]) -> Result<(), ConnectionClosed> {
        let mut frame = Vec::new();
        if let Err(err) = encode_frame(message, payload, &mut frame) {
            tracing::error!(error = %err, "the agent double dropped an unencodable message");
            return Ok(());
        }
        self.tx.send(frame).await.map_err(|_| ConnectionClosed)
    }

    /// Queues the answer to request `id`.
    pub(crate) async fn answer(&self, id: u64, answer: Answer) -> Result<(), ConnectionClosed> {
        let (message, payload) = match answer {
            Ok((body, payload)) => (AgentMessage::Reply { id, body }, payload),
            Err(error) => (AgentMessage::Error { id, error }, Vec::new()),
        };
        let mut frame = Vec::new();
        if let Err(err) = encode_frame(&message, &payload, &mut frame) {
            let error = agent_error(ErrorCode::Io, format!("reply does not fit in a frame: {err}"));
            return self.send(&AgentMessage::Error { id, error }, &[]).await;
        }
        self.tx.send(frame).await.map_err(|_| ConnectionClosed)
    }
}
