//! Sending frames to one connection: every message for a connection (replies, output, exits) goes
//! through one bounded queue that its writer task drains, so a host that stops reading stops
//! whatever produces for it (request handling and process output alike) instead of growing memory.

use paddock_protocol::{encode_frame, AgentError, AgentMessage, ErrorCode, Reply};
use tokio::sync::mpsc;

use crate::error_code::agent_error;

/// A successful answer: the reply and its payload.
pub(crate) type Answer = Result<(Reply, Vec<u8>), AgentError>;

/// The connection is gone; nothing more can be sent to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionClosed;

/// The sending side of one connection.
#[derive(Debug, Clone)]
pub(crate) struct Outbound {
    conn_id: u64,
    tx: mpsc::Sender<Vec<u8>>,
}

impl Outbound {
    /// Wraps the queue of connection `conn_id`.
    pub(crate) fn new(conn_id: u64, tx: mpsc::Sender<Vec<u8>>) -> Self {
        Self { conn_id, tx }
    }

    /// The connection's id (unique for the agent's lifetime).
    pub(crate) fn conn_id(&self) -> u64 {
        self.conn_id
    }

    /// Queues one message with its payload, waiting while the queue is full.
    pub(crate) async fn send(&self, message: &AgentMessage, payload: &[u8]) -> Result<(), ConnectionClosed> {
        let mut frame = Vec::new();
        if let Err(err) = encode_frame(message, payload, &mut frame) {
            // Only a reply can get too large (a listing); callers keep them small, so this is a bug.
            tracing::error!(error = %err, "dropping an unencodable message");
            return Ok(());
        }
        self.tx.send(frame).await.map_err(|_| ConnectionClosed)
    }

    /// Queues the answer to request `id`: a reply with its payload, or an error.
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
