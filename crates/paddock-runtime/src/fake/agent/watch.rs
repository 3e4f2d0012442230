//! Directory watches: the change events of the double's own file operations and commands (see
//! `fs.rs`), for the entries directly in a watched directory or, with `recursive`, anywhere below
//! it. Each watch queues at most [`QUEUE_MAX`] events (then one `overflow` stands for what was
//! dropped, as the real agent's) and a forwarding task sends them in batches of at most
//! [`BATCH_MAX`]. A watch ends with `unwatch`, with its connection, or when its directory is removed
//! or renamed away (`watch_ended`, after its last events).
//!
//! Unlike the real agent's (inotify), events are sent as soon as they happen (no 50 ms batching),
//! and changes made outside this agent (a rollback, another sandbox writing to a shared volume) are
//! not seen.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use paddock_protocol::{AgentMessage, ErrorCode, FsEvent, FsEventKind, Reply, WatchEndReason};
use tokio::sync::Notify;
use tokio::task::AbortHandle;

use super::files::sandbox_path;
use super::outbound::{agent_error, Answer, Outbound};
use super::{lock, Agent};
use crate::fake::fs::FsError;
use crate::fake::tree::display;

/// Events queued per watch while its connection is not taking them.
const QUEUE_MAX: usize = 4096;
/// Most events per `fs_events` message.
const BATCH_MAX: usize = 256;

/// The agent's watches.
#[derive(Debug, Default)]
pub(crate) struct Watches {
    inner: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u32,
    watches: HashMap<u32, Arc<Watch>>,
}

#[derive(Debug)]
struct Watch {
    id: u32,
    conn: u64,
    /// The watched directory, absolute.
    root: String,
    recursive: bool,
    queue: Mutex<Queue>,
    changed: Notify,
    forwarder: Mutex<Option<AbortHandle>>,
}

#[derive(Debug, Default)]
struct Queue {
    events: VecDeque<FsEvent>,
    overflowed: bool,
    ended: Option<WatchEndReason>,
}

impl Watch {
    fn push(&self, event: FsEvent) {
        let mut queue = lock(&self.queue);
        if queue.ended.is_some() || queue.overflowed || queue.events.back() == Some(&event) {
            return;
        }
        if queue.events.len() + 1 >= QUEUE_MAX {
            queue.events.push_back(FsEvent {
                path: self.root.clone(),
                kind: FsEventKind::Overflow,
                is_dir: true,
            });
            queue.overflowed = true;
        } else {
            queue.events.push_back(event);
        }
        drop(queue);
        self.changed.notify_waiters();
    }

    fn end(&self, reason: WatchEndReason) {
        lock(&self.queue).ended.get_or_insert(reason);
        self.changed.notify_waiters();
    }

    /// Whether `path` is watched here: directly in the root, or (recursive) anywhere below it.
    fn covers(&self, path: &str) -> bool {
        let prefix = if self.root == "/" {
            "/".to_owned()
        } else {
            format!("{}/", self.root)
        };
        let Some(rest) = path.strip_prefix(&prefix) else {
            return false;
        };
        !rest.is_empty() && (self.recursive || !rest.contains('/'))
    }
}

impl Watches {
    /// Hands `events` to every watch that covers them; ends the watches whose directory went.
    pub(crate) fn notify(&self, events: &[FsEvent]) {
        if events.is_empty() {
            return;
        }
        let watches: Vec<Arc<Watch>> = lock(&self.inner).watches.values().cloned().collect();
        let mut ended = Vec::new();
        for watch in watches {
            for event in events {
                if watch.covers(&event.path) {
                    watch.push(event.clone());
                }
                let gone = event.path == watch.root || watch.root.starts_with(&format!("{}/", event.path));
                match event.kind {
                    FsEventKind::Remove if gone => ended.push((watch.clone(), WatchEndReason::Deleted)),
                    FsEventKind::RenameFrom if gone => ended.push((watch.clone(), WatchEndReason::Moved)),
                    _ => {}
                }
            }
        }
        for (watch, reason) in ended {
            lock(&self.inner).watches.remove(&watch.id);
            watch.end(reason);
        }
    }

    /// Ends a watch without `watch_ended` (unwatch, or its connection closed).
    fn stop(&self, watch_id: u32) {
        if let Some(watch) = lock(&self.inner).watches.remove(&watch_id) {
            if let Some(task) = lock(&watch.forwarder).take() {
                task.abort();
            }
        }
    }

    /// Ends every watch of connection `conn`.
    pub(crate) fn disconnect(&self, conn: u64) {
        let ids: Vec<u32> = lock(&self.inner)
            .watches
            .values()
            .filter(|w| w.conn == conn)
            .map(|w| w.id)
            .collect();
        for id in ids {
            self.stop(id);
        }
    }
}

/// Answers `Watch { path, recursive }`, then forwards its events.
pub(crate) async fn start(agent: &Arc<Agent>, out: &Outbound, id: u64, path: &str, recursive: bool) {
    let root = sandbox_path(agent, path).and_then(|resolved| {
        let fail = |e: FsError| agent_error(e.code(), format!("watch {path:?}: {}", e.io()));
        agent
            .read_fs(|fs| {
                let abs = fs.resolve(&resolved, true)?;
                match fs.node(&abs) {
                    Some(node) if node.is_dir() => Ok(display(&abs)),
                    Some(_) => Err(FsError(libc::ENOTDIR)),
                    None => Err(FsError(libc::ENOENT)),
                }
            })
            .map_err(fail)
    });
    let root = match root {
        Ok(root) => root,
        Err(e) => {
            let _ = out.answer(id, Err(e)).await;
            return;
        }
    };
    let watch = {
        let mut table = lock(&agent.watches.inner);
        table.next_id = table.next_id.wrapping_add(1).max(1);
        let watch = Arc::new(Watch {
            id: table.next_id,
            conn: out.conn(),
            root,
            recursive,
            queue: Mutex::new(Queue::default()),
            changed: Notify::new(),
            forwarder: Mutex::new(None),
        });
        table.watches.insert(watch.id, watch.clone());
        watch
    };
    let reply = Reply::Watching { watch_id: watch.id };
    if out.answer(id, Ok((reply, Vec::new()))).await.is_err() {
        agent.watches.stop(watch.id);
        return;
    }
    let task = agent.spawn(forward(agent.clone(), watch.clone(), out.clone()));
    *lock(&watch.forwarder) = Some(task);
}

/// Answers `Unwatch { watch_id }`.
pub(crate) fn unwatch(agent: &Agent, conn: u64, watch_id: u32) -> Answer {
    let known = lock(&agent.watches.inner)
        .watches
        .get(&watch_id)
        .is_some_and(|w| w.conn == conn);
    if !known {
        return Err(agent_error(
            ErrorCode::BadRequest,
            format!("no watch {watch_id} on this connection"),
        ));
    }
    agent.watches.stop(watch_id);
    Ok((Reply::Done, Vec::new()))
}

async fn forward(agent: Arc<Agent>, watch: Arc<Watch>, out: Outbound) {
    loop {
        let changed = watch.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        agent.until_running().await;
        let (batch, ended) = {
            let mut queue = lock(&watch.queue);
            let take = queue.events.len().min(BATCH_MAX);
            let batch: Vec<FsEvent> = queue.events.drain(..take).collect();
            if queue.events.is_empty() {
                queue.overflowed = false;
            }
            (batch, queue.ended.filter(|_| queue.events.is_empty()))
        };
        if !batch.is_empty() {
            let message = AgentMessage::FsEvents {
                watch_id: watch.id,
                events: batch,
            };
            if out.send(&message, &[]).await.is_err() {
                return;
            }
            continue;
        }
        if let Some(reason) = ended {
            let message = AgentMessage::WatchEnded {
                watch_id: watch.id,
                reason,
            };
            let _ = out.send(&message, &[]).await;
            return;
        }
        changed.await;
    }
}
