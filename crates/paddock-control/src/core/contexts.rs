//! A live sandbox's code contexts: each is a kernel the agent started, known by its id. Kept with
//! the live sandbox (kernels are processes: they end with the sandbox, its stop, or a rollback that
//! restarts its agent, and so do their contexts).
//!
//! What it does not do: start or talk to kernels (`ops::code` does, through the agent).

use std::collections::BTreeMap;

use paddock_types::api::{ContextInfo, ContextState};

/// Contexts one sandbox may hold at once (the agent bounds its kernels the same way).
pub(crate) const MAX_CONTEXTS: usize = 16;

/// One context.
#[derive(Debug, Clone)]
pub(crate) struct CodeContext {
    pub(crate) id: String,
    pub(crate) language: &'static str,
    pub(crate) cwd: Option<String>,
    pub(crate) env: BTreeMap<String, String>,
    /// The kernel's id at the agent (a restart starts a new kernel under a new id).
    pub(crate) kernel_id: String,
    pub(crate) pid: u32,
    pub(crate) language_version: String,
    pub(crate) dead: bool,
}

impl CodeContext {
    pub(crate) fn info(&self) -> ContextInfo {
        ContextInfo {
            id: self.id.clone(),
            language: self.language.to_owned(),
            cwd: self.cwd.clone(),
            language_version: self.language_version.clone(),
            state: if self.dead {
                ContextState::Dead
            } else {
                ContextState::Ready
            },
            pid: self.pid,
        }
    }
}

/// The contexts of a sandbox, oldest first. An async lock: starting a kernel takes a while, and
/// two first cells of one language must not start two default contexts.
pub(crate) type Contexts = tokio::sync::Mutex<Vec<CodeContext>>;
