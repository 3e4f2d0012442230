//! What the service holds for approvals: the queue's change events and the compiled policies by
//! scope (`core/approvals/policies.rs` reads and fills that cache).
//!
//! What it does not do: anything with them (the rest of `core/approvals` does).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use paddock_policy::Policy;
use paddock_types::api::ApprovalEvent;
use tokio::sync::broadcast;

/// Queue changes buffered for slow listeners (a listener that falls behind re-reads the store).
const EVENTS: usize = 1024;

/// What the queue shares: its change events.
#[derive(Debug)]
pub(crate) struct Queue {
    events: broadcast::Sender<ApprovalEvent>,
}

impl Queue {
    pub(crate) fn new() -> Self {
        Self {
            events: broadcast::channel(EVENTS).0,
        }
    }
}

impl Queue {
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<ApprovalEvent> {
        self.events.subscribe()
    }

    /// Sends a change; `Err` when no one listens (the store has the change anyway).
    pub(crate) fn send(
        &self,
        event: ApprovalEvent,
    ) -> Result<usize, Box<broadcast::error::SendError<ApprovalEvent>>> {
        self.events.send(event).map_err(Box::new)
    }
}

/// `(tenant, sandbox id or "")` to that scope's compiled policy (`None`: none set), and a count of
/// forgets: a read of the store that began before a forget does not fill the cache after it.
#[derive(Debug, Default)]
pub(crate) struct PolicyCache(pub(crate) Mutex<Cached>);

#[derive(Debug, Default)]
pub(crate) struct Cached {
    pub(crate) scopes: HashMap<(String, String), Option<Arc<Policy>>>,
    pub(crate) forgets: u64,
}
