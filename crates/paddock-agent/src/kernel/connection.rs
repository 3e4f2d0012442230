//! The agent's Jupyter client for one kernel: the shell and iopub sockets (ZeroMQ over TCP on
//! 127.0.0.1, pure-Rust `zeromq` through `jupyter-zmq-client`), message signing and checking
//! (HMAC-SHA256, in `jupyter-zmq-client`), the first `kernel_info_request` handshake, and the
//! short-lived control and heartbeat sockets.
//!
//! Every received message is checked against [`MAX_MESSAGE_LEN`] before its JSON is parsed; a
//! message over it, badly signed or unparsable is dropped (and counted), never fatal.
//!
//! What it does not do: bound what the ZeroMQ crate buffers while it reads one message off the
//! socket (it has no maximum message size; see ARCHITECTURE.md), decide which messages belong to a
//! cell (`cell.rs`), or start the kernel (`start.rs`).

use std::collections::HashSet;
use std::time::Duration;

use jupyter_protocol::{
    ConnectionInfo, Header, InterruptRequest, JupyterMessage, JupyterMessageContent, KernelInfoReply,
    KernelInfoRequest, ShutdownRequest, UnknownMessage,
};
use jupyter_zmq_client::{
    create_client_control_connection, create_client_heartbeat_connection, create_client_iopub_connection,
    create_client_shell_connection_with_identity, peer_identity_for_session, ClientIoPubConnection,
    ClientShellConnection, Connection, RawMessage,
};
use tokio::time::{sleep_until, timeout, Instant};
use zeromq::{SocketRecv, SocketSend};

/// The largest message accepted from a kernel (all its frames together); bigger ones are dropped.
pub(crate) const MAX_MESSAGE_LEN: usize = 32 << 20;
/// One connection attempt; a kernel that has not bound its port yet is retried this often.
const CONNECT_ATTEMPT: Duration = Duration::from_millis(250);
/// The first wait for a `kernel_info_reply` before the request is sent again (doubling up to
/// [`KERNEL_INFO_RETRY_MAX`]).
const KERNEL_INFO_RETRY: Duration = Duration::from_millis(250);
const KERNEL_INFO_RETRY_MAX: Duration = Duration::from_secs(2);

/// Why talking to a kernel failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientError {
    #[error("connecting to the kernel's {channel} port timed out")]
    ConnectTimeout { channel: &'static str },
    #[error("connecting to the kernel's {channel} port failed")]
    Connect {
        channel: &'static str,
        #[source]
        source: jupyter_zmq_client::RuntimeError,
    },
    #[error("sending {msg_type} on {channel} failed")]
    Send {
        channel: &'static str,
        msg_type: String,
        #[source]
        source: jupyter_zmq_client::RuntimeError,
    },
    #[error("sending {msg_type} on {channel} timed out")]
    SendTimeout { channel: &'static str, msg_type: String },
    #[error("receiving on {channel} failed")]
    Receive {
        channel: &'static str,
        #[source]
        source: zeromq::ZmqError,
    },
    #[error("the kernel did not answer kernel_info_request in time")]
    ReadyTimeout,
}

/// Which socket a message came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Channel {
    Shell,
    IoPub,
}

/// A message received from the kernel, reduced to what the agent uses.
#[derive(Debug)]
pub(crate) struct Incoming {
    /// `msg_id` of the request it answers (its parent header), if any.
    pub(crate) parent: Option<String>,
    /// Its typed content.
    pub(crate) content: JupyterMessageContent,
}

/// What one receive produced.
#[derive(Debug)]
pub(crate) enum Received {
    /// A well-formed, correctly signed message.
    Message(Incoming),
    /// A message that was dropped (too large, badly signed or unparsable), with its size.
    Dropped { len: usize },
}

/// The connected shell and iopub sockets of one kernel.
pub(crate) struct KernelClient {
    shell: ClientShellConnection,
    iopub: ClientIoPubConnection,
}

impl std::fmt::Debug for KernelClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelClient")
            .field("session", &self.shell.session_id)
            .finish_non_exhaustive()
    }
}

impl KernelClient {
    /// Connects shell and iopub (retrying while the kernel has not bound its ports), until
    /// `deadline`.
    pub(crate) async fn connect(
        info: &ConnectionInfo,
        session: &str,
        deadline: Instant,
    ) -> Result<Self, ClientError> {
        let identity = peer_identity_for_session(session).map_err(|source| ClientError::Connect {
            channel: "shell",
            source,
        })?;
        let shell = retry_connect("shell", deadline, || {
            create_client_shell_connection_with_identity(info, session, identity.clone())
        })
        .await?;
        let iopub = retry_connect("iopub", deadline, || {
            create_client_iopub_connection(info, "", session)
        })
        .await?;
        Ok(Self { shell, iopub })
    }

    /// Sends `content` on shell; returns the request's `msg_id`.
    pub(crate) async fn send_shell(
        &mut self,
        content: impl Into<JupyterMessageContent>,
    ) -> Result<String, ClientError> {
        let message = JupyterMessage::new(content.into(), None);
        let msg_id = message.header.msg_id.clone();
        let msg_type = message.header.msg_type.clone();
        match timeout(SEND_TIMEOUT, self.shell.send(message)).await {
            Ok(Ok(())) => Ok(msg_id),
            Ok(Err(source)) => Err(ClientError::Send {
                channel: "shell",
                msg_type,
                source,
            }),
            Err(_) => Err(ClientError::SendTimeout {
                channel: "shell",
                msg_type,
            }),
        }
    }

    /// The next message on shell or iopub, whichever comes first. Cancel-safe (each socket's
    /// receive is a queue pop).
    pub(crate) async fn recv(&mut self) -> (Channel, Result<Received, ClientError>) {
        tokio::select! {
            raw = self.shell.socket.recv() => (Channel::Shell, match raw {
                Ok(raw) => Ok(decode(raw, &self.shell)),
                Err(source) => Err(ClientError::Receive { channel: "shell", source }),
            }),
            raw = self.iopub.socket.recv() => (Channel::IoPub, match raw {
                Ok(raw) => Ok(decode(raw, &self.iopub)),
                Err(source) => Err(ClientError::Receive { channel: "iopub", source }),
            }),
        }
    }

    /// Sends `kernel_info_request` until a reply arrives on shell *and* iopub has carried a message
    /// answering one of them (so iopub's subscription is in place before the first cell), or
    /// `deadline` passes. Never returns early on its own; the caller races it against the kernel's
    /// exit.
    pub(crate) async fn handshake(&mut self, deadline: Instant) -> Result<KernelInfoReply, ClientError> {
        let mut sent = HashSet::new();
        let mut reply: Option<KernelInfoReply> = None;
        let mut iopub_seen = false;
        let mut wait = KERNEL_INFO_RETRY;
        loop {
            if Instant::now() >= deadline {
                return Err(ClientError::ReadyTimeout);
            }
            sent.insert(self.send_shell(KernelInfoRequest {}).await?);
            let retry_at = (Instant::now() + wait).min(deadline);
            wait = (wait * 2).min(KERNEL_INFO_RETRY_MAX);
            loop {
                if let (Some(info), true) = (&reply, iopub_seen) {
                    return Ok(info.clone());
                }
                tokio::select! {
                    (channel, received) = self.recv() => {
                        let Received::Message(Incoming { parent: Some(parent), content }) = received? else {
                            continue;
                        };
                        if !sent.contains(&parent) {
                            continue;
                        }
                        match (channel, content) {
                            (Channel::Shell, JupyterMessageContent::KernelInfoReply(info)) => reply = Some(*info),
                            (Channel::Shell, JupyterMessageContent::UnknownMessage(m))
                                if m.msg_type == "kernel_info_reply" =>
                            {
                                reply = lenient_kernel_info(m.content);
                            }
                            (Channel::IoPub, _) => iopub_seen = true,
                            (Channel::Shell, _) => {}
                        }
                    }
                    () = sleep_until(retry_at) => break,
                }
            }
        }
    }
}

/// A `kernel_info_reply` the crate's shape refused: kernels such as `bash_kernel` leave out
/// `language_info.version` (and older ones `protocol_version`), which the spec lists but nothing
/// here needs. Fills them in empty and reads it again.
fn lenient_kernel_info(mut content: serde_json::Value) -> Option<KernelInfoReply> {
    let object = content.as_object_mut()?;
    object
        .entry("protocol_version")
        .or_insert_with(|| serde_json::Value::String(String::new()));
    let language = object.get_mut("language_info")?.as_object_mut()?;
    language
        .entry("version")
        .or_insert_with(|| serde_json::Value::String(String::new()));
    serde_json::from_value(content).ok()
}

/// How long one send may wait (a kernel that stopped reading).
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects with `connect` (a fresh socket each attempt) until it succeeds or `deadline` passes.
async fn retry_connect<T, F, Fut>(
    channel: &'static str,
    deadline: Instant,
    mut connect: F,
) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = jupyter_zmq_client::Result<T>>,
{
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(ClientError::ConnectTimeout { channel });
        }
        let attempt = CONNECT_ATTEMPT.min(deadline - now);
        match timeout(attempt, connect()).await {
            Ok(Ok(connection)) => return Ok(connection),
            Ok(Err(source)) => return Err(ClientError::Connect { channel, source }),
            Err(_) => {}
        }
    }
}

/// Sends `shutdown_request` on a fresh control connection, all within `limit`.
pub(crate) async fn request_shutdown(
    info: &ConnectionInfo,
    session: &str,
    limit: Duration,
) -> Result<(), ClientError> {
    send_control(info, session, ShutdownRequest { restart: false }.into(), limit).await
}

/// Sends `interrupt_request` on a fresh control connection, all within `limit` (the kernel's
/// `interrupt_reply` is not awaited: the cell's own messages say whether it stopped).
pub(crate) async fn request_interrupt(
    info: &ConnectionInfo,
    session: &str,
    limit: Duration,
) -> Result<(), ClientError> {
    send_control(info, session, InterruptRequest {}.into(), limit).await
}

async fn send_control(
    info: &ConnectionInfo,
    session: &str,
    content: JupyterMessageContent,
    limit: Duration,
) -> Result<(), ClientError> {
    let deadline = Instant::now() + limit;
    let msg_type = content.message_type().to_owned();
    let mut control = retry_connect("control", deadline, || {
        create_client_control_connection(info, session)
    })
    .await?;
    let message = JupyterMessage::new(content, None);
    match timeout(deadline - Instant::now().min(deadline), control.send(message)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(source)) => Err(ClientError::Send {
            channel: "control",
            msg_type,
            source,
        }),
        Err(_) => Err(ClientError::SendTimeout {
            channel: "control",
            msg_type,
        }),
    }
}

/// One heartbeat on a fresh socket: `true` when the kernel echoed within `limit`. A fresh socket
/// each time, because a REQ socket whose answer never came cannot send again.
pub(crate) async fn heartbeat(info: &ConnectionInfo, limit: Duration) -> bool {
    let ping = async {
        let mut hb = create_client_heartbeat_connection(info).await.ok()?;
        hb.socket
            .send(zeromq::ZmqMessage::from(b"ping".to_vec()))
            .await
            .ok()?;
        hb.socket.recv().await.ok()
    };
    matches!(timeout(limit, ping).await, Ok(Some(_)))
}

/// Checks size and signature, then parses the parts the agent uses.
fn decode<S>(raw: zeromq::ZmqMessage, connection: &Connection<S>) -> Received {
    let len: usize = raw.iter().map(|frame| frame.len()).sum();
    if len > MAX_MESSAGE_LEN {
        tracing::debug!(len, "dropping an oversized kernel message");
        return Received::Dropped { len };
    }
    let parsed = RawMessage::from_multipart(raw, &connection.mac)
        .ok()
        .and_then(|raw| parse_parts(&raw.jparts));
    match parsed {
        Some(incoming) => Received::Message(incoming),
        None => {
            tracing::debug!(len, "dropping a malformed or badly signed kernel message");
            Received::Dropped { len }
        }
    }
}

/// Header, parent header and content of a message's JSON parts (metadata is not used).
fn parse_parts<B: AsRef<[u8]>>(parts: &[B]) -> Option<Incoming> {
    let [header, parent, _metadata, content, ..] = parts else {
        return None;
    };
    let header: Header = serde_json::from_slice(header.as_ref()).ok()?;
    let parent = serde_json::from_slice::<serde_json::Value>(parent.as_ref())
        .ok()
        .and_then(|p| p.get("msg_id").and_then(|id| id.as_str()).map(str::to_owned));
    let value: serde_json::Value = serde_json::from_slice(content.as_ref()).ok()?;
    let content = match JupyterMessageContent::from_type_and_content(&header.msg_type, value) {
        Ok(content) => content,
        // A known type whose content does not fit the crate's shape (an `aborted` reply without
        // fields it expects, a kernel's own extras) is kept untyped, so a reply still ends its cell.
        Err(_) => JupyterMessageContent::UnknownMessage(UnknownMessage {
            msg_type: header.msg_type,
            content: serde_json::from_slice(content.as_ref()).ok()?,
        }),
    };
    Some(Incoming { parent, content })
}

#[cfg(test)]
mod lenient_tests {
    use super::*;

    #[test]
    fn a_kernel_info_without_versions_is_read() {
        let reply = lenient_kernel_info(serde_json::json!({
            "status": "ok",
            "implementation": "bash_kernel",
            "language_info": {"name": "bash", "mimetype": "text/x-sh", "file_extension": ".sh"}
        }))
        .expect("read");
        assert_eq!(
            (
                reply.language_info.name.as_str(),
                reply.language_info.version.as_str()
            ),
            ("bash", "")
        );
        assert!(lenient_kernel_info(serde_json::json!({"language_info": 3})).is_none());
    }
}
