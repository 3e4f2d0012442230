//! Running a cell: in the context the request names, or its language's default context (created
//! at the first cell, its id the language's name). The `code.run` row is written before the cell
//! is queued. The events stream back as `CodeEvent`s; a caller that goes away before the end
//! interrupts the cell, so an abandoned cell never holds its context.
//!
//! What it does not do: queue cells (the agent runs a context's cells one at a time, contexts
//! side by side) or bound events (the agent does; a collected document is bounded here).

use std::sync::Arc;

use paddock_protocol::kernel::{CellEvent, CellStatus};
use paddock_runtime::agent_client::CellEvents;
use paddock_types::api::{CodeEvent, CodeRunResult, ErrorCode, RunCodeRequest};
use paddock_types::SandboxId;
use sha2::Digest as _;

use super::events::{code_event, Collector};
use super::{language, position};
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::contexts::CodeContext;
use crate::core::live::LiveSandbox;
use crate::core::output::collect::{Held, OutputBudget};
use crate::core::principal::Principal;
use crate::lifecycle::kernels::kernel_error;
use crate::plan::code::{cell_env, check_cell_env_name, kernel_for, KERNELS};
use crate::{SandboxService, ServiceError};

/// Bytes of output a cell answered as one JSON document holds (as event JSON).
const COLLECTED_CELL_LIMIT: usize = 16 << 20;
/// The longest cell: `timeout_ms` above this is refused.
const MAX_CELL_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

/// A running cell's events, in order, ending with `End` (or `Failed` if the sandbox's agent went
/// away). Dropping it before the end interrupts the cell.
#[derive(Debug)]
pub struct CodeStream {
    started: Option<CodeEvent>,
    events: CellEvents,
    sb: Arc<LiveSandbox>,
    context: String,
    kernel_id: String,
    ended: bool,
    /// The server's collected-output budget and the tenant charged when the cell is collected.
    budget: (OutputBudget, String),
}

/// A cell answered as one document, holding its bytes against the server's collected-output
/// budget until it is sent.
#[derive(Debug)]
pub struct CollectedCell {
    doc: CodeRunResult,
    held: Held,
}

impl CollectedCell {
    /// The document's JSON, and what keeps the budget held until it is sent (drop it with it).
    pub fn into_json(self) -> (Vec<u8>, impl Send + Sync + 'static) {
        // Strings, numbers and JSON values: serializing them cannot fail.
        let json = serde_json::to_vec(&self.doc).unwrap_or_default();
        (json, self.held)
    }
}

impl CodeStream {
    /// The next event; `None` after the last.
    pub async fn recv(&mut self) -> Option<CodeEvent> {
        if let Some(started) = self.started.take() {
            return Some(started);
        }
        if self.ended {
            return None;
        }
        let event = match self.events.next().await {
            Some(event) => {
                // The kernel died under the cell, or was given up after it: its context is dead
                // (marked before the end is answered, so a caller who reads it sees the state).
                if let CellEvent::End {
                    status, kernel_dead, ..
                } = &event
                {
                    if *kernel_dead || *status == CellStatus::KernelDied {
                        mark_dead(&self.sb, &self.kernel_id).await;
                    }
                }
                code_event(event)
            }
            None => CodeEvent::Failed {
                code: ErrorCode::SandboxNotRunning,
                message: "the sandbox's agent went away while the cell ran".to_owned(),
            },
        };
        if matches!(event, CodeEvent::End { .. } | CodeEvent::Failed { .. }) {
            self.ended = true;
        }
        Some(event)
    }

    /// Waits for the end and answers the cell as one document, bounded per cell and by the
    /// server's collected-output budget (what does not fit is counted in `dropped_bytes`).
    pub async fn collect(mut self) -> CollectedCell {
        let (budget, tenant) = &self.budget;
        let held = budget.claim(tenant);
        let mut collector = Collector::new(self.context.clone(), COLLECTED_CELL_LIMIT, held);
        while let Some(event) = self.recv().await {
            if collector.add(event) {
                break;
            }
        }
        let (doc, held) = collector.finish();
        CollectedCell { doc, held }
    }
}

impl Drop for CodeStream {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        // The caller went away mid-cell: interrupt it (best effort) so the context is free again.
        let (sb, kernel_id) = (self.sb.clone(), self.kernel_id.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = sb.client.kernel_interrupt(&kernel_id).await;
            });
        }
    }
}

/// Marks the context of `kernel_id` dead (its kernel died under a cell).
async fn mark_dead(sb: &LiveSandbox, kernel_id: &str) {
    if let Some(c) = sb
        .contexts
        .lock()
        .await
        .iter_mut()
        .find(|c| c.kernel_id == kernel_id)
    {
        c.dead = true;
    }
}

impl SandboxService {
    /// Runs one cell; see [`CodeStream`].
    pub async fn run_code(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: RunCodeRequest,
    ) -> Result<CodeStream, ServiceError> {
        if req.language.is_some() && req.context.is_some() {
            return Err(ServiceError::invalid(
                "context",
                "give either `language` (its default context) or `context`, not both",
            ));
        }
        if req.timeout_ms.is_some_and(|t| t == 0 || t > MAX_CELL_TIMEOUT_MS) {
            return Err(ServiceError::invalid(
                "timeout_ms",
                format!("between 1 and {MAX_CELL_TIMEOUT_MS}"),
            ));
        }
        crate::plan::create::check_env("env", &req.env)?;
        for name in req.env.keys() {
            check_cell_env_name(name).map_err(|e| ServiceError::invalid(format!("env.{name}"), e))?;
        }
        let sb = self.owned_live(p, id).await?;
        let context = self.cell_context(&sb, p, id, &req).await?;
        if context.dead {
            return Err(ServiceError::new(
                ErrorCode::KernelUnavailable,
                format!("the kernel of context {} died: restart the context", context.id),
            ));
        }
        let detail = audit::CodeCell {
            context: context.id.clone(),
            language: context.language.to_owned(),
            code_bytes: req.code.len() as u64,
            code_sha256: hex::encode(sha2::Sha256::digest(req.code.as_bytes())),
            timeout_ms: req.timeout_ms,
            env: req.env.keys().cloned().collect(),
        };
        self.audit(AuditEntry::ok(p, AuditAction::CodeRun, Some(id)).detail(detail))
            .await?;
        let around = match kernel_for(Some(context.language)) {
            Some(kernel) if !req.env.is_empty() => Some(cell_env(kernel.env_code, &req.env)),
            _ => None,
        };
        let events = match sb
            .client
            .kernel_execute(&context.kernel_id, &req.code, req.timeout_ms, false, around)
            .await
        {
            Ok(events) => events,
            Err(e) => {
                // The agent found the kernel gone (it died between cells): the context is dead.
                if matches!(&e, paddock_runtime::agent_client::AgentClientError::Agent(err)
                    if err.code == paddock_protocol::ErrorCode::ProcessExited)
                {
                    mark_dead(&sb, &context.kernel_id).await;
                }
                return Err(kernel_error(context.language, e));
            }
        };
        Ok(CodeStream {
            started: Some(CodeEvent::Started {
                context: context.id.clone(),
                language: context.language.to_owned(),
            }),
            events,
            sb,
            context: context.id,
            kernel_id: context.kernel_id,
            ended: false,
            budget: (self.inner.collect_budget.clone(), p.tenant.clone()),
        })
    }

    /// The context a cell runs in: the one named, or its language's default one (started now if
    /// it does not exist yet).
    async fn cell_context(
        &self,
        sb: &Arc<LiveSandbox>,
        p: &Principal,
        id: &SandboxId,
        req: &RunCodeRequest,
    ) -> Result<CodeContext, ServiceError> {
        let mut contexts = sb.contexts.lock().await;
        let kernel = match &req.context {
            Some(name) => match position(&contexts, name) {
                Ok(at) => return Ok(contexts[at].clone()),
                // A language's default context is made at its first use, named by its id too
                // (E2B lists `python` and `javascript` before anything ran in them).
                Err(e) => KERNELS.iter().find(|k| k.language == name.as_str()).ok_or(e)?,
            },
            None => language(req.language.as_deref())?,
        };
        if let Some(existing) = contexts.iter().find(|c| c.id == kernel.language) {
            return Ok(existing.clone());
        }
        let context = self.start_default_context(sb, &mut contexts, kernel).await?;
        drop(contexts);
        self.audit_context(p, id, "create", &context.info()).await?;
        Ok(context)
    }
}
