//! WebSockets attached to this process's stdin and stdout: `sandbox exec -i` (`.../exec/ws`: the
//! request as the first text message, events back as text messages, stdin as binary messages) and
//! `sandbox shell` (`.../pty`: terminal bytes as binary messages both ways, a final `exit` text message).
//! With a terminal, it is in raw mode for the duration (restored on every exit path) and SIGWINCH
//! becomes a `resize` message.

use std::os::fd::AsFd;
use std::process::ExitCode;

use anyhow::Context;
use futures_util::{SinkExt, StreamExt};
use paddock_types::api::{ExecEvent, ExitInfo, PtySizeBody};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::exec::{exec_request, exit_code, Output};
use super::{ApiClient, ApiFailure};
use crate::cli::{ExecArgs, ShellArgs};
use crate::tty::TerminalSession;

/// A client WebSocket.
pub type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The size of this process's terminal (80x24 when stdin is not one).
pub fn terminal_size() -> PtySizeBody {
    match paddock_sys::pty::window_size(std::io::stdin().as_fd()) {
        Ok(w) if w.rows > 0 && w.cols > 0 => PtySizeBody {
            rows: w.rows,
            cols: w.cols,
        },
        _ => PtySizeBody { rows: 24, cols: 80 },
    }
}

/// `sandbox exec -i [-t]`.
pub async fn exec_interactive(client: &ApiClient, args: &ExecArgs) -> anyhow::Result<ExitCode> {
    let pty = args.tty.then(terminal_size);
    let request = serde_json::to_string(&exec_request(args, pty)).context("failed to encode the request")?;
    let mut socket = client
        .websocket(&["v1", "sandboxes", &args.id, "exec", "ws"], &[])
        .await?;
    socket
        .send(Message::text(request))
        .await
        .context("failed to send the exec request")?;
    let terminal = if args.tty {
        Some(TerminalSession::start()?)
    } else {
        None
    };
    pump(socket, Mode::Exec, terminal).await
}

/// `sandbox shell`.
pub async fn shell(client: &ApiClient, args: ShellArgs) -> anyhow::Result<ExitCode> {
    if !paddock_sys::pty::is_terminal(std::io::stdin().as_fd()) {
        return Err(crate::UsageError::new(
            "sandbox shell needs a terminal on stdin; for scripts use `paddock sandbox exec -i ID -- CMD`",
        )
        .into());
    }
    let size = terminal_size();
    let mut query = vec![("rows", size.rows.to_string()), ("cols", size.cols.to_string())];
    for (name, value) in [("cmd", &args.cmd), ("cwd", &args.cwd), ("user", &args.user)] {
        if let Some(v) = value {
            query.push((name, v.clone()));
        }
    }
    // Connect before raw mode, so that a refusal prints like any other error.
    let socket = client
        .websocket(&["v1", "sandboxes", &args.id, "pty"], &query)
        .await?;
    let terminal = TerminalSession::start()?;
    pump(socket, Mode::Pty, Some(terminal)).await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `.../exec/ws`: stdin EOF is `close_stdin`; our SIGINT/SIGTERM are forwarded to the process.
    Exec,
    /// `.../pty`: everything goes through the terminal.
    Pty,
}

/// How the session ended.
enum End {
    Exited(ExitInfo),
    /// The connection closed without an exit message.
    Closed,
    /// We were told to stop by this signal.
    Signalled(i32),
}

async fn pump(socket: Socket, mode: Mode, terminal: Option<TerminalSession>) -> anyhow::Result<ExitCode> {
    let (mut tx, mut rx) = socket.split();
    let mut signals = Signals::new()?;
    let (input_tx, mut input) = mpsc::channel::<Option<Vec<u8>>>(4);
    tokio::spawn(read_stdin(input_tx));
    let mut out = Output::new();
    let mut stdin_open = true;
    let tty = terminal.is_some();
    let end: anyhow::Result<End> = loop {
        tokio::select! {
            msg = rx.next() => match msg {
                None | Some(Ok(Message::Close(_))) => break Ok(End::Closed),
                Some(Err(e)) => break Err(anyhow::Error::new(e).context("the connection to the paddock server broke")),
                Some(Ok(Message::Binary(bytes))) => out.stdout_bytes(&bytes).await,
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<ExecEvent>(text.as_str()) {
                    Ok(ExecEvent::Stdout(d) | ExecEvent::Pty(d)) => if let Err(e) = out.stdout(&d).await {
                        break Err(e);
                    },
                    Ok(ExecEvent::Stderr(d)) => if let Err(e) = out.stderr(&d).await {
                        break Err(e);
                    },
                    Ok(ExecEvent::Exit(info)) => break Ok(End::Exited(info)),
                    Ok(ExecEvent::Error { code, message }) => break Err(ApiFailure::new(code.as_str(), message).into()),
                    Ok(ExecEvent::Started { .. }) => {}
                    Err(e) => tracing::debug!(error = %e, "ignoring a message this client does not know"),
                },
                Some(Ok(_)) => {} // ping, pong: answered by the library
            },
            chunk = input.recv(), if stdin_open => match chunk {
                Some(Some(bytes)) => {
                    if let Err(e) = tx.send(Message::binary(bytes)).await {
                        break Err(anyhow::Error::new(e).context("failed to send input"));
                    }
                }
                Some(None) | None => {
                    stdin_open = false;
                    if mode == Mode::Exec {
                        let _ = tx.send(Message::text(r#"{"type":"close_stdin"}"#)).await;
                    }
                }
            },
            _ = signals.winch.recv() => {
                if tty {
                    let size = terminal_size();
                    let msg = serde_json::json!({"type": "resize", "rows": size.rows, "cols": size.cols});
                    let _ = tx.send(Message::text(msg.to_string())).await;
                }
            }
            _ = signals.int.recv() => {
                if mode == Mode::Exec && !tty {
                    let _ = tx.send(Message::text(r#"{"type":"signal","signal":"INT"}"#)).await;
                } else {
                    break Ok(End::Signalled(libc::SIGINT));
                }
            }
            _ = signals.term.recv() => {
                if mode == Mode::Exec && !tty {
                    let _ = tx.send(Message::text(r#"{"type":"signal","signal":"TERM"}"#)).await;
                } else {
                    break Ok(End::Signalled(libc::SIGTERM));
                }
            }
            _ = signals.hup.recv() => break Ok(End::Signalled(libc::SIGHUP)),
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), tx.send(Message::Close(None))).await;
    // Restore the terminal before anything is printed about how it ended.
    drop(terminal);
    match end? {
        End::Exited(info) => Ok(ExitCode::from(exit_code(&info))),
        End::Signalled(sig) => Ok(ExitCode::from((128 + sig) as u8)),
        End::Closed => anyhow::bail!("the paddock server closed the connection before the process exited"),
    }
}

/// Forwards stdin in chunks; `None` at its end.
async fn read_stdin(tx: mpsc::Sender<Option<Vec<u8>>>) {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = tx.send(None).await;
                return;
            }
            Ok(n) => {
                if tx.send(Some(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
    winch: Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        let s = |k| signal(k).context("failed to install a signal handler");
        Ok(Self {
            int: s(SignalKind::interrupt())?,
            term: s(SignalKind::terminate())?,
            hup: s(SignalKind::hangup())?,
            winch: s(SignalKind::window_change())?,
        })
    }
}
