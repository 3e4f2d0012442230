//! The fake's own tokio runtime: one dedicated thread with a current-thread runtime that every agent
//! double's tasks run on, so the backend works the same from a blocking thread, a test's runtime of
//! either flavour, or no runtime at all. Dropping it stops the thread and drops every task.
//!
//! Also the count of an agent's live tasks, so stopping an agent can wait until its connections are
//! really closed (as the real agent's are once its process is killed).

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;
use tokio::sync::oneshot;

/// The agents' runtime thread.
#[derive(Debug)]
pub(crate) struct AgentRuntime {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl AgentRuntime {
    /// Starts the thread.
    pub(crate) fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("paddock-fake-agents".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
                // Dropping the runtime here (outside `block_on`) drops every task it still holds.
                drop(runtime);
            })?;
        Ok(Self {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }
}

impl Drop for AgentRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// How many tasks of one agent are alive.
#[derive(Debug, Default)]
pub(crate) struct TaskCount {
    live: Mutex<usize>,
    idle: Condvar,
}

/// Held by a task while it lives.
#[derive(Debug)]
pub(crate) struct TaskGuard(Arc<TaskCount>);

impl TaskCount {
    pub(crate) fn guard(self: &Arc<Self>) -> TaskGuard {
        *self.live.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        TaskGuard(self.clone())
    }

    /// Waits (blocking) until no task is alive, at most `timeout`; whether they all ended.
    pub(crate) fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        while *live > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            live = self
                .idle
                .wait_timeout(live, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let mut live = self.0.live.lock().unwrap_or_else(PoisonError::into_inner);
        *live = live.saturating_sub(1);
        if *live == 0 {
            self.0.idle.notify_all();
        }
    }
}
