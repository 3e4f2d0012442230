//! The reader side of an agent connection: one task reads every frame and routes it, replies to
//! the request waiting for them (by id), output and exits to the events channel of their pid, file
//! system events to the channel of their watch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use paddock_protocol::frame::{decode_prefix, PREFIX_LEN};
use paddock_protocol::kernel::CellEvent;
use paddock_protocol::{AgentMessage, Reply};
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot, Notify};

use super::{AgentClientError, ProcessEvent, ProcessEvents, WatchEvents, WatchUpdate};

/// Events buffered per process (or watch) before the connection's reader waits for the consumer.
const EVENT_QUEUE: usize = 32;

/// Where incoming frames go.
#[derive(Debug, Default)]
pub(super) struct Routes {
    pub(super) pending: HashMap<u64, Pending>,
    pub(super) events: HashMap<u32, Route<ProcessEvent>>,
    pub(super) watches: HashMap<u32, Route<WatchUpdate>>,
    pub(super) cells: HashMap<u64, Route<CellEvent>>,
    pub(super) closed: bool,
}

/// The consumer of one process's (or watch's) events.
#[derive(Debug)]
pub(super) struct Route<T> {
    tx: mpsc::Sender<T>,
    /// Signalled when the route is cancelled (a detach), to unblock a delivery waiting for room.
    cancel: Arc<Notify>,
}

impl<T> Route<T> {
    fn new() -> (Self, mpsc::Receiver<T>) {
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        let route = Self {
            tx,
            cancel: Arc::new(Notify::new()),
        };
        (route, rx)
    }
}

/// Ends the route of `pid`: later events are dropped, and a delivery waiting for the consumer to
/// make room gives up (so a detach never waits for a consumer that stopped reading).
pub(super) fn cancel_route(routes: &Mutex<Routes>, pid: u32) {
    if let Some(route) = lock(routes).events.remove(&pid) {
        route.cancel.notify_one();
    }
}

/// Ends the route of watch `watch_id`, like [`cancel_route`]; false if it had none.
pub(super) fn cancel_watch(routes: &Mutex<Routes>, watch_id: u32) -> bool {
    let route = lock(routes).watches.remove(&watch_id);
    route.map(|r| r.cancel.notify_one()).is_some()
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
    /// The watch id comes with the `Watching` reply.
    Watch,
    /// The cell id comes with the `CellStarted` reply.
    Cell,
}

#[derive(Debug)]
pub(super) struct Answer {
    pub(super) body: Reply,
    pub(super) payload: Vec<u8>,
    pub(super) events: Option<ProcessEvents>,
    pub(super) watch: Option<mpsc::Receiver<WatchUpdate>>,
    pub(super) cell: Option<mpsc::Receiver<CellEvent>>,
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
    let (pending, _events, _watches, _cells) = {
        let mut routes = lock(&routes);
        routes.closed = true;
        (
            std::mem::take(&mut routes.pending),
            std::mem::take(&mut routes.events),
            std::mem::take(&mut routes.watches),
            std::mem::take(&mut routes.cells),
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
            let watch_id = match (pending.subscribe, &body) {
                (Subscribe::Watch, Reply::Watching { watch_id }) => Some(*watch_id),
                _ => None,
            };
            let cell_id = match (pending.subscribe, &body) {
                (Subscribe::Cell, Reply::CellStarted { cell_id }) => Some(*cell_id),
                _ => None,
            };
            // Subscribe before the next frame is read: the process's output (or the watch's events)
            // follows right behind.
            let events = pid.map(|pid| {
                let (route, rx) = Route::new();
                lock(routes).events.insert(pid, route);
                ProcessEvents { pid, rx }
            });
            let watch = watch_id.map(|watch_id| {
                let (route, rx) = Route::new();
                lock(routes).watches.insert(watch_id, route);
                rx
            });
            let cell = cell_id.map(|cell_id| {
                let (route, rx) = Route::new();
                lock(routes).cells.insert(cell_id, route);
                rx
            });
            if pending
                .tx
                .send(Ok(Answer {
                    body,
                    payload,
                    events,
                    watch,
                    cell,
                }))
                .is_err()
            {
                // The caller gave up (timeout or cancellation): nobody will read these events.
                let mut routes = lock(routes);
                if let Some(pid) = pid {
                    routes.events.remove(&pid);
                }
                if let Some(watch_id) = watch_id {
                    routes.watches.remove(&watch_id);
                }
                if let Some(cell_id) = cell_id {
                    routes.cells.remove(&cell_id);
                }
            }
        }
        AgentMessage::Error { id, error } => {
            if let Some(pending) = lock(routes).pending.remove(&id) {
                let _ = pending.tx.send(Err(AgentClientError::Agent(error)));
            }
        }
        AgentMessage::Output { pid, stream, offset } => {
            let event = ProcessEvent::Output {
                stream,
                offset,
                data: payload,
            };
            deliver(routes, select_process, pid, event, false).await;
        }
        AgentMessage::Exited { pid, status } => {
            deliver(routes, select_process, pid, ProcessEvent::Exited(status), true).await;
        }
        AgentMessage::FsEvents { watch_id, events } => {
            deliver(routes, select_watch, watch_id, WatchUpdate::Events(events), false).await;
        }
        AgentMessage::WatchEnded { watch_id, reason } => {
            deliver(routes, select_watch, watch_id, WatchUpdate::Ended(reason), true).await;
        }
        AgentMessage::Cell { cell_id } => match serde_json::from_slice::<CellEvent>(&payload) {
            Ok(event) => {
                let last = matches!(event, CellEvent::End { .. });
                deliver(routes, select_cell, cell_id, event, last).await;
            }
            Err(err) => {
                // The agent is the sandbox's: a malformed event ends the cell's stream as a dead
                // kernel rather than the connection.
                tracing::warn!(cell_id, error = %err, "malformed cell event from the agent");
                let end = CellEvent::End {
                    status: paddock_protocol::kernel::CellStatus::KernelDied,
                    dropped_bytes: payload.len() as u64,
                    kernel_dead: false,
                };
                deliver(routes, select_cell, cell_id, end, true).await;
            }
        },
    }
}

fn select_cell(routes: &mut Routes) -> &mut HashMap<u64, Route<CellEvent>> {
    &mut routes.cells
}

fn select_process(routes: &mut Routes) -> &mut HashMap<u32, Route<ProcessEvent>> {
    &mut routes.events
}

fn select_watch(routes: &mut Routes) -> &mut HashMap<u32, Route<WatchUpdate>> {
    &mut routes.watches
}

/// Hands an event to the consumer of `key` (a pid or a watch id) in the routes `select` picks,
/// waiting while that consumer's queue is full. The route ends after its `last` event, or when the
/// consumer is gone (the event is then dropped).
async fn deliver<K: std::hash::Hash + Eq, T>(
    routes: &Mutex<Routes>,
    select: fn(&mut Routes) -> &mut HashMap<K, Route<T>>,
    key: K,
    event: T,
    last: bool,
) {
    let Some((tx, cancel)) = select(&mut lock(routes))
        .get(&key)
        .map(|r| (r.tx.clone(), r.cancel.clone()))
    else {
        return;
    };
    let delivered = tokio::select! {
        sent = tx.send(event) => sent.is_ok(),
        () = cancel.notified() => false,
    };
    if !delivered || last {
        let mut routes = lock(routes);
        let map = select(&mut routes);
        if map.get(&key).is_some_and(|current| current.tx.same_channel(&tx)) {
            map.remove(&key);
        }
    }
}

/// Builds the events handle of a watch the agent confirmed.
pub(super) fn watch_events(
    watch_id: u32,
    rx: Option<mpsc::Receiver<WatchUpdate>>,
    client: std::sync::Weak<super::Shared>,
) -> WatchEvents {
    let rx = rx.unwrap_or_else(|| mpsc::channel(1).1);
    WatchEvents { watch_id, rx, client }
}
