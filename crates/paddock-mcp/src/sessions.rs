//! A bound on the sessions of MCP's `initialize`-based protocol generation on `/mcp`: rmcp's
//! in-memory session manager, refusing a new session once `max` are open. (Each session holds a
//! task and its channels until the client closes it or five idle minutes pass; every one needs a
//! valid key, but one key could otherwise open them without end.) The stateless 2026-07-28
//! generation opens none.
//!
//! What it does not do: answer the refusal (the endpoint's layer refuses the request before it
//! gets here while the bound is reached, with a JSON error; this check is the backstop for
//! requests that raced past it), or bound sessions per tenant.

use std::sync::Arc;

use futures_util::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::ServerSseMessage;
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    /// The bound is reached.
    #[error(
        "{max} MCP sessions are open, the most this server keeps; close one or use the stateless protocol"
    )]
    Full { max: usize },
    /// rmcp's manager failed.
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
}

/// rmcp's [`LocalSessionManager`] with at most `max` sessions.
#[derive(Debug)]
pub struct BoundedSessions {
    inner: LocalSessionManager,
    max: usize,
}

impl BoundedSessions {
    /// At most `max` sessions (rmcp's defaults otherwise).
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: LocalSessionManager::default(),
            max,
        })
    }

    /// Whether no session can be opened now.
    pub async fn full(&self) -> bool {
        self.inner.sessions.read().await.len() >= self.max
    }

    /// The sessions open now.
    pub async fn open(&self) -> usize {
        self.inner.sessions.read().await.len()
    }
}

/// A session's stream, boxed: the inner manager's stream type names the borrows of its call.
type SseStream = std::pin::Pin<Box<dyn Stream<Item = ServerSseMessage> + Send + Sync + 'static>>;

impl SessionManager for BoundedSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        if self.full().await {
            return Err(SessionsError::Full { max: self.max });
        }
        Ok(self.inner.create_session().await?)
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.inner.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.inner.has_session(id).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        Ok(self.inner.close_session(id).await?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(Box::pin(self.inner.create_stream(id, message).await?) as SseStream)
    }

    async fn accept_message(&self, id: &SessionId, message: ClientJsonRpcMessage) -> Result<(), Self::Error> {
        Ok(self.inner.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(Box::pin(self.inner.create_standalone_stream(id).await?) as SseStream)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(Box::pin(self.inner.resume(id, last_event_id).await?) as SseStream)
    }
}
