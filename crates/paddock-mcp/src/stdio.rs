//! MCP over stdio (`paddock mcp`): newline-delimited JSON-RPC on stdin and stdout, either served
//! here by a [`PaddockMcp`] of one principal ([`serve`], the embedded `--local` service), or
//! relayed to a `paddock serve`'s `/mcp` ([`relay`]), message by message, so a stdio client gets
//! exactly the server's tools, in whichever protocol generation it speaks.
//!
//! The relay is rmcp's two transports joined: its stdio server transport reads the client's
//! messages and its Streamable HTTP client transport sends them (the `initialize` handshake and
//! session of the older generation, or the 2026-07-28 generation's per-request headers, and
//! cancellation by closing a request's stream); every message the server sends back goes to
//! stdout. The client's messages reach the server in the order it sent them.
//!
//! What it does not do: write anything but protocol messages to stdout (logs go to stderr), keep
//! running once stdin closes, or authenticate (the server does, with the key it is given).

use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{IntoTransport, StreamableHttpClientTransport, Transport};
use rmcp::{RoleClient, RoleServer, ServiceExt as _};
use tokio::sync::mpsc;

use crate::PaddockMcp;

/// Why stdio serving or relaying stopped short.
#[derive(Debug, thiserror::Error)]
pub enum StdioError {
    /// The client's first messages were not a session's start.
    #[error("the MCP client did not start a session: {0}")]
    Start(String),
    /// Writing to stdout failed (the client went away).
    #[error("writing to the MCP client failed: {0}")]
    Client(String),
    /// The server could not be reached or refused the relay.
    #[error("relaying to {url} failed: {message}")]
    Server { url: String, message: String },
}

/// Serves `server`'s tools on stdin/stdout until the client closes stdin.
pub async fn serve(server: PaddockMcp) -> Result<(), StdioError> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| StdioError::Start(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| StdioError::Start(e.to_string()))?;
    Ok(())
}

/// Relays stdin/stdout to the Streamable HTTP endpoint `url` (a server's `/mcp`), authenticated
/// with `api_key` as a bearer token, until the client closes stdin or the server ends the
/// session.
pub async fn relay(url: &str, api_key: &str) -> Result<(), StdioError> {
    let config =
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(api_key.to_owned());
    let mut server: StreamableHttpClientTransport<_> = StreamableHttpClientTransport::from_config(config);
    let mut client = IntoTransport::<RoleServer, std::io::Error, _>::into_transport(rmcp::transport::stdio());
    // The client's messages go to the server in the order it sent them (a session's
    // `notifications/initialized` before its next request): one task sends them one after the
    // other. A send ends once the server has taken the message (a request's answer streams on
    // afterwards), so a long tool call does not hold up the next message.
    let (queue, mut queued) = mpsc::channel::<SendFuture>(SEND_QUEUE);
    let mut sender = tokio::spawn(async move {
        while let Some(send) = queued.recv().await {
            send.await?;
        }
        Ok::<(), String>(())
    });
    let failure = |message: String| StdioError::Server {
        url: url.to_owned(),
        message,
    };
    let result = loop {
        tokio::select! {
            from_client = Transport::<RoleServer>::receive(&mut client) => match from_client {
                Some(message) => {
                    let send = Transport::<RoleClient>::send(&mut server, message);
                    let send: SendFuture = Box::pin(async move { send.await.map_err(|e| e.to_string()) });
                    if queue.send(send).await.is_err() {
                        break Err(failure("the relay's sender stopped".to_owned()));
                    }
                }
                None => break Ok(()),
            },
            from_server = Transport::<RoleClient>::receive(&mut server) => match from_server {
                Some(message) => {
                    if let Err(e) = Transport::<RoleServer>::send(&mut client, message).await {
                        break Err(StdioError::Client(e.to_string()));
                    }
                }
                None => break Ok(()),
            },
            sent = &mut sender => match sent {
                Ok(Ok(())) => break Ok(()),
                Ok(Err(e)) => break Err(failure(e)),
                Err(e) => break Err(failure(e.to_string())),
            },
        }
    };
    sender.abort();
    if let Err(e) = Transport::<RoleClient>::close(&mut server).await {
        tracing::debug!(error = %e, "closing the relay's session");
    }
    result
}

/// A send of one client message to the server, started in order.
type SendFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send>>;

/// Client messages waiting to be sent (reading stdin waits beyond this).
const SEND_QUEUE: usize = 64;
