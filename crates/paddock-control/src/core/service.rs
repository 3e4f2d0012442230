//! The service object: shared state, store access, audit rows, startup and shutdown.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_runtime::{AnyBackend, RuntimeError};
use paddock_store::{Store, StoreError};
use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::core::audit::AuditEntry;
use crate::core::live::{lock, LiveSandbox};
use crate::core::metrics::Metrics;
use crate::core::time::now_ms;
use crate::{ServiceConfig, ServiceError};

/// The control plane's service. Cheap to clone (all clones share one state).
#[derive(Debug, Clone)]
pub struct SandboxService {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: ServiceConfig,
    pub(crate) backend: Arc<AnyBackend>,
    pub(crate) store: Arc<Store>,
    /// Sandboxes with a live agent connection, warm ones included.
    pub(crate) live: Mutex<HashMap<SandboxId, Arc<LiveSandbox>>>,
    pub(crate) metrics: Metrics,
    /// Wakes the warm-pool fillers (a claim happened).
    pub(crate) pool_wakeup: Notify,
    /// When sandbox requests last began (refills wait for a quiet moment).
    pub(crate) activity: crate::core::activity::Activity,
    pub(crate) stop: CancellationToken,
    /// The egress proxy, when sandboxes may have a network.
    pub(crate) egress: Option<Arc<paddock_egress::Egress>>,
    /// Networked sandboxes being served on the egress proxy, by id.
    pub(crate) served: Mutex<HashMap<SandboxId, crate::core::live::Served>>,
    pub(crate) tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Output held by requests answered with one collected JSON document, all together.
    pub(crate) collect_budget: crate::core::output::collect::OutputBudget,
    /// Sandboxes the store says are live that recovery has not finished with yet (see
    /// `recovery.rs`): a request for one answers `sandbox_recovering`.
    pub(crate) recovering: Mutex<HashSet<SandboxId>>,
    /// Cancelled once recovery has finished with every sandbox.
    pub(crate) recovered: CancellationToken,
    /// Connections open to sandboxes' ports, under their caps.
    pub(crate) port_gate: Arc<crate::core::ports::PortGate>,
    /// Which port connections get audit rows (`lifecycle/port_audit.rs`).
    pub(crate) port_audit: Mutex<crate::core::audit::ports::PortAudit>,
    /// The configured templates the server built (from an image or a recipe): name to template
    /// id, once ready. Sandboxes of one absent here cannot be made yet.
    pub(crate) built_templates: Mutex<HashMap<String, paddock_types::TemplateId>>,
    /// The approvals queue's change events.
    pub(crate) approvals: crate::core::approval_state::Queue,
    /// Compiled approval policies by scope.
    pub(crate) policies: crate::core::approval_state::PolicyCache,
    /// Approved executions' executor, runs and cancel switches.
    pub(crate) executions: crate::core::execution_state::ExecutionsState,
}

impl SandboxService {
    /// Returns once recovery after the start has finished with every sandbox (at once when there
    /// was nothing to recover).
    pub async fn recovered(&self) {
        self.inner.recovered.cancelled().await;
    }

    /// How many sandboxes recovery has not finished with yet.
    pub fn recovering(&self) -> usize {
        lock(&self.inner.recovering).len()
    }

    /// Records that `op` on sandbox `sandbox` is about to begin (see `recovery.rs`); the intent's id.
    pub(crate) async fn begin_intent(
        &self,
        sandbox: &str,
        op: paddock_store::IntentOp,
        snapshot: Option<&str>,
        detail: serde_json::Value,
    ) -> Result<i64, ServiceError> {
        let (sandbox, snapshot) = (sandbox.to_owned(), snapshot.map(str::to_owned));
        self.db("record an operation's intent", move |s| {
            s.begin_intent(&paddock_store::NewIntent {
                sandbox_id: &sandbox,
                op,
                snapshot_id: snapshot.as_deref(),
                detail,
                created_at_ms: now_ms(),
            })
        })
        .await
    }

    /// Removes an intent whose operation is over (its outcome recorded elsewhere). A failure is
    /// logged: the next start finds the intent and recovery treats the operation as interrupted.
    pub(crate) async fn end_intent(&self, intent: i64) {
        if let Err(e) = self
            .db("end an operation's intent", move |s| s.end_intent(intent))
            .await
        {
            tracing::warn!(intent, error = %e.message, "an operation's intent was not removed");
        }
    }

    /// Stops the background tasks and lets the backend finish the teardown steps it runs in the
    /// background (at most 10 s; gc at the next start finishes what is left). Sandboxes keep
    /// running; the next start re-adopts them.
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        let tasks = std::mem::take(&mut *lock(&self.inner.tasks));
        for task in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
        let settled = self
            .on_backend("finish background teardowns", |b| {
                b.settle_teardowns(Duration::from_secs(10))
            })
            .await;
        if !matches!(settled, Ok(true)) {
            tracing::warn!("background teardowns still running at exit; gc at the next start finishes them");
        }
    }

    /// Runs a store operation on a blocking thread.
    pub(crate) async fn db<T, F>(&self, what: &'static str, f: F) -> Result<T, ServiceError>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    {
        let store = self.inner.store.clone();
        match tokio::task::spawn_blocking(move || f(&store)).await {
            Ok(result) => result.map_err(|e| store_error(what, e)),
            Err(join) => Err(ServiceError::internal(what, &join)),
        }
    }

    /// Appends an audit row. An operation whose row cannot be written fails: nothing happens
    /// unrecorded. The row is timed when written, under the store's write lock, as rows written in
    /// a caller's transaction are: timed before, a row that waited for the lock (a process's exit
    /// row from its monitor, beside a request's row) could follow a later-timed one.
    pub(crate) async fn audit(&self, entry: AuditEntry<'_>) -> Result<(), ServiceError> {
        let row = entry.into_row();
        self.db("write the audit log", move |s| {
            s.transaction(|tx| crate::core::audit::append(tx, &row))
        })
        .await
    }

    pub(crate) fn live_sandbox(&self, id: &str) -> Option<Arc<LiveSandbox>> {
        lock(&self.inner.live).get(id).cloned()
    }
}

pub(crate) fn store_error(what: &'static str, e: StoreError) -> ServiceError {
    if let Some(full) = crate::core::error::store_no_space(&e) {
        return full;
    }
    match e {
        StoreError::QuotaExceeded {
            what: kind,
            limit,
            requested_total,
            ..
        } => crate::core::error::quota_exceeded(kind, limit, requested_total),
        StoreError::Missing { what: "volume", id } => crate::core::error::volume_not_found(&id),
        StoreError::Conflict {
            what: "volume name",
            id,
        } => crate::core::error::volume_exists(&id),
        StoreError::Conflict {
            what: "template name",
            id,
        } => ServiceError::new(
            ErrorCode::TemplateExists,
            format!("a template named {id} already exists"),
        ),
        StoreError::Conflict {
            what: "secret name",
            id,
        } => ServiceError {
            code: ErrorCode::AlreadyExists,
            message: format!("secret {id:?} exists; delete it first to replace it"),
            field: Some("name".into()),
            approval_id: None,
        },
        other => ServiceError::internal(what, &other),
    }
}

pub(crate) fn runtime_error(what: &'static str, e: RuntimeError) -> ServiceError {
    ServiceError::from_runtime(what, e)
}

pub(crate) fn new_sandbox_id() -> SandboxId {
    SandboxId::from_random(rand::random())
}
