//! The reader side of an agent connection: one task reads every frame and routes it, replies to
//! the request waiting for them (by id), output and exits to the events channel of their pid.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use paddock_protocol::frame::{decode_prefix, PREFIX_LEN};
use paddock_protocol::{AgentMessage, Reply};
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot, Notify};

use super::{AgentClientError, ProcessEvent, ProcessEvents};

/// Events buffered per process before the connection's reader waits for the consumer.
const EVENT_QUEUE: usize = 32;

/// Where incoming frames go.
#[derive(Debug, Default)]
pub(super) struct Routes {
    pub(super) pending: HashMap<u64, Pending>,
    pub(super) events: HashMap<u32, Route>,
    pub(super) closed: bool,
}

/// The consumer of one process's events.
#[derive(Debug)]
pub(super) struct Route {
    tx: mpsc::Sender<ProcessEvent>,
    /// Signalled when the route is cancelled (a detach), to unblock a delivery waiting for room.
    cancel: Arc<Notify>,
}

/// Ends the route of `pid`: later events are dropped, and a delivery waiting for the consumer to
/// make room gives up (so a detach never waits for a consumer that stopped reading).
pub(super) fn cancel_route(routes: &Mutex<Routes>, pid: u32) {
    if let Some(route) = lock(routes).events.remove(&pid) {
        route.cancel.notify_one();
    }
}

#[derive(Debug)]
pub(super) struct Pending {
    pub(super) tx: oneshot::Sender<Result<Answer, AgentClientError>>,
    pub(super) subscribe: Subscribe,
}

/// Whether a successful reply starts a stream of process events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Subscribe {
    No,
    /// The pid comes with the `Spawned` reply.
    Spawn,
    /// Attach to this pid.
    Attach(u32),
}

#[derive(Debug)]
pub(super) struct Answer {
    pub(super) body: Reply,
    pub(super) payload: Vec<u8>,
    pub(super) events: Option<ProcessEvents>,
}

pub(super) fn lock(routes: &Mutex<Routes>) -> MutexGuard<'_, Routes> {
    // A panic while holding this lock leaves plain maps behind; they are still consistent.
    routes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The reader task: routes every frame until the connection ends, then fails whatever waits.
pub(super) async fn read_frames(read: OwnedReadHalf, routes: Arc<Mutex<Routes>>) {
    let mut reader = BufReader::with_capacity(64 * 1024, read);
    let end = loop {
        match read_message(&mut reader).await {
            Ok(Some((message, payload))) => route(&routes, message, payload).await,
            Ok(None) => break AgentClientError::Closed,
            Err(err) => break err,
        }
    };
    tracing::debug!(error = %end, "agent connection ended");
    let (pending, _events) = {
        let mut routes = lock(&routes);
        routes.closed = true;
        (
            std::mem::take(&mut routes.pending),
            std::mem::take(&mut routes.events),
        )
    };
    for (_, waiter) in pending {
        let err = match &end {
            AgentClientError::Protocol { detail } => AgentClientError::Protocol {
                detail: detail.clone(),
            },
            _ => AgentClientError::Closed,
        };
        let _ = waiter.tx.send(Err(err));
    }
}

/// Reads one frame; `None` at a clean end of stream.
async fn read_message(
    reader: &mut BufReader<OwnedReadHalf>,
) -> Result<Option<(AgentMessage, Vec<u8>)>, AgentClientError> {
    let io_error = |source| AgentClientError::Io {
        op: "reading from the agent",
        source,
    };
    let mut prefix = [0u8; PREFIX_LEN];
    if reader.read(&mut prefix[..1]).await.map_err(io_error)? == 0 {
        return Ok(None);
    }
    reader.read_exact(&mut prefix[1..]).await.map_err(io_error)?;
    let (header_len, payload_len) = decode_prefix(prefix).map_err(|err| AgentClientError::Protocol {
        detail: err.to_string(),
    })?;
    let mut header = vec![0u8; header_len];
    reader.read_exact(&mut header).await.map_err(io_error)?;
    let mut payload = vec![0u8; payload_len];
    reader.read_exact(&mut payload).await.map_err(io_error)?;
    let message = serde_json::from_slice(&header).map_err(|err| AgentClientError::Protocol {
        detail: format!("malformed message from the agent: {err}"),
    })?;
    Ok(Some((message, payload)))
}

async fn route(routes: &Mutex<Routes>, message: AgentMessage, payload: Vec<u8>) {
    match message {
        AgentMessage::Reply { id, body } => {
            let Some(pending) = lock(routes).pending.remove(&id) else {
                return;
            };
            let pid = match (pending.subscribe, &body) {
                (Subscribe::Spawn, Reply::Spawned { pid }) => Some(*pid),
                (Subscribe::Attach(pid), Reply::Attached { .. }) => Some(pid),
                _ => None,
            };
            // Subscribe before the next frame is read: the process's output follows right behind.
            let events = pid.map(|pid| {
                let (tx, rx) = mpsc::channel(EVENT_QUEUE);
                let route = Route {
                    tx,
                    cancel: Arc::new(Notify::new()),
                };
                lock(routes).events.insert(pid, route);
                ProcessEvents { pid, rx }
            });
            if pending
                .tx
                .send(Ok(Answer {
                    body,
                    payload,
                    events,
                }))
                .is_err()
            {
                // The caller gave up (timeout or cancellation): nobody will read these events.
                if let Some(pid) = pid {
                    lock(routes).events.remove(&pid);
                }
            }
        }
        AgentMessage::Error { id, error } => {
            if let Some(pending) = lock(routes).pending.remove(&id) {
                let _ = pending.tx.send(Err(AgentClientError::Agent(error)));
            }
        }
        AgentMessage::Output { pid, stream, offset } => {
            deliver(
                routes,
                pid,
                ProcessEvent::Output {
                    stream,
                    offset,
                    data: payload,
                },
            )
            .await;
        }
        AgentMessage::Exited { pid, status } => deliver(routes, pid, ProcessEvent::Exited(status)).await,
    }
}

/// Hands an event to its process's consumer, waiting while that consumer's queue is full. The route
/// ends after an exit, or when the consumer is gone (the event is then dropped).
async fn deliver(routes: &Mutex<Routes>, pid: u32, event: ProcessEvent) {
    let Some((tx, cancel)) = lock(routes)
        .events
        .get(&pid)
        .map(|r| (r.tx.clone(), r.cancel.clone()))
    else {
        return;
    };
    let last = matches!(event, ProcessEvent::Exited(_));
    let delivered = tokio::select! {
        sent = tx.send(event) => sent.is_ok(),
        () = cancel.notified() => false,
    };
    if !delivered || last {
        let mut routes = lock(routes);
        if routes
            .events
            .get(&pid)
            .is_some_and(|current| current.tx.same_channel(&tx))
        {
            routes.events.remove(&pid);
        }
    }
}
