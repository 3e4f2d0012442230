//! The agent's life: process-wide setup (non-dumpable, subreaper), the single-threaded runtime, the
//! accept loop, the reaper, and shutdown on `SIGTERM`/`SIGINT`.
//!
//! As PID 1 of a PID namespace the agent has no default signal actions: `SIGTERM` from inside the
//! sandbox would otherwise do nothing, so it is handled explicitly by killing every process and
//! exiting (which ends the namespace).

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use paddock_sys::fs_in_root::Root;
use paddock_sys::reap::{adopt_inherited_fd, become_child_subreaper, signal_whole_namespace};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::agent::Agent;
use crate::cli::{AgentConfig, Listen};
use crate::connection::serve_connection;
use crate::process::reap::reap_children;

/// Pause after a failed `accept` (for example `EMFILE`) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentRunError {
    /// `PR_SET_DUMPABLE` failed.
    #[error("failed to make the agent non-dumpable")]
    Dumpable(#[source] io::Error),
    /// `PR_SET_CHILD_SUBREAPER` failed.
    #[error("failed to become a child subreaper")]
    Subreaper(#[source] io::Error),
    /// The root directory could not be opened.
    #[error("failed to open the root directory {path}")]
    OpenRoot {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The inherited listening socket is unusable.
    #[error("failed to use inherited listening socket fd {fd}")]
    ListenFd {
        /// The descriptor number.
        fd: i32,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Binding the socket path failed.
    #[error("failed to listen on {path}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The tokio runtime could not be built.
    #[error("failed to start the async runtime")]
    Runtime(#[source] io::Error),
    /// A signal handler could not be installed.
    #[error("failed to install the {signal} handler")]
    Signal {
        /// Which signal.
        signal: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// Runs the agent until `SIGTERM` or `SIGINT`.
pub fn run_agent(config: AgentConfig) -> Result<(), AgentRunError> {
    let pid1 = std::process::id() == 1;
    // Workloads run as other users (or root without capabilities); none may ptrace the agent or
    // read its /proc files.
    paddock_sys::caps::set_dumpable(false).map_err(AgentRunError::Dumpable)?;
    if !pid1 {
        become_child_subreaper().map_err(AgentRunError::Subreaper)?;
    }
    let open_error = |source| AgentRunError::OpenRoot {
        path: config.root.clone(),
        source,
    };
    let root = Root::open(&config.root).map_err(open_error)?;
    let root_path = std::fs::canonicalize(&config.root).map_err(open_error)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(AgentRunError::Runtime)?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, serve(config, root, root_path, pid1))
}

async fn serve(config: AgentConfig, root: Root, root_path: PathBuf, pid1: bool) -> Result<(), AgentRunError> {
    let handler = |signal: &'static str| move |source| AgentRunError::Signal { signal, source };
    // SIGCHLD first: no child may exit before the reaper can hear about it.
    let sigchld = signal(SignalKind::child()).map_err(handler("SIGCHLD"))?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(handler("SIGTERM"))?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(handler("SIGINT"))?;
    let listener = listen(&config.listen)?;
    let agent = Rc::new(Agent::new(root, root_path, config.default_user));
    tokio::task::spawn_local(reap_children(agent.clone(), sigchld));
    tracing::info!(pid1, root = %config.root.display(), "agent ready");
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::task::spawn_local(serve_connection(agent.clone(), stream));
                }
                Err(err) => {
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
        }
    }
    tracing::info!("shutting down: killing every process");
    agent.kill_all_processes();
    if pid1 {
        match signal_whole_namespace(libc::SIGKILL) {
            // ESRCH: no other process is left.
            Err(err) if err.raw_os_error() != Some(libc::ESRCH) => {
                tracing::warn!(error = %err, "killing the namespace failed");
            }
            _ => {}
        }
    }
    Ok(())
}

fn listen(listen: &Listen) -> Result<UnixListener, AgentRunError> {
    match listen {
        Listen::Fd(fd) => {
            let error = |source| AgentRunError::ListenFd { fd: *fd, source };
            let owned = adopt_inherited_fd(*fd).map_err(error)?;
            let listener = std::os::unix::net::UnixListener::from(owned);
            listener.set_nonblocking(true).map_err(error)?;
            UnixListener::from_std(listener).map_err(error)
        }
        Listen::Path(path) => {
            // A socket left behind by an earlier run; anything else at the path is not ours to remove.
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(path);
            }
            UnixListener::bind(path).map_err(|source| AgentRunError::Bind {
                path: path.clone(),
                source,
            })
        }
    }
}
