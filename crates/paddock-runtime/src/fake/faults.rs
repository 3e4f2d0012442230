//! Fault injection: the next call of a named backend operation fails with an error the test chose
//! (a full pool on `create_sandbox`, say), so the control plane's error paths can be tested.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use super::agent::lock;
use crate::RuntimeError;

/// The operations a failure can be injected into: every fallible method of the two backend traits.
pub const OPERATIONS: [&str; 28] = [
    "create_sandbox",
    "destroy_sandbox",
    "collect_garbage",
    "stop_sandbox",
    "delete_stopped",
    "park_sandbox",
    "adopt_sandbox",
    "sandbox_usage",
    "update_limits",
    "reclaim_sandbox",
    "pause_sandbox",
    "resume_sandbox",
    "freeze_sandbox",
    "prepare_rollback",
    "discard_rollback",
    "rollback_sandbox",
    "open_port",
    "snapshot_sandbox",
    "delete_snapshot",
    "snapshot_usage",
    "list_snapshots",
    "export_snapshot",
    "import_snapshot",
    "create_volume",
    "delete_volume",
    "volume_usage",
    "list_volumes",
    "diff_sandbox",
];

/// Errors waiting for their operation, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    queued: Mutex<HashMap<&'static str, VecDeque<RuntimeError>>>,
}

impl Faults {
    /// Queues `error` for the next call of `operation` (one of [`OPERATIONS`]).
    ///
    /// # Panics
    /// On an operation name that is not in [`OPERATIONS`] (a typo in a test).
    pub(crate) fn push(&self, operation: &str, error: RuntimeError) {
        let Some(name) = OPERATIONS.iter().find(|o| **o == operation) else {
            panic!("no backend operation {operation:?}; use one of {OPERATIONS:?}");
        };
        lock(&self.queued).entry(name).or_default().push_back(error);
    }

    /// The error queued for this call of `operation`, if any.
    pub(crate) fn take(&self, operation: &'static str) -> Result<(), RuntimeError> {
        match lock(&self.queued)
            .get_mut(operation)
            .and_then(VecDeque::pop_front)
        {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}
