//! Code contexts: kernels in a sandbox that keep state between cells (`POST .../contexts`, list,
//! restart, remove), and a language's default context, created at its first cell. The agent
//! starts the kernels and speaks Jupyter to them; this module keeps the sandbox's table of
//! contexts, picks each language's kernel (`plan::code`) and writes the audit rows.
//!
//! What it does not do: run cells (`run.rs`), or keep contexts over a stop, resume or rollback
//! (kernels are processes; their contexts end with them).

mod events;
mod run;

use paddock_types::api::{ContextInfo, ContextList, CreateContextRequest, ErrorCode};
use paddock_types::SandboxId;

use crate::core::contexts::CodeContext;
use crate::core::principal::Principal;
use crate::plan::code::{kernel_for, known_languages, KernelSpec};
use crate::{SandboxService, ServiceError};

pub use run::{CodeStream, CollectedCell};

impl SandboxService {
    /// Starts a context: a new kernel of `req.language` (default python).
    pub async fn create_context(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: CreateContextRequest,
    ) -> Result<ContextInfo, ServiceError> {
        crate::plan::create::check_env("env", &req.env)?;
        let kernel = language(req.language.as_deref())?;
        crate::plan::create::check_cwd(req.cwd.as_deref())?;
        let sb = self.owned_live(p, id).await?;
        let mut contexts = sb.contexts.lock().await;
        let context_id = format!("ctx-{}", hex::encode(rand::random::<[u8; 6]>()));
        let context = self
            .start_kernel(&sb, &contexts, context_id, kernel, req.cwd, req.env)
            .await?;
        let info = context.info();
        contexts.push(context);
        drop(contexts);
        self.audit_context(p, id, "create", &info).await?;
        Ok(info)
    }

    /// The sandbox's contexts, oldest first.
    pub async fn list_contexts(&self, p: &Principal, id: &SandboxId) -> Result<ContextList, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let contexts = sb.contexts.lock().await;
        Ok(ContextList {
            contexts: contexts.iter().map(CodeContext::info).collect(),
        })
    }

    /// Stops a context's kernel and starts a new one in its place (its state is gone; the id,
    /// language, working directory and environment stay).
    pub async fn restart_context(
        &self,
        p: &Principal,
        id: &SandboxId,
        context: &str,
    ) -> Result<ContextInfo, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let mut contexts = sb.contexts.lock().await;
        let at = position(&contexts, context)?;
        let old = contexts.remove(at);
        // A dead kernel's stop fails: there is nothing left to stop.
        let _ = sb.client.kernel_shutdown(&old.kernel_id).await;
        let kernel = language(Some(old.language))?;
        let restarted = self
            .start_kernel(
                &sb,
                &contexts,
                old.id.clone(),
                kernel,
                old.cwd.clone(),
                old.env.clone(),
            )
            .await;
        let new = match restarted {
            Ok(new) => new,
            Err(e) => {
                // Keep the context, dead, so it can be restarted again or removed.
                contexts.insert(at, CodeContext { dead: true, ..old });
                return Err(e);
            }
        };
        let info = new.info();
        contexts.insert(at, new);
        drop(contexts);
        self.audit_context(p, id, "restart", &info).await?;
        Ok(info)
    }

    /// Stops a context's kernel and forgets the context.
    pub async fn delete_context(
        &self,
        p: &Principal,
        id: &SandboxId,
        context: &str,
    ) -> Result<(), ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let mut contexts = sb.contexts.lock().await;
        let at = position(&contexts, context)?;
        let old = contexts.remove(at);
        drop(contexts);
        let _ = sb.client.kernel_shutdown(&old.kernel_id).await;
        self.audit_context(p, id, "delete", &old.info()).await
    }
}

/// The kernel of a request's language.
fn language(name: Option<&str>) -> Result<&'static KernelSpec, ServiceError> {
    kernel_for(name).ok_or_else(|| {
        ServiceError::invalid(
            "language",
            format!(
                "no kernel runs {:?} here (known: {})",
                name.unwrap_or_default(),
                known_languages()
            ),
        )
    })
}

fn position(contexts: &[CodeContext], id: &str) -> Result<usize, ServiceError> {
    contexts
        .iter()
        .position(|c| c.id == id)
        .ok_or_else(|| ServiceError::new(ErrorCode::ContextNotFound, format!("code context {id} not found")))
}
