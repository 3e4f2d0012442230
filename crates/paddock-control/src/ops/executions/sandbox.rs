//! The built-in `sandbox` executor: an approved execution runs in a fresh sandbox of its
//! template, made for its tenant (under the tenant's quota, with the template's limits and the
//! default-deny network), as one foreground process with the execution's timeout. Its output is
//! kept up to the log limit; when it exits the sandbox is removed. The object is the sandbox's id.
//!
//! Its runs live in this server's memory: after a restart, `status` finds the object gone (the
//! runner records the execution `failed`; the sandbox, adopted by recovery, ends at its own
//! timeout). Nothing is ever run twice.
//!
//! What it does not do: check the tenant's approval policy (a person approved this very command;
//! its start row names the approval).

use paddock_types::api::{CreateSandboxRequest, ExecRequest};
use paddock_types::SandboxId;

use crate::core::executor::{
    BoxFuture, CappedLogs, ExecutionSpec, Executor, ExecutorError, ExecutorStatus, Finished, Outcome,
};
use crate::core::live::lock;
use crate::core::output::events::ExecOutput;
use crate::{Principal, SandboxService};

/// How long the sandbox may outlive the execution's timeout (its own timeout, should everything
/// else fail).
const SANDBOX_GRACE_SECS: u64 = 120;

pub(super) struct SandboxExecutor {
    service: SandboxService,
}

impl SandboxExecutor {
    pub(super) fn new(service: SandboxService) -> Self {
        Self { service }
    }
}

/// Who the execution's sandbox and process belong to: its tenant, acting as the execution (rows
/// name `execution:<id>` as their key).
fn principal(spec: &ExecutionSpec) -> Principal {
    Principal {
        tenant: spec.tenant.clone(),
        key_id: format!("execution:{}", spec.id),
        admin: false,
        change_network: false,
        approver: false,
    }
}

impl SandboxExecutor {
    async fn start(&self, spec: &ExecutionSpec) -> Result<String, ExecutorError> {
        let service = &self.service;
        let p = principal(spec);
        let (tenant, id) = (spec.tenant.clone(), spec.id.clone());
        let approval = service
            .db("read an execution", move |s| s.get_execution(&tenant, &id))
            .await
            .map_err(|e| ExecutorError::new(e.message))?
            .map(|r| r.approval_id)
            .ok_or_else(|| ExecutorError::gone("the execution is gone"))?;
        let create = CreateSandboxRequest {
            template: spec.template.clone(),
            timeout_secs: Some(spec.timeout.as_secs().saturating_add(SANDBOX_GRACE_SECS)),
            labels: [("paddock.execution".to_owned(), spec.id.clone())].into(),
            ..CreateSandboxRequest::default()
        };
        let info = service
            .create_sandbox(&p, create)
            .await
            .map_err(|e| ExecutorError::new(format!("{} ({})", e.message, e.code.as_str())))?;
        let sid: SandboxId = info
            .id
            .parse()
            .map_err(|_| ExecutorError::new(format!("a malformed sandbox id {}", info.id)))?;
        let request = ExecRequest {
            argv: Some(spec.command.iter().chain(&spec.args).cloned().collect()),
            env: spec.env.clone(),
            timeout_ms: Some(u64::try_from(spec.timeout.as_millis()).unwrap_or(u64::MAX)),
            tag: Some(format!("execution {}", spec.id)),
            ..ExecRequest::default()
        };
        let stream = match service.exec_approved(&p, &sid, request, approval).await {
            Ok(stream) => stream,
            Err(e) => {
                let _ = service.kill_sandbox(&p, &sid).await;
                return Err(ExecutorError::new(format!("{} ({})", e.message, e.code.as_str())));
            }
        };
        let object = sid.to_string();
        lock(&service.inner.executions.runs).insert(object.clone(), None);
        let (service, limit, key) = (service.clone(), spec.log_limit, object.clone());
        tokio::spawn(async move {
            let done = collect(stream, limit).await;
            // The run is over: its sandbox goes (already gone, if it was cancelled).
            let _ = service.kill_sandbox(&p, &sid).await;
            if let Some(slot) = lock(&service.inner.executions.runs).get_mut(&key) {
                *slot = Some(done);
            }
            service.inner.executions.run_ended.notify_waiters();
        });
        Ok(object)
    }
}

/// Reads a process's stream to its end: its output (capped) and how it ended.
async fn collect(mut stream: crate::ExecStream, limit: u64) -> Finished {
    let mut logs = CappedLogs::new(limit);
    let mut end = None;
    while let Some(event) = stream.recv().await {
        match event {
            ExecOutput::Started { .. } => {}
            ExecOutput::Output { data, .. } => logs.push(&data),
            ExecOutput::Exit(info) => end = Some(Ok(info)),
            ExecOutput::Error { message, .. } => end = Some(Err(message)),
        }
    }
    let (logs, truncated) = logs.into_parts();
    let (outcome, exit_code, message) = match end {
        Some(Ok(info)) if info.timed_out => (
            Outcome::TimedOut,
            Some(info.exit_code),
            Some("ran past its timeout and was killed".to_owned()),
        ),
        Some(Ok(info)) if info.exit_code == 0 => (Outcome::Succeeded, Some(0), None),
        Some(Ok(info)) => (
            Outcome::Failed,
            Some(info.exit_code),
            Some(format!("exited {}", info.exit_code)),
        ),
        Some(Err(message)) => (Outcome::Failed, None, Some(message)),
        None => (
            Outcome::Failed,
            None,
            Some("its output ended without an exit".to_owned()),
        ),
    };
    Finished {
        outcome,
        exit_code,
        logs,
        truncated,
        message,
    }
}

impl Executor for SandboxExecutor {
    fn backend(&self) -> &'static str {
        "sandbox"
    }

    fn execute<'a>(&'a self, spec: &'a ExecutionSpec) -> BoxFuture<'a, Result<String, ExecutorError>> {
        Box::pin(self.start(spec))
    }

    fn status<'a>(
        &'a self,
        object: &'a str,
        _spec: &'a ExecutionSpec,
    ) -> BoxFuture<'a, Result<ExecutorStatus, ExecutorError>> {
        Box::pin(async move {
            let mut runs = lock(&self.service.inner.executions.runs);
            match runs.get(object) {
                None => Err(ExecutorError::gone(
                    "this server has no run of it (it was started before a restart)",
                )),
                Some(None) => Ok(ExecutorStatus::Running),
                Some(Some(_)) => {
                    let done = runs.remove(object).flatten();
                    done.map(ExecutorStatus::Finished)
                        .ok_or_else(|| ExecutorError::gone("its run was already read"))
                }
            }
        })
    }

    fn cancel<'a>(&'a self, object: &'a str) -> BoxFuture<'a, Result<(), ExecutorError>> {
        Box::pin(async move {
            lock(&self.service.inner.executions.runs).remove(object);
            let Ok(id) = object.parse::<SandboxId>() else {
                return Ok(());
            };
            // Whoever's it is: the executor made it; an ended one is fine.
            let tenant = self
                .service
                .db("read a sandbox", {
                    let id = id.to_string();
                    move |s| s.get_sandbox(&id)
                })
                .await
                .ok()
                .flatten()
                .and_then(|r| r.tenant);
            let Some(tenant) = tenant else {
                return Ok(());
            };
            let p = Principal {
                tenant,
                key_id: "execution:cancel".to_owned(),
                admin: false,
                change_network: false,
                approver: false,
            };
            match self.service.kill_sandbox(&p, &id).await {
                Ok(()) => Ok(()),
                Err(e) if e.code == paddock_types::api::ErrorCode::SandboxNotFound => Ok(()),
                Err(e) if e.code == paddock_types::api::ErrorCode::SandboxNotRunning => Ok(()),
                Err(e) => Err(ExecutorError::new(e.message)),
            }
        })
    }
}
