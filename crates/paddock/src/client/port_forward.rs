//! `paddock sandbox port-forward ID LOCAL:SANDBOX`: a local TCP listener whose every connection is
//! carried over a WebSocket of the API (`/v1/sandboxes/{id}/ports/{port}/tcp`) to the sandbox's
//! port. A connection the server refuses (nothing listens, the sandbox ended) is closed and named
//! on stderr; the listener goes on until Ctrl-C or SIGTERM. A sandbox that does not exist ends the
//! command at once.

use std::process::ExitCode;

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use paddock_types::api::SandboxInfo;
use reqwest::Method;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{signal, SignalKind};
use tokio_tungstenite::tungstenite::Message;

use super::ApiClient;
use crate::cli::PortForwardArgs;

/// Bytes read from a local connection per WebSocket message.
const CHUNK: usize = 32 * 1024;

pub async fn forward(client: &ApiClient, args: PortForwardArgs) -> anyhow::Result<ExitCode> {
    let (local, remote) = args.ports;
    // A missing sandbox is one clear error now rather than one per connection later.
    let _: SandboxInfo = client
        .json(client.request(Method::GET, &["v1", "sandboxes", &args.id]))
        .await?;
    let listener = TcpListener::bind((args.address, local))
        .await
        .with_context(|| format!("cannot listen on {}:{local}", args.address))?;
    let bound = listener.local_addr().context("cannot read the bound address")?;
    eprintln!(
        "paddock: forwarding {bound} to port {remote} of sandbox {} (Ctrl-C to stop)",
        args.id
    );
    let mut term = signal(SignalKind::terminate()).context("failed to install a signal handler")?;
    let mut int = signal(SignalKind::interrupt()).context("failed to install a signal handler")?;
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (conn, _) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        eprintln!("paddock: accept failed: {e}");
                        continue;
                    }
                };
                let (client, id) = (client.clone(), args.id.clone());
                connections.spawn(async move {
                    if let Err(e) = carry(&client, &id, remote, conn).await {
                        eprintln!("paddock: a connection to port {remote} of sandbox {id} failed: {e:#}");
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Carries one local connection to the sandbox's port and back.
async fn carry(client: &ApiClient, id: &str, port: u16, mut conn: TcpStream) -> anyhow::Result<()> {
    let port_text = port.to_string();
    let socket = client
        .websocket(&["v1", "sandboxes", id, "ports", &port_text, "tcp"], &[])
        .await?;
    let _ = conn.set_nodelay(true);
    let (mut ws_tx, mut ws_rx) = socket.split();
    let (mut local_rx, mut local_tx) = conn.split();
    let up = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = local_rx
                .read(&mut buf)
                .await
                .context("reading the local connection")?;
            if n == 0 {
                // The local side is done sending: an empty message half-closes the sandbox side.
                ws_tx
                    .send(Message::binary(Vec::new()))
                    .await
                    .context("sending to the server")?;
                // Keep the sender alive (for pongs) until the other direction ends.
                return Ok::<_, anyhow::Error>(ws_tx);
            }
            ws_tx
                .send(Message::binary(buf[..n].to_vec()))
                .await
                .context("sending to the server")?;
        }
    };
    let down = async {
        while let Some(message) = ws_rx.next().await {
            match message.context("receiving from the server")? {
                Message::Binary(data) => local_tx
                    .write_all(&data)
                    .await
                    .context("writing the local connection")?,
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = local_tx.shutdown().await;
        Ok::<_, anyhow::Error>(())
    };
    tokio::pin!(up, down);
    let mut sender = None;
    loop {
        tokio::select! {
            done = &mut up, if sender.is_none() => sender = Some(done?),
            done = &mut down => {
                done?;
                if let Some(mut tx) = sender {
                    let _ = tx.close().await;
                }
                return Ok(());
            }
        }
    }
}
