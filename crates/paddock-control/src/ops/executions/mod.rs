//! Approved executions (`/v1/executions`): a command an agent proposes, held as a pending
//! approval until a person approves it, then run once on the configured executor, with its state,
//! exit code and capped logs recorded. Every step is an audit row: `execution.request`,
//! `approval.approve`/`approval.reject`, `execution.start`, `execution.finish`,
//! `execution.cancel`.
//!
//! - here: asking (an execution row and its approval, written together), reading, cancelling;
//! - `runner.rs`: what happens once a person decides (start, follow, finish), and after a restart;
//! - `sandbox.rs`: the built-in `sandbox` executor.
//!
//! What it does not do: decide on an approval (`ops/approvals.rs`), or talk to Kubernetes (the
//! `paddock-kube` crate's executor is given with [`SandboxService::set_executor`]).

mod runner;
mod sandbox;

use std::sync::Arc;
use std::time::Duration;

use paddock_store::ExecutionRecord;
use paddock_types::api::{
    ApprovalKind, CreateExecutionRequest, ErrorCode, ExecutionInfo, ExecutionList, ExecutionState,
    ListExecutionsQuery,
};

use crate::core::approvals::{request_sha256, Asked};
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::executor::{ExecutionSpec, Executor};
use crate::core::live::lock;
use crate::core::time::{now_ms, rfc3339};
use crate::{Principal, SandboxService, ServiceError};

/// The longest description, caller id, session or task id, template or image name.
const MAX_DESCRIPTION: usize = 4096;
const MAX_ID: usize = 128;
const MAX_ARGV: usize = 4096;
/// How long a cancel waits for a running execution's executor to end it.
const CANCEL_WAIT: Duration = Duration::from_secs(120);

fn execution_not_found(id: &str) -> ServiceError {
    ServiceError::new(ErrorCode::ExecutionNotFound, format!("execution {id} not found"))
}

fn check(req: &CreateExecutionRequest) -> Result<(), ServiceError> {
    if req.command.is_empty() || req.command[0].is_empty() {
        return Err(ServiceError::invalid("command", "command must name a program"));
    }
    if req.command.len() + req.args.len() > MAX_ARGV {
        return Err(ServiceError::invalid(
            "args",
            format!("at most {MAX_ARGV} arguments in all"),
        ));
    }
    if req.command.iter().chain(&req.args).any(|a| a.contains('\0')) {
        return Err(ServiceError::invalid(
            "command",
            "arguments cannot contain NUL bytes",
        ));
    }
    crate::plan::create::check_env("env", &req.env)?;
    if req.description.trim().is_empty() || req.description.len() > MAX_DESCRIPTION {
        return Err(ServiceError::invalid(
            "description",
            format!("say what it is for, in at most {MAX_DESCRIPTION} bytes"),
        ));
    }
    for (field, value) in [
        ("id", &req.id),
        ("session_id", &req.session_id),
        ("task_id", &req.task_id),
        ("template", &req.template),
        ("image", &req.image),
    ] {
        if value
            .as_ref()
            .is_some_and(|v| v.is_empty() || v.len() > MAX_ID * 4 || v.contains('\0'))
        {
            return Err(ServiceError::invalid(field, "from 1 to 512 bytes, no NUL"));
        }
    }
    if req.id.as_ref().is_some_and(|v| v.len() > MAX_ID) {
        return Err(ServiceError::invalid("id", format!("at most {MAX_ID} bytes")));
    }
    if req.timeout_secs == Some(0) {
        return Err(ServiceError::invalid("timeout_secs", "at least 1"));
    }
    Ok(())
}

/// The wire form of a stored execution.
pub(crate) fn execution_info(r: &ExecutionRecord) -> Result<ExecutionInfo, ServiceError> {
    let request: CreateExecutionRequest = serde_json::from_str(&r.spec)
        .map_err(|e| ServiceError::internal("read an execution's request", &e))?;
    Ok(ExecutionInfo {
        id: r.id.clone(),
        client_id: r.client_id.clone(),
        session_id: r.session_id.clone(),
        task_id: r.task_id.clone(),
        state: ExecutionState::parse(&r.state)
            .ok_or_else(|| ServiceError::internal("read an execution", &format!("state {:?}", r.state)))?,
        description: r.description.clone(),
        request,
        executor: r.executor.clone(),
        object: r.object.clone(),
        approval_id: r.approval_id.clone(),
        requested_by: r.requested_by.clone(),
        approved_by: r.approved_by.clone(),
        exit_code: r.exit_code,
        logs: r.logs.as_ref().map(|l| String::from_utf8_lossy(l).into_owned()),
        logs_truncated: r.logs_truncated,
        message: r.message.clone(),
        created_at: rfc3339(r.created_at_ms),
        started_at: r.started_at_ms.map(rfc3339),
        finished_at: r.finished_at_ms.map(rfc3339),
    })
}

impl SandboxService {
    /// Runs approved executions on `executor` from now on (instead of the built-in `sandbox`
    /// executor). Set it once, right after the service starts.
    pub fn set_executor(&self, executor: Arc<dyn Executor>) {
        *lock(&self.inner.executions.executor) = Some(executor);
    }

    /// The executor approved executions run on.
    pub(crate) fn executor(&self) -> Arc<dyn Executor> {
        match lock(&self.inner.executions.executor).clone() {
            Some(executor) => executor,
            None => Arc::new(sandbox::SandboxExecutor::new(self.clone())),
        }
    }

    /// What `r` runs, as its executor takes it.
    pub(crate) fn execution_spec(&self, r: &ExecutionRecord) -> Result<ExecutionSpec, ServiceError> {
        let req: CreateExecutionRequest = serde_json::from_str(&r.spec)
            .map_err(|e| ServiceError::internal("read an execution's request", &e))?;
        let config = &self.inner.config.executions;
        let timeout = req
            .timeout_secs
            .map_or(config.default_timeout, Duration::from_secs)
            .min(config.max_timeout);
        let labels = [("session_id", &r.session_id), ("task_id", &r.task_id)]
            .into_iter()
            .filter_map(|(k, v)| v.clone().map(|v| (k.to_owned(), v)))
            .collect();
        Ok(ExecutionSpec {
            id: r.id.clone(),
            tenant: r.tenant.clone(),
            template: req.template,
            image: req.image,
            command: req.command,
            args: req.args,
            env: req.env,
            timeout,
            log_limit: config.log_limit,
            labels,
        })
    }

    /// `POST /v1/executions`: records the execution and its pending approval (one transaction,
    /// with the `execution.request` and `approval.request` rows); nothing runs until a person
    /// approves it. A request repeating an earlier one's `id` answers that execution.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant))]
    pub async fn create_execution(
        &self,
        p: &Principal,
        req: CreateExecutionRequest,
    ) -> Result<ExecutionInfo, ServiceError> {
        check(&req)?;
        if let Some(client_id) = &req.id {
            let (tenant, client_id) = (p.tenant.clone(), client_id.clone());
            let earlier = self
                .db("read an execution", move |s| {
                    s.transaction(|tx| tx.execution_by_client_id(&tenant, &client_id))
                })
                .await?;
            if let Some(earlier) = earlier {
                return execution_info(&earlier);
            }
        }
        let config = &self.inner.config.executions;
        let timeout = req
            .timeout_secs
            .map_or(config.default_timeout, Duration::from_secs);
        if timeout > config.max_timeout {
            return Err(ServiceError::invalid(
                "timeout_secs",
                format!("at most {} seconds", config.max_timeout.as_secs()),
            ));
        }
        let executor = self.executor().backend();
        let request = serde_json::to_value(&req)
            .map_err(|e| ServiceError::internal("encode an execution's request", &e))?;
        let sha = request_sha256(&request);
        let summary = req
            .command
            .iter()
            .chain(&req.args)
            .cloned()
            .collect::<Vec<_>>()
            .join(" ");
        let pending = self.pending_approval(
            p,
            None,
            Asked {
                kind: ApprovalKind::Execution,
                summary,
                request,
            },
            sha,
            "tenant",
            None,
            Some(format!(
                "an approved execution always asks a person: {}",
                req.description
            )),
        );
        let id = format!("ex-{:016x}", rand::random::<u64>());
        let record = ExecutionRecord {
            id: id.clone(),
            tenant: p.tenant.clone(),
            client_id: req.id.clone(),
            session_id: req.session_id.clone(),
            task_id: req.task_id.clone(),
            description: req.description.clone(),
            spec: serde_json::to_string(&req)
                .map_err(|e| ServiceError::internal("encode an execution's request", &e))?,
            executor: executor.to_owned(),
            approval_id: pending.record.id.clone(),
            requested_by: p.key_id.clone(),
            state: ExecutionState::PendingApproval.as_str().to_owned(),
            object: None,
            exit_code: None,
            logs: None,
            logs_truncated: false,
            message: None,
            approved_by: None,
            created_at_ms: now_ms(),
            started_at_ms: None,
            finished_at_ms: None,
        };
        let entry = AuditEntry::ok(p, AuditAction::ExecutionRequest, None)
            .detail(audit::ExecutionRequested {
                execution_id: id.clone(),
                approval_id: pending.record.id.clone(),
                executor,
                description: req.description.clone(),
                command: req.command.clone(),
                args: req.args.clone(),
                template: req.template.clone(),
                image: req.image.clone(),
                session_id: req.session_id.clone(),
                task_id: req.task_id.clone(),
                timeout_secs: timeout.as_secs(),
            })
            .into_row();
        let approval = pending.record.clone();
        let (stored, limits, keep) = (
            record.clone(),
            self.approval_limits(),
            config.keep_ended_per_tenant,
        );
        self.db("record an execution", move |s| {
            s.transaction(|tx| {
                pending.write(tx, limits)?;
                tx.insert_execution(&stored, keep)?;
                audit::append(tx, &entry)
            })
        })
        .await?;
        self.announce_approval("requested", &approval);
        execution_info(&record)
    }

    async fn execution_record(&self, p: &Principal, id: &str) -> Result<ExecutionRecord, ServiceError> {
        let (tenant, id_owned) = (p.tenant.clone(), id.to_owned());
        self.db("read an execution", move |s| s.get_execution(&tenant, &id_owned))
            .await?
            .ok_or_else(|| execution_not_found(id))
    }

    /// `GET /v1/executions/{id}`.
    pub async fn get_execution(&self, p: &Principal, id: &str) -> Result<ExecutionInfo, ServiceError> {
        execution_info(&self.execution_record(p, id).await?)
    }

    /// `GET /v1/executions`: the tenant's, newest first.
    pub async fn list_executions(
        &self,
        p: &Principal,
        q: ListExecutionsQuery,
    ) -> Result<ExecutionList, ServiceError> {
        let limit = q.limit.unwrap_or(100);
        if limit == 0 || limit > 1000 {
            return Err(ServiceError::invalid("limit", "from 1 to 1000"));
        }
        let tenant = p.tenant.clone();
        let rows = self
            .db("list executions", move |s| s.list_executions(&tenant, limit))
            .await?;
        Ok(ExecutionList {
            executions: rows.iter().map(execution_info).collect::<Result<_, _>>()?,
        })
    }

    /// `POST /v1/executions/{id}/cancel`: a pending one is cancelled with its approval (which can
    /// then no longer be approved); a running one is ended by its executor (the answer comes once
    /// it has); an ended one is left as it is. Any key of the tenant may cancel.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant, execution = %id))]
    pub async fn cancel_execution(&self, p: &Principal, id: &str) -> Result<ExecutionInfo, ServiceError> {
        let record = self.execution_record(p, id).await?;
        match ExecutionState::parse(&record.state) {
            Some(ExecutionState::PendingApproval) => {
                self.cancel_pending_execution(p, &record).await?;
            }
            Some(ExecutionState::Running) => {
                let follower = lock(&self.inner.executions.cancels).get(id).cloned();
                match follower {
                    Some(follower) => {
                        self.audit(AuditEntry::ok(p, AuditAction::ExecutionCancel, None).detail(
                            audit::ExecutionCancelled {
                                execution_id: id.to_owned(),
                                from: record.state.clone(),
                            },
                        ))
                        .await?;
                        follower.cancel.cancel();
                        if tokio::time::timeout(CANCEL_WAIT, follower.ended.cancelled())
                            .await
                            .is_err()
                        {
                            return Err(ServiceError::new(
                                ErrorCode::Timeout,
                                format!("execution {id} is still being cancelled; read it again later"),
                            ));
                        }
                    }
                    // Its runner is starting it or finishing it right now: ask again.
                    None => {
                        return Err(ServiceError::new(
                            ErrorCode::Unavailable,
                            format!("execution {id} is changing state; retry the cancel"),
                        ))
                    }
                }
            }
            _ => {}
        }
        self.get_execution(p, id).await
    }

    /// Cancels a pending execution: its approval is rejected in the same transaction (by the
    /// cancelling key, noted as a cancel), so a later approval cannot start it.
    async fn cancel_pending_execution(&self, p: &Principal, r: &ExecutionRecord) -> Result<(), ServiceError> {
        let now = now_ms();
        let cancel = AuditEntry::ok(p, AuditAction::ExecutionCancel, None)
            .detail(audit::ExecutionCancelled {
                execution_id: r.id.clone(),
                from: r.state.clone(),
            })
            .into_row();
        let (tenant, id, approval, by) = (
            r.tenant.clone(),
            r.id.clone(),
            r.approval_id.clone(),
            p.key_id.clone(),
        );
        let changed = self
            .db("cancel an execution", move |s| {
                s.transaction(|tx| {
                    let change = paddock_store::ExecutionChange {
                        from: &["pending_approval"],
                        to: "cancelled",
                        message: Some("cancelled before it was approved"),
                        finished_at_ms: Some(now),
                        ..Default::default()
                    };
                    if !tx.change_execution(&tenant, &id, &change)? {
                        return Ok(None);
                    }
                    let decision = paddock_store::ApprovalDecision {
                        approved: false,
                        by: &by,
                        note: Some("the execution was cancelled"),
                        at_ms: now,
                        use_by_ms: now,
                    };
                    tx.decide_approval(&tenant, &approval, &decision)?;
                    audit::append(tx, &cancel)?;
                    tx.get_approval(&tenant, &approval)
                })
            })
            .await?;
        if let Some(approval) = changed {
            self.announce_approval("rejected", &approval);
        }
        Ok(())
    }
}
