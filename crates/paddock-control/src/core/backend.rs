//! The one place the control plane runs backend work.
//!
//! Every backend method is synchronous and may block (processes, btrfs ioctls, file walks, waiting
//! for killed processes), so it runs on tokio's blocking pool and the async workers stay free. Work on
//! a live sandbox's handle holds the handle's lock until the backend returns, also when the request
//! that asked for it is dropped meanwhile: a rollback or a stop never starts while a snapshot of the
//! same sandbox is still being taken.
//!
//! This module does not interpret backend errors beyond one rule: [`SandboxService::on_live_handle`]
//! maps a backend failure to an internal error about the work it names (`ServiceError::from_runtime`);
//! other callers map them themselves.

use std::sync::Arc;

use paddock_runtime::{Backend, RuntimeError, SandboxHandle};

use crate::core::live::LiveSandbox;
use crate::core::service::SandboxService;
use crate::ServiceError;

/// A live sandbox's handle, locked: no other work runs on the sandbox until it is dropped.
pub(crate) type HandleGuard = tokio::sync::OwnedMutexGuard<Option<SandboxHandle>>;

impl SandboxService {
    /// Runs `f` on the backend on a blocking thread. The error is only for a panic of `f` (`what`
    /// names the operation); the backend's own result is `f`'s to return.
    pub(crate) async fn on_backend<T, F>(&self, what: &'static str, f: F) -> Result<T, ServiceError>
    where
        F: FnOnce(&dyn Backend) -> T + Send + 'static,
        T: Send + 'static,
    {
        let backend = self.inner.backend.clone();
        tokio::task::spawn_blocking(move || f(backend.get()))
            .await
            .map_err(|e| ServiceError::internal(what, &e))
    }

    /// Runs `f` with `sb`'s backend handle on a blocking thread (see [`Self::on_backend`]), holding
    /// the handle's lock until `f` returns. `Ok(None)` when the sandbox is ending (its handle was
    /// taken).
    pub(crate) async fn on_handle<T, F>(
        &self,
        sb: &LiveSandbox,
        what: &'static str,
        f: F,
    ) -> Result<Option<T>, ServiceError>
    where
        F: FnOnce(&dyn Backend, &SandboxHandle) -> T + Send + 'static,
        T: Send + 'static,
    {
        let guard = Arc::clone(&sb.handle).lock_owned().await;
        let (_guard, done) = self.on_held_handle(guard, what, f).await?;
        Ok(done)
    }

    /// [`Self::on_handle`] with the handle's lock already taken (`guard`), handed back with `f`'s
    /// result: for work that keeps the sandbox to itself across several backend calls (a fork holds
    /// its source frozen while its copies boot). `None` when the handle was taken before the lock.
    pub(crate) async fn on_held_handle<T, F>(
        &self,
        guard: HandleGuard,
        what: &'static str,
        f: F,
    ) -> Result<(HandleGuard, Option<T>), ServiceError>
    where
        F: FnOnce(&dyn Backend, &SandboxHandle) -> T + Send + 'static,
        T: Send + 'static,
    {
        self.on_backend(what, move |backend| {
            let done = guard.as_ref().map(|handle| f(backend, handle));
            (guard, done)
        })
        .await
    }

    /// [`Self::on_handle`] for work that needs the sandbox's handle and fails like every other
    /// request on it: a taken handle (the sandbox is being destroyed, stopped or rolled back) answers
    /// `sandbox_ending`, a backend failure is mapped as a failure to do `what`.
    pub(crate) async fn on_live_handle<T, F>(
        &self,
        sb: &LiveSandbox,
        what: &'static str,
        f: F,
    ) -> Result<T, ServiceError>
    where
        F: FnOnce(&dyn Backend, &SandboxHandle) -> Result<T, RuntimeError> + Send + 'static,
        T: Send + 'static,
    {
        self.on_handle(sb, what, f)
            .await?
            .ok_or_else(|| ServiceError::sandbox_ending(&sb.id))?
            .map_err(|e| ServiceError::from_runtime(what, e))
    }
}
