//! The agent double: the real protocol (`paddock-protocol`) served on a unix socket per sandbox, over
//! the sandbox's in-memory files, with processes run by a small deterministic command interpreter
//! (`shell/`) instead of real programs.
//!
//! Every task runs on the fake's own runtime thread (`runtime.rs`). Requests of one connection are
//! answered in arrival order; process output is kept per stream in a ring of the last 1 MiB with
//! per-connection cursors that back-pressure the process, exactly as the real agent's
//! (`paddock-agent/src/process/output.rs`); exited processes are remembered (256 of them, 16 MiB of
//! output) for listing and re-attaching; watches see the changes made through this agent's own file
//! operations and commands. While the sandbox is paused the double is frozen as a frozen agent is:
//! it answers nothing, and its processes print nothing and do not exit, until it is resumed (their
//! timers run on, as a frozen process's `sleep` does).
//!
//! What it does not do: run programs (only the interpreter's built-in commands exist), emulate a
//! terminal (a PTY process gets one combined output stream and its size is only recorded; there is
//! no line discipline or echo), account CPU time or memory (reported as 0), check permissions or
//! credentials (every process may touch every file; `user` only picks the owner of new files and the
//! home directory), or see changes made behind its back (a rollback or another sandbox writing to a
//! shared volume produce no watch events).

mod connection;
mod files;
mod outbound;
mod output;
mod process;
mod shell;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use paddock_protocol::FsEvent;
use tokio::runtime::Handle;
use tokio::sync::watch as flag;

use super::fs::{Fs, FsError, Namespace};
use super::runtime::TaskCount;
use super::state::State;
use crate::RuntimeError;

/// How long stopping an agent waits for its connections and processes to end.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Locks a mutex of the double; a panic while holding one leaves plain data that is still usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What an agent double serves.
#[derive(Debug)]
pub(crate) struct AgentSetup {
    pub(crate) state: Weak<Mutex<State>>,
    pub(crate) ns: Namespace,
    /// The default user of processes and new files.
    pub(crate) user: String,
}

/// One sandbox's agent double, shared by its tasks.
#[derive(Debug)]
pub(crate) struct Agent {
    state: Weak<Mutex<State>>,
    ns: Namespace,
    pub(crate) default_user: String,
    pub(crate) processes: Mutex<process::ProcessTable>,
    pub(crate) watches: watch::Watches,
    next_conn: AtomicU64,
    next_pid: AtomicU32,
    paused: flag::Sender<bool>,
    shutdown: flag::Sender<bool>,
    tasks: Arc<TaskCount>,
    runtime: Handle,
}

/// The backend's hold on a running agent double.
#[derive(Debug)]
pub(crate) struct AgentHandle {
    agent: Arc<Agent>,
    socket: PathBuf,
}

impl AgentHandle {
    /// Binds `socket` and starts serving it on `runtime`; connections are accepted once this returns.
    pub(crate) fn start(runtime: &Handle, socket: PathBuf, setup: AgentSetup) -> Result<Self, RuntimeError> {
        let state_err = |what: &'static str| {
            let path = socket.clone();
            move |source| RuntimeError::State { what, path, source }
        };
        let listener = std::os::unix::net::UnixListener::bind(&socket).map_err(state_err("bind"))?;
        listener.set_nonblocking(true).map_err(state_err("configure"))?;
        let listener = {
            let _entered = runtime.enter();
            tokio::net::UnixListener::from_std(listener).map_err(state_err("register"))?
        };
        let agent = Arc::new(Agent {
            state: setup.state,
            ns: setup.ns,
            default_user: setup.user,
            processes: Mutex::new(process::ProcessTable::default()),
            watches: watch::Watches::default(),
            next_conn: AtomicU64::new(1),
            next_pid: AtomicU32::new(2),
            paused: flag::Sender::new(false),
            shutdown: flag::Sender::new(false),
            tasks: Arc::new(TaskCount::default()),
            runtime: runtime.clone(),
        });
        let accepting = agent.clone();
        agent.spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // Out of descriptors, say: try again shortly rather than spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let served = accepting.clone();
                accepting.spawn(connection::serve(served, stream));
            }
        });
        Ok(Self { agent, socket })
    }

    /// Where it listens.
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// Freezes (or thaws) it.
    pub(crate) fn set_paused(&self, paused: bool) {
        self.agent.paused.send_replace(paused);
    }

    /// Processes running now.
    pub(crate) fn running_processes(&self) -> u64 {
        lock(&self.agent.processes).running()
    }

    /// Stops it: its processes die, its connections close, its socket goes. Blocks until then.
    pub(crate) fn stop(self) {
        self.agent.shutdown.send_replace(true);
        if !self.agent.tasks.wait_idle(STOP_TIMEOUT) {
            tracing::warn!(socket = %self.socket.display(), "the agent double's tasks did not end in time");
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

impl Agent {
    /// Spawns a task that ends when the agent stops.
    pub(crate) fn spawn<F>(&self, task: F) -> tokio::task::AbortHandle
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        let guard = self.tasks.guard();
        let mut shutdown = self.shutdown.subscribe();
        self.runtime
            .spawn(async move {
                let _guard = guard;
                tokio::select! {
                    () = task => {}
                    _ = shutdown.wait_for(|stopped| *stopped) => {}
                }
            })
            .abort_handle()
    }

    /// Returns once the agent is not paused.
    pub(crate) async fn until_running(&self) {
        let mut paused = self.paused.subscribe();
        let _ = paused.wait_for(|paused| !*paused).await;
    }

    pub(crate) fn next_connection(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn next_pid(&self) -> u32 {
        self.next_pid.fetch_add(1, Ordering::Relaxed)
    }

    /// The sandbox's id (its hostname).
    pub(crate) fn hostname(&self) -> &str {
        self.ns.sandbox.as_str()
    }

    /// Runs a read-only file operation on the sandbox's view.
    pub(crate) fn read_fs<T>(&self, f: impl FnOnce(&Fs<'_>) -> Result<T, FsError>) -> Result<T, FsError> {
        let state = self.state.upgrade().ok_or(FsError(libc::EIO))?;
        let mut state = lock(&state);
        f(&Fs::new(&mut state, &self.ns))
    }

    /// Runs a file operation that changes the view and reports its events to the watches.
    pub(crate) fn change_fs(
        &self,
        f: impl FnOnce(&mut Fs<'_>) -> Result<Vec<FsEvent>, FsError>,
    ) -> Result<(), FsError> {
        let events = {
            let state = self.state.upgrade().ok_or(FsError(libc::EIO))?;
            let mut state = lock(&state);
            f(&mut Fs::new(&mut state, &self.ns))?
        };
        self.watches.notify(&events);
        Ok(())
    }

    /// Forgets connection `conn`: its output subscriptions and its watches.
    pub(crate) fn disconnect(&self, conn: u64) {
        let all = lock(&self.processes).all();
        for p in all {
            p.unsubscribe(conn);
        }
        self.watches.disconnect(conn);
    }
}
