//! What happens to an execution once a person decides: approved, it is started (its approval
//! marked used in the same transaction that marks it running, so it starts once), followed until
//! its executor says it ended, past its deadline it is ended, and cancelled when asked; rejected or
//! expired, it is recorded `rejected` and never runs.
//!
//! One task listens to the approvals queue for the whole server; each running execution has a
//! follower task. After a restart the same task first goes through what the store has open:
//! approved-but-unstarted executions start, rejected ones are closed, running ones are followed
//! again (an executor that lost its object, as the `sandbox` one does at a restart, ends them
//! `failed`; nothing is run a second time).
//!
//! What it does not do: ask for approvals or answer the API (`mod.rs`).

use std::time::Duration;

use paddock_store::{ApprovalUse, ExecutionChange, ExecutionRecord};
use paddock_types::api::{ApprovalKind, ApprovalState, ExecutionState};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::core::approvals::state_at;
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::execution_state::Follower;
use crate::core::executor::{ExecutorStatus, Finished, Outcome};
use crate::core::live::lock;
use crate::core::time::now_ms;
use crate::{SandboxService, ServiceError};

/// How long past its timeout an execution may run before paddock ends it itself (the executor
/// should have: a sandbox's process timeout, a Job's deadline).
const DEADLINE_GRACE: Duration = Duration::from_secs(30);
/// Failed status reads in a row before an execution is given up as `failed`.
const STATUS_FAILURES: u32 = 10;

fn outcome_state(o: Outcome) -> ExecutionState {
    match o {
        Outcome::Succeeded => ExecutionState::Succeeded,
        Outcome::Failed => ExecutionState::Failed,
        Outcome::TimedOut => ExecutionState::TimedOut,
        Outcome::Cancelled => ExecutionState::Cancelled,
    }
}

impl SandboxService {
    /// The executions' task: open executions first, then every decision, until the service stops.
    pub(crate) async fn run_executions(self) {
        let mut events = self.approval_events();
        self.resume_executions().await;
        loop {
            let event = tokio::select! {
                () = self.inner.stop.cancelled() => return,
                event = events.recv() => event,
            };
            match event {
                Ok(event) if event.approval.kind == ApprovalKind::Execution => {
                    if matches!(
                        event.approval.state,
                        ApprovalState::Approved | ApprovalState::Rejected | ApprovalState::Expired
                    ) && event.event != "used"
                    {
                        self.decided(&event.approval.id).await;
                    }
                }
                Ok(_) => {}
                // Missed decisions are in the store: go through what is open again.
                Err(RecvError::Lagged(_)) => self.resume_executions().await,
                Err(RecvError::Closed) => return,
            }
        }
    }

    /// Goes through every open execution (at the start, and after missed events).
    async fn resume_executions(&self) {
        let open = match self.db("list open executions", |s| s.open_executions()).await {
            Ok(open) => open,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read open executions");
                return;
            }
        };
        for r in open {
            if r.state == ExecutionState::Running.as_str() {
                if !lock(&self.inner.executions.cancels).contains_key(&r.id) {
                    self.follow(r, None);
                }
            } else {
                self.decided(&r.approval_id).await;
            }
        }
    }

    /// Acts on the decision about approval `approval_id`, if an execution waits on it.
    async fn decided(&self, approval_id: &str) {
        let id = approval_id.to_owned();
        let found = self
            .db("read an execution", move |s| {
                let Some(ex) = s.execution_of_approval(&id)? else {
                    return Ok(None);
                };
                Ok(s.get_approval(&ex.tenant, &id)?.map(|a| (ex, a)))
            })
            .await;
        let (ex, approval) = match found {
            Ok(Some(found)) => found,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, approval = approval_id, "cannot read an execution");
                return;
            }
        };
        if ex.state != ExecutionState::PendingApproval.as_str() {
            return;
        }
        let id = ex.id.clone();
        let result = match state_at(&approval, now_ms()) {
            ApprovalState::Pending => Ok(()),
            ApprovalState::Approved => self.start_execution(ex).await,
            ApprovalState::Rejected | ApprovalState::Expired => {
                let message = if approval.state == "rejected" {
                    "its approval was rejected: nothing ran"
                } else {
                    "its approval expired: nothing ran"
                };
                self.close_unstarted(&ex, message).await
            }
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, execution = %id, "acting on an execution's approval failed");
        }
    }

    /// Records a pending execution `rejected` (its approval was rejected or expired).
    async fn close_unstarted(&self, ex: &ExecutionRecord, message: &'static str) -> Result<(), ServiceError> {
        let end = End {
            state: ExecutionState::Rejected,
            exit_code: None,
            logs: None,
            truncated: false,
            message: Some(message.to_owned()),
        };
        self.record_end(ex, "pending_approval", end).await
    }

    /// Starts an approved execution: uses its approval and marks it running in one transaction
    /// (so of two starters one wins), then follows it.
    async fn start_execution(&self, ex: ExecutionRecord) -> Result<(), ServiceError> {
        let executor = self.executor();
        let (tenant, id, approval_id) = (ex.tenant.clone(), ex.id.clone(), ex.approval_id.clone());
        let backend = executor.backend().to_owned();
        let started = self
            .db("start an execution", move |s| {
                s.transaction(|tx| {
                    let pending = tx
                        .get_execution(&tenant, &id)?
                        .is_some_and(|e| e.state == "pending_approval");
                    let Some(approval) = tx.get_approval(&tenant, &approval_id)? else {
                        return Ok(None);
                    };
                    if !pending {
                        return Ok(None);
                    }
                    let now = now_ms();
                    if tx.use_approval(&tenant, &approval_id, None, &approval.request_sha256, now)?
                        != ApprovalUse::Granted
                    {
                        return Ok(None);
                    }
                    let change = ExecutionChange {
                        from: &["pending_approval"],
                        to: "running",
                        approved_by: approval.decided_by.as_deref(),
                        started_at_ms: Some(now),
                        ..Default::default()
                    };
                    tx.change_execution(&tenant, &id, &change)?;
                    let entry = AuditEntry::system(AuditAction::ExecutionStart, Some(tenant.clone()), None)
                        .detail(audit::ExecutionStarted {
                            execution_id: id.clone(),
                            approval_id: approval_id.clone(),
                            approved_by: approval.decided_by.clone(),
                            executor: backend.clone(),
                        })
                        .into_row();
                    audit::append(tx, &entry)?;
                    Ok(Some((
                        tx.get_execution(&tenant, &id)?,
                        tx.get_approval(&tenant, &approval_id)?,
                    )))
                })
            })
            .await;
        match started {
            Ok(Some((Some(running), approval))) => {
                if let Some(approval) = approval {
                    self.announce_approval("used", &approval);
                }
                self.follow(running, Some(executor));
                Ok(())
            }
            Ok(_) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Follows a running execution in a task of its own until it ends.
    fn follow(
        &self,
        ex: ExecutionRecord,
        executor: Option<std::sync::Arc<dyn crate::core::executor::Executor>>,
    ) {
        let follower = Follower::default();
        let cancel = follower.cancel.clone();
        let followed = follower.ended.clone();
        lock(&self.inner.executions.cancels).insert(ex.id.clone(), follower);
        let service = self.clone();
        let executor = executor.unwrap_or_else(|| self.executor());
        tokio::spawn(async move {
            let id = ex.id.clone();
            let ended = service.run_one(&ex, executor.as_ref(), &cancel).await;
            if let Err(e) = service.finish_execution(&ex, ended).await {
                tracing::warn!(error = %e, execution = %id, "recording an execution's end failed");
            }
            lock(&service.inner.executions.cancels).remove(&id);
            followed.cancel();
        });
    }

    /// Runs (or, after a restart, follows) one execution to its end.
    async fn run_one(
        &self,
        ex: &ExecutionRecord,
        executor: &dyn crate::core::executor::Executor,
        cancel: &CancellationToken,
    ) -> Finished {
        let failed = |message: String| Finished {
            outcome: Outcome::Failed,
            exit_code: None,
            logs: Vec::new(),
            truncated: false,
            message: Some(message),
        };
        let spec = match self.execution_spec(ex) {
            Ok(spec) => spec,
            Err(e) => return failed(e.message),
        };
        let object = match &ex.object {
            Some(object) => object.clone(),
            None => match executor.execute(&spec).await {
                Ok(object) => {
                    let (tenant, id, o) = (ex.tenant.clone(), ex.id.clone(), object.clone());
                    let _ = self
                        .db("record an execution's object", move |s| {
                            s.transaction(|tx| {
                                let change = ExecutionChange {
                                    from: &["running"],
                                    to: "running",
                                    object: Some(&o),
                                    ..Default::default()
                                };
                                tx.change_execution(&tenant, &id, &change)
                            })
                        })
                        .await;
                    object
                }
                Err(e) => {
                    return failed(format!(
                        "the {} executor could not start it: {e}",
                        executor.backend()
                    ))
                }
            },
        };
        let started = tokio::time::Instant::now();
        let deadline = spec.timeout + DEADLINE_GRACE;
        let mut failures = 0;
        let notify = &self.inner.executions.run_ended;
        let arm = || {
            let mut ended = Box::pin(notify.notified());
            ended.as_mut().enable();
            ended
        };
        let mut ended = arm();
        let mut first = true;
        loop {
            let cancelled = if std::mem::take(&mut first) {
                cancel.is_cancelled()
            } else {
                tokio::select! {
                    () = cancel.cancelled() => true,
                    () = &mut ended => false,
                    () = tokio::time::sleep(self.inner.config.executions.poll_interval) => false,
                }
            };
            // Armed before the status read below: a run that ends after that read wakes the wait.
            ended = arm();
            if cancelled || started.elapsed() > deadline {
                if let Err(e) = executor.cancel(&object).await {
                    tracing::warn!(error = %e, execution = %ex.id, "the executor could not cancel");
                }
                let (outcome, message) = if cancelled {
                    (Outcome::Cancelled, "cancelled while running")
                } else {
                    (Outcome::TimedOut, "ran past its timeout; paddock ended it")
                };
                return Finished {
                    outcome,
                    exit_code: None,
                    logs: Vec::new(),
                    truncated: false,
                    message: Some(message.to_owned()),
                };
            }
            match executor.status(&object, &spec).await {
                Ok(ExecutorStatus::Running) => failures = 0,
                Ok(ExecutorStatus::Finished(done)) => return done,
                Err(e) if e.gone => return failed(format!("{object} is gone: {e}")),
                Err(e) => {
                    failures += 1;
                    if failures >= STATUS_FAILURES {
                        return failed(format!("its status could not be read: {e}"));
                    }
                }
            }
        }
    }

    /// Records how a running execution ended.
    async fn finish_execution(&self, ex: &ExecutionRecord, done: Finished) -> Result<(), ServiceError> {
        let end = End {
            state: outcome_state(done.outcome),
            exit_code: done.exit_code.map(i64::from),
            logs: Some(done.logs),
            truncated: done.truncated,
            message: done.message,
        };
        self.record_end(ex, "running", end).await
    }

    /// Moves `ex` from `from` to its final state with what it ended with, and its
    /// `execution.finish` row, in one transaction; nothing if it had left `from` already.
    async fn record_end(
        &self,
        ex: &ExecutionRecord,
        from: &'static str,
        end: End,
    ) -> Result<(), ServiceError> {
        let entry = AuditEntry::system(AuditAction::ExecutionFinish, Some(ex.tenant.clone()), None)
            .outcome(end.state.as_str())
            .detail(audit::ExecutionFinished {
                execution_id: ex.id.clone(),
                state: end.state.as_str(),
                exit_code: end.exit_code,
                object: ex.object.clone(),
                logs_bytes: end.logs.as_ref().map_or(0, |l| l.len() as u64),
                logs_truncated: end.truncated,
                message: end.message.clone(),
            })
            .into_row();
        let (tenant, id) = (ex.tenant.clone(), ex.id.clone());
        self.db("record an execution's end", move |s| {
            s.transaction(|tx| {
                let change = ExecutionChange {
                    from: &[from],
                    to: end.state.as_str(),
                    exit_code: end.exit_code,
                    logs: end.logs.as_deref(),
                    logs_truncated: Some(end.truncated),
                    message: end.message.as_deref(),
                    finished_at_ms: Some(now_ms()),
                    ..Default::default()
                };
                if tx.change_execution(&tenant, &id, &change)? {
                    audit::append(tx, &entry)?;
                }
                Ok(())
            })
        })
        .await
    }
}

/// How an execution ended, as recorded.
struct End {
    state: ExecutionState,
    exit_code: Option<i64>,
    logs: Option<Vec<u8>>,
    truncated: bool,
    message: Option<String>,
}
