//! Starting a code context's kernel in a live sandbox (through its agent), for a context a
//! request makes and for the contexts a warm pool starts ahead.
//!
//! Also the `code.context` audit row of a context made, restarted, removed or handed over with a
//! claimed warm sandbox, written by whichever caller changed the table.
//!
//! What it does not do: keep the context table (callers hold its lock; only a language's default
//! context is added here).

use std::collections::BTreeMap;
use std::sync::Arc;

use paddock_protocol::kernel::KernelStart;
use paddock_runtime::agent_client::AgentClientError;
use paddock_types::api::ErrorCode;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::contexts::{CodeContext, MAX_CONTEXTS};
use crate::core::live::LiveSandbox;
use crate::core::principal::Principal;
use crate::plan::code::{kernel_env, KernelSpec};
use crate::{SandboxService, ServiceError};

/// How long a kernel may take to answer after it started (a cold Python with its imports).
const KERNEL_READY_TIMEOUT_MS: u64 = 60_000;
/// How long a kernel's setup code may run.
const SETUP_TIMEOUT_MS: u64 = 30_000;

/// Runs a language's setup code silently in a new kernel and waits for its end. A setup that fails
/// is logged: the context works without what it adds (charts), so it is not refused for it.
async fn run_setup(sb: &Arc<LiveSandbox>, kernel_id: &str, setup: &str) {
    let mut events = match sb
        .client
        .kernel_execute(kernel_id, setup, Some(SETUP_TIMEOUT_MS), true, None)
        .await
    {
        Ok(events) => events,
        Err(e) => {
            tracing::warn!(sandbox_id = %sb.id, kernel_id, error = %e, "a kernel's setup did not start");
            return;
        }
    };
    while let Some(event) = events.next().await {
        match event {
            paddock_protocol::kernel::CellEvent::Error { name, value, .. } => {
                tracing::warn!(sandbox_id = %sb.id, kernel_id, %name, %value, "a kernel's setup raised");
            }
            paddock_protocol::kernel::CellEvent::End { status, .. } => {
                if status != paddock_protocol::kernel::CellStatus::Ok {
                    tracing::warn!(sandbox_id = %sb.id, kernel_id, ?status, "a kernel's setup did not finish");
                }
                return;
            }
            _ => {}
        }
    }
}

impl SandboxService {
    /// Starts `kernel` for context `context_id` (not yet in `contexts`).
    pub(crate) async fn start_kernel(
        &self,
        sb: &Arc<LiveSandbox>,
        contexts: &[CodeContext],
        context_id: String,
        kernel: &'static KernelSpec,
        cwd: Option<String>,
        env: BTreeMap<String, String>,
    ) -> Result<CodeContext, ServiceError> {
        if contexts.len() >= MAX_CONTEXTS {
            return Err(ServiceError::new(
                ErrorCode::QuotaExceeded,
                format!("a sandbox holds at most {MAX_CONTEXTS} code contexts: remove one first"),
            ));
        }
        let spec = sb.spec();
        let kernel_id = format!("{context_id}-{}", hex::encode(rand::random::<[u8; 4]>()));
        let start = KernelStart {
            kernel_id: kernel_id.clone(),
            argv: kernel.argv.iter().map(|a| (*a).to_owned()).collect(),
            cwd: cwd.clone().or(spec.workdir.clone()),
            env: kernel_env(kernel, &self.process_env(sb), &env),
            user: Some(spec.user.clone()),
            ready_timeout_ms: KERNEL_READY_TIMEOUT_MS,
            interrupt: kernel.interrupt,
            barrier: kernel.barrier.map(str::to_owned),
        };
        let info = sb
            .client
            .kernel_start(start)
            .await
            .map_err(|e| kernel_error(kernel.language, e))?;
        if let Some(setup) = kernel.setup {
            run_setup(sb, &kernel_id, setup).await;
        }
        Ok(CodeContext {
            id: context_id,
            language: kernel.language,
            cwd,
            env,
            kernel_id,
            pid: info.pid,
            language_version: info.language_version,
            dead: false,
        })
    }
}

/// A kernel that would not start or run: the agent's refusals are the sandbox's (its template lacks
/// the kernel, the kernel died); a broken connection is the sandbox's end.
pub(crate) fn kernel_error(language: &str, e: AgentClientError) -> ServiceError {
    match &e {
        AgentClientError::Agent(err) => match err.code {
            paddock_protocol::ErrorCode::LimitExceeded => {
                ServiceError::new(ErrorCode::QuotaExceeded, err.message.clone())
            }
            _ => ServiceError::new(
                ErrorCode::KernelUnavailable,
                format!("the {language} kernel is not available: {}", err.message),
            ),
        },
        _ => crate::core::error::process_error("start a kernel", 0, e),
    }
}

impl SandboxService {
    /// Starts `kernel`'s default context (its id the language's name, the sandbox's own settings)
    /// and adds it to `contexts`, whose lock the caller holds.
    pub(crate) async fn start_default_context(
        &self,
        sb: &Arc<LiveSandbox>,
        contexts: &mut Vec<CodeContext>,
        kernel: &'static KernelSpec,
    ) -> Result<CodeContext, ServiceError> {
        let context = self
            .start_kernel(
                sb,
                contexts,
                kernel.language.to_owned(),
                kernel,
                None,
                BTreeMap::new(),
            )
            .await?;
        contexts.push(context.clone());
        Ok(context)
    }

    /// The `code.context` row of `op` (`create`, `restart`, `delete`, `warm`) on a context of
    /// sandbox `id`.
    pub(crate) async fn audit_context(
        &self,
        p: &Principal,
        id: &str,
        op: &'static str,
        info: &paddock_types::api::ContextInfo,
    ) -> Result<(), ServiceError> {
        let detail = audit::CodeContextChange {
            op,
            context: info.id.clone(),
            language: info.language.clone(),
            pid: Some(info.pid),
        };
        self.audit(AuditEntry::ok(p, AuditAction::CodeContext, Some(id)).detail(detail))
            .await
    }
}
