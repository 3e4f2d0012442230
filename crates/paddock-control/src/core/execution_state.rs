//! What the service holds for approved executions while it runs: the executor it was given, the
//! built-in sandbox executor's runs, and a cancel switch per running execution.
//!
//! What it does not do: anything with them (`ops/executions` does); executions themselves are in
//! the store.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use crate::core::executor::{Executor, Finished};

/// The executions' in-memory part.
#[derive(Default)]
pub(crate) struct ExecutionsState {
    /// The executor set with `set_executor`; `None`: the built-in sandbox executor.
    pub(crate) executor: Mutex<Option<Arc<dyn Executor>>>,
    /// The sandbox executor's runs by object (sandbox id): `None` while running.
    pub(crate) runs: Mutex<HashMap<String, Option<Finished>>>,
    /// The follower of each running execution, by id.
    pub(crate) cancels: Mutex<HashMap<String, Follower>>,
    /// Woken when a sandbox executor's run ends, so its follower need not wait for its next poll.
    pub(crate) run_ended: tokio::sync::Notify,
}

/// A running execution's follower: a switch that cancels it, and one it turns when it has
/// recorded the end.
#[derive(Debug, Clone, Default)]
pub(crate) struct Follower {
    pub(crate) cancel: CancellationToken,
    pub(crate) ended: CancellationToken,
}

impl std::fmt::Debug for ExecutionsState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionsState").finish_non_exhaustive()
    }
}
