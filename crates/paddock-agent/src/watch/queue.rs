//! A watch's queue of events and the task that forwards them to its connection in batches.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

use paddock_protocol::{AgentMessage, FsEvent, FsEventKind, WatchEndReason, MAX_HEADER_LEN};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Watch, BATCH_MAX, FLUSH_INTERVAL, QUEUE_MAX};
use crate::outbound::Outbound;

/// JSON bytes of events per message (the rest of the header is a few dozen bytes).
const BATCH_BUDGET: usize = MAX_HEADER_LEN - 1024;

/// Events waiting to be sent.
#[derive(Debug)]
pub(super) struct EventQueue {
    /// The watched directory (where `overflow` events point).
    root: String,
    state: RefCell<QueueState>,
    /// Signalled on every change.
    changed: Notify,
}

#[derive(Debug, Default)]
struct QueueState {
    events: VecDeque<FsEvent>,
    /// The queue ends with an `overflow` event: later events are dropped until it is sent.
    overflowed: bool,
    ended: Option<WatchEndReason>,
}

impl EventQueue {
    pub(super) fn new(root: String) -> Self {
        Self {
            root,
            state: RefCell::new(QueueState::default()),
            changed: Notify::new(),
        }
    }

    /// Queues `event`, unless it repeats the last queued one; a full queue ends with an `overflow`.
    pub(super) fn push(&self, event: FsEvent) {
        let mut state = self.state.borrow_mut();
        if state.ended.is_some() || state.overflowed || state.events.back() == Some(&event) {
            return;
        }
        if state.events.len() + 1 >= QUEUE_MAX {
            drop(state);
            return self.overflow();
        }
        state.events.push_back(event);
        drop(state);
        self.changed.notify_one();
    }

    /// Says that events were lost.
    pub(super) fn overflow(&self) {
        let mut state = self.state.borrow_mut();
        if state.ended.is_some() || state.overflowed {
            return;
        }
        state.events.push_back(FsEvent {
            path: self.root.clone(),
            kind: FsEventKind::Overflow,
            is_dir: true,
        });
        state.overflowed = true;
        drop(state);
        self.changed.notify_one();
    }

    /// No events follow; the forwarder sends what is queued, then `watch_ended`.
    pub(super) fn end(&self, reason: WatchEndReason) {
        self.state.borrow_mut().ended.get_or_insert(reason);
        self.changed.notify_one();
    }

    fn len(&self) -> usize {
        self.state.borrow().events.len()
    }

    fn ended(&self) -> Option<WatchEndReason> {
        self.state.borrow().ended
    }

    /// Takes the oldest events that fit one message.
    fn take_batch(&self) -> Vec<FsEvent> {
        let mut state = self.state.borrow_mut();
        let mut batch = Vec::new();
        let mut used = 2;
        while batch.len() < BATCH_MAX {
            let Some(event) = state.events.front() else {
                break;
            };
            let size = serde_json::to_vec(event).map_or(BATCH_BUDGET, |v| v.len()) + 1;
            if used + size > BATCH_BUDGET && !batch.is_empty() {
                break;
            }
            used += size;
            if let Some(event) = state.events.pop_front() {
                if event.kind == FsEventKind::Overflow {
                    state.overflowed = false;
                }
                batch.push(event);
            }
        }
        batch
    }
}

/// Sends `watch`'s events to `out` until the watch ends (or is stopped, which aborts this task).
pub(super) async fn forward(watch: Rc<Watch>, out: Outbound) {
    let queue = &watch.queue;
    loop {
        // Wait for a first event (or the end)...
        while queue.len() == 0 && queue.ended().is_none() {
            queue.changed.notified().await;
        }
        // ...then collect more for a moment, unless a batch is full or the watch ended.
        let deadline = Instant::now() + FLUSH_INTERVAL;
        while queue.len() < BATCH_MAX && queue.ended().is_none() {
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => break,
                () = queue.changed.notified() => {}
            }
        }
        loop {
            let events = queue.take_batch();
            if events.is_empty() {
                break;
            }
            let message = AgentMessage::FsEvents {
                watch_id: watch.id,
                events,
            };
            if out.send(&message, &[]).await.is_err() {
                return;
            }
        }
        if let Some(reason) = queue.ended() {
            if queue.len() == 0 {
                let message = AgentMessage::WatchEnded {
                    watch_id: watch.id,
                    reason,
                };
                let _ = out.send(&message, &[]).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(i: usize) -> FsEvent {
        FsEvent {
            path: format!("/tmp/{i}"),
            kind: FsEventKind::Modify,
            is_dir: false,
        }
    }

    #[test]
    fn repeats_merge_and_overflow_bounds_the_queue() {
        let queue = EventQueue::new("/tmp".into());
        queue.push(event(1));
        queue.push(event(1));
        queue.push(event(2));
        assert_eq!(queue.len(), 2, "a repeated event is merged");
        for i in 0..2 * QUEUE_MAX {
            queue.push(event(i + 10));
        }
        assert_eq!(queue.len(), QUEUE_MAX, "full, the overflow event included");
        let mut all = Vec::new();
        loop {
            let batch = queue.take_batch();
            if batch.is_empty() {
                break;
            }
            assert!(batch.len() <= BATCH_MAX);
            all.extend(batch);
        }
        let last = all.last().expect("events");
        assert_eq!((last.kind, last.path.as_str()), (FsEventKind::Overflow, "/tmp"));
        assert_eq!(all.iter().filter(|e| e.kind == FsEventKind::Overflow).count(), 1);
        // Once the overflow was taken, events queue again.
        queue.push(event(1));
        assert_eq!(queue.len(), 1);
    }

    #[test]
    fn batches_fit_a_header() {
        let queue = EventQueue::new("/".into());
        for i in 0..200 {
            queue.push(FsEvent {
                path: format!("/{}{i}", "\u{1}".repeat(4000)),
                kind: FsEventKind::Create,
                is_dir: false,
            });
        }
        let batch = queue.take_batch();
        assert!(!batch.is_empty() && batch.len() < 200);
        let json = serde_json::to_vec(&batch).expect("json");
        assert!(json.len() <= BATCH_BUDGET, "{}", json.len());
    }
}
