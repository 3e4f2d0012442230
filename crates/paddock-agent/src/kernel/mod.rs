//! Code kernels: the agent is the Jupyter client of the kernels it starts inside the sandbox. This
//! module holds the registry of kernels and answers the four kernel requests; `start.rs` starts
//! one, `cell.rs` runs its cells one at a time, `relay.rs` turns a cell's messages into bounded
//! events, `connection.rs` speaks ZeroMQ to it.
//!
//! A kernel is an ordinary detached process of the process table (tag `kernel`, the same user switch
//! and privilege drop as any spawn), so it is listed, attachable (its stdout and stderr stay in the
//! process's output rings) and killed with the agent. Its messages are the sandbox's data: hostile.
//!
//! What it does not do: restart a dead kernel (the host shuts it down and starts it again), answer
//! `input_request` (cells run with `allow_stdin` false), relay comm or widget messages, or keep a
//! cell's events for a connection that closed (the cell runs on; its events are dropped).

mod cell;
mod connection;
mod relay;
mod start;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use jupyter_protocol::ConnectionInfo;
use paddock_protocol::kernel::{CellAround, CellStatus, InterruptMode, KernelStart};
use paddock_protocol::{AgentError, ErrorCode, Reply};
use paddock_sys::reap::send_signal;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;

use crate::agent::Agent;
use crate::error_code::agent_error;
use crate::outbound::{Answer, ConnectionClosed, Outbound};
use crate::process::kill_tree::kill_tree;
use crate::process::table::Process;

use cell::CellJob;

/// Kernels one agent runs at once (starting, running or dead until shut down).
pub(crate) const MAX_KERNELS: usize = 16;
/// Cells waiting behind the running one, per kernel.
pub(crate) const MAX_QUEUED_CELLS: usize = 64;
/// Longest kernel id.
const MAX_KERNEL_ID_LEN: usize = 256;
/// How long shutdown waits for the kernel to exit after `shutdown_request` before killing it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long sending one `interrupt_request` may take.
const INTERRUPT_SEND_LIMIT: Duration = Duration::from_millis(250);

/// The agent's kernels by id.
#[derive(Debug, Default)]
pub(crate) struct Kernels {
    by_id: RefCell<HashMap<String, Slot>>,
    next_cell: Cell<u64>,
}

#[derive(Debug)]
enum Slot {
    /// Reserved while `KernelStart` runs.
    Starting,
    Ready(Rc<Kernel>),
}

/// One started kernel.
#[derive(Debug)]
pub(crate) struct Kernel {
    id: String,
    process: Rc<Process>,
    info: ConnectionInfo,
    session: String,
    /// The connection file, as a path inside the root.
    connection_file: PathBuf,
    /// The queue of its cells; taken at shutdown, so the runner ends once it drained the queue.
    cells: RefCell<Option<mpsc::Sender<CellJob>>>,
    /// Why it is dead (exited, stopped answering, shut down), once it is.
    dead: RefCell<Option<String>>,
    /// Signalled when it is marked dead: the running cell ends `kernel_died`.
    died: Notify,
    /// The cell running now.
    running_cell: Cell<Option<u64>>,
    /// The cell an interrupt was requested for.
    interrupted_cell: Cell<Option<u64>>,
    /// Signalled when an interrupt is requested: the running cell's loop then sends `SIGINT`
    /// again until the kernel answers (a `SIGINT` that lands between ipykernel publishing
    /// `execute_input` and arming its handler is ignored, and would be lost).
    interrupt_requested: Notify,
    /// How it is interrupted (its kernelspec's `interrupt_mode`).
    interrupt: InterruptMode,
    /// Silent code run after each cell to collect output published after `idle`.
    barrier: Option<String>,
    heartbeat: RefCell<Option<JoinHandle<()>>>,
}

impl Kernel {
    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Interrupts its running cell the kernel's way: `SIGINT`, or an `interrupt_request` on a
    /// fresh control connection (sent within [`INTERRUPT_SEND_LIMIT`]).
    pub(crate) async fn send_interrupt(&self) -> Result<(), String> {
        match self.interrupt {
            InterruptMode::Signal => send_signal(self.pid(), libc::SIGINT)
                .map_err(|err| format!("SIGINT to pid {}: {err}", self.pid())),
            InterruptMode::Message => {
                connection::request_interrupt(&self.info, &self.session, INTERRUPT_SEND_LIMIT)
                    .await
                    .map_err(|err| err.to_string())
            }
        }
    }

    /// Why the kernel is dead, if it is.
    pub(crate) fn dead_reason(&self) -> Option<String> {
        if let Some(reason) = self.dead.borrow().clone() {
            return Some(reason);
        }
        self.process
            .exit_status()
            .map(|exit| format!("its process exited ({})", describe_exit(&exit)))
    }

    /// Marks the kernel dead (the first reason stays) and wakes its running cell.
    pub(crate) fn mark_dead(&self, reason: &str) {
        {
            let mut dead = self.dead.borrow_mut();
            if dead.is_none() {
                tracing::info!(kernel_id = %self.id, reason, "kernel is dead");
                *dead = Some(reason.to_owned());
            }
        }
        self.died.notify_waiters();
    }
}

fn describe_exit(exit: &paddock_protocol::ExitStatus) -> String {
    match (exit.code, exit.signal) {
        (_, Some(signal)) => format!("signal {signal}"),
        (Some(code), None) => format!("code {code}"),
        (None, None) => "unknown status".to_owned(),
    }
}

impl Kernels {
    fn get(&self, kernel_id: &str) -> Result<Rc<Kernel>, AgentError> {
        match self.by_id.borrow().get(kernel_id) {
            Some(Slot::Ready(kernel)) => Ok(kernel.clone()),
            Some(Slot::Starting) => Err(agent_error(
                ErrorCode::BadRequest,
                format!("kernel {kernel_id:?} is still starting"),
            )),
            None => Err(agent_error(
                ErrorCode::NotFound,
                format!("no kernel {kernel_id:?}"),
            )),
        }
    }

    /// Reserves `kernel_id` for a start.
    fn reserve(&self, kernel_id: &str) -> Result<(), AgentError> {
        let mut by_id = self.by_id.borrow_mut();
        if by_id.contains_key(kernel_id) {
            return Err(agent_error(
                ErrorCode::BadRequest,
                format!("a kernel {kernel_id:?} exists already (shut it down first)"),
            ));
        }
        if by_id.len() >= MAX_KERNELS {
            return Err(agent_error(
                ErrorCode::LimitExceeded,
                format!("at most {MAX_KERNELS} kernels may run at once (dead ones count until shut down)"),
            ));
        }
        by_id.insert(kernel_id.to_owned(), Slot::Starting);
        Ok(())
    }

    fn next_cell_id(&self) -> u64 {
        let id = self.next_cell.get() + 1;
        self.next_cell.set(id);
        id
    }
}

/// `KernelStart`: answered once the kernel replied to `kernel_info_request` (or failed); the
/// connection goes on serving other requests meanwhile.
pub(crate) async fn start_kernel(
    agent: &Rc<Agent>,
    out: &Outbound,
    id: u64,
    request: KernelStart,
) -> Result<(), ConnectionClosed> {
    let kernel_id = request.kernel_id.clone();
    if kernel_id.is_empty() || kernel_id.len() > MAX_KERNEL_ID_LEN {
        let error = agent_error(
            ErrorCode::BadRequest,
            format!("a kernel id has 1 to {MAX_KERNEL_ID_LEN} bytes"),
        );
        return out.answer(id, Err(error)).await;
    }
    if let Err(err) = agent.kernels.reserve(&kernel_id) {
        return out.answer(id, Err(err)).await;
    }
    let (agent, out) = (agent.clone(), out.clone());
    tokio::task::spawn_local(async move {
        let answer = match start::start(&agent, &request).await {
            Ok((kernel, info)) => {
                agent
                    .kernels
                    .by_id
                    .borrow_mut()
                    .insert(kernel_id, Slot::Ready(kernel));
                Ok((Reply::KernelStarted { kernel: info }, Vec::new()))
            }
            Err(err) => {
                agent.kernels.by_id.borrow_mut().remove(&kernel_id);
                Err(err)
            }
        };
        let _ = out.answer(id, answer).await;
    });
    Ok(())
}

/// A cell as `KernelExecute` asks for it.
#[derive(Debug)]
pub(crate) struct CellRequest {
    pub(crate) code: String,
    pub(crate) timeout_ms: Option<u64>,
    pub(crate) silent: bool,
    pub(crate) around: Option<CellAround>,
}

/// `KernelExecute`: queues the cell and answers with its id at once; its events follow.
pub(crate) fn execute_cell(agent: &Agent, out: &Outbound, kernel_id: &str, cell: CellRequest) -> Answer {
    let kernel = agent.kernels.get(kernel_id)?;
    if let Some(reason) = kernel.dead_reason() {
        return Err(agent_error(
            ErrorCode::ProcessExited,
            format!("kernel {kernel_id:?} is dead ({reason}); shut it down and start it again"),
        ));
    }
    let cell_id = agent.kernels.next_cell_id();
    let job = CellJob {
        cell_id,
        cell,
        out: out.clone(),
    };
    let cells = kernel.cells.borrow().clone();
    let Some(cells) = cells else {
        return Err(agent_error(
            ErrorCode::ProcessExited,
            format!("kernel {kernel_id:?} is shutting down"),
        ));
    };
    cells.try_send(job).map_err(|err| match err {
        mpsc::error::TrySendError::Full(_) => agent_error(
            ErrorCode::LimitExceeded,
            format!("kernel {kernel_id:?} has {MAX_QUEUED_CELLS} cells waiting already"),
        ),
        mpsc::error::TrySendError::Closed(_) => agent_error(
            ErrorCode::ProcessExited,
            format!("kernel {kernel_id:?} is no longer running cells"),
        ),
    })?;
    Ok((Reply::CellStarted { cell_id }, Vec::new()))
}

/// `KernelInterrupt`: the running cell's loop interrupts the kernel (its way: `SIGINT` or an
/// `interrupt_request`), again until it answers; the cell then ends `interrupted`. A `SIGINT` is
/// sent at once as well, so that the caller hears of a kernel that cannot be signalled.
pub(crate) fn interrupt_kernel(agent: &Agent, kernel_id: &str) -> Answer {
    let kernel = agent.kernels.get(kernel_id)?;
    if let Some(reason) = kernel.dead_reason() {
        return Err(agent_error(
            ErrorCode::ProcessExited,
            format!("kernel {kernel_id:?} is dead ({reason})"),
        ));
    }
    kernel.interrupted_cell.set(kernel.running_cell.get());
    kernel.interrupt_requested.notify_one();
    if kernel.interrupt != InterruptMode::Signal {
        return Ok((Reply::Done, Vec::new()));
    }
    send_signal(kernel.pid(), libc::SIGINT).map_err(|err| {
        agent_error(
            ErrorCode::Io,
            format!("interrupting kernel {kernel_id:?} (pid {}): {err}", kernel.pid()),
        )
    })?;
    Ok((Reply::Done, Vec::new()))
}

/// `KernelShutdown`: forgets the kernel at once (its id is free again), asks it to shut down, kills
/// its process tree after [`SHUTDOWN_GRACE`], removes its connection file, then answers.
pub(crate) async fn shutdown_kernel(
    agent: &Rc<Agent>,
    out: &Outbound,
    id: u64,
    kernel_id: &str,
) -> Result<(), ConnectionClosed> {
    let kernel = match agent.kernels.get(kernel_id) {
        Ok(kernel) => kernel,
        Err(err) => return out.answer(id, Err(err)).await,
    };
    agent.kernels.by_id.borrow_mut().remove(kernel_id);
    kernel.mark_dead("shut down");
    // Queued cells end `kernel_died`; then the runner ends.
    kernel.cells.borrow_mut().take();
    let (agent, out) = (agent.clone(), out.clone());
    tokio::task::spawn_local(async move {
        stop_kernel(&agent, &kernel).await;
        let _ = out.answer(id, Ok((Reply::Done, Vec::new()))).await;
    });
    Ok(())
}

/// Asks the kernel to exit, kills what is left of its tree, and removes its connection file.
async fn stop_kernel(agent: &Agent, kernel: &Kernel) {
    let process = &kernel.process;
    if process.exit_status().is_none() {
        let exited = process.exit_notified();
        let polite = async {
            if let Err(err) =
                connection::request_shutdown(&kernel.info, &kernel.session, SHUTDOWN_GRACE).await
            {
                tracing::debug!(kernel_id = %kernel.id, error = %err, "shutdown_request failed");
            }
            if process.exit_status().is_none() {
                exited.await;
            }
        };
        let _ = tokio::time::timeout(SHUTDOWN_GRACE, polite).await;
    }
    kill_tree(process.pid(), libc::SIGKILL, process.exit_status().is_none());
    if let Some(task) = kernel.heartbeat.borrow_mut().take() {
        task.abort();
    }
    if let Err(err) = agent.root.remove(&kernel.connection_file) {
        tracing::warn!(kernel_id = %kernel.id, error = %err, "removing the connection file failed");
    }
}

/// How a cell ended given what the kernel replied and what the agent did to it.
pub(crate) fn final_status(reply_ok: bool, timed_out: bool, interrupted: bool) -> CellStatus {
    match (timed_out, interrupted, reply_ok) {
        (true, _, _) => CellStatus::TimedOut,
        (false, true, false) => CellStatus::Interrupted,
        (false, _, true) => CellStatus::Ok,
        (false, false, false) => CellStatus::Error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        assert_eq!(final_status(true, false, false), CellStatus::Ok);
        assert_eq!(final_status(false, false, false), CellStatus::Error);
        assert_eq!(final_status(false, false, true), CellStatus::Interrupted);
        assert_eq!(
            final_status(true, false, true),
            CellStatus::Ok,
            "finished before the interrupt"
        );
        assert_eq!(final_status(false, true, false), CellStatus::TimedOut);
    }

    #[test]
    fn ids_are_reserved_and_bounded() {
        let kernels = Kernels::default();
        kernels.reserve("a").expect("first");
        assert_eq!(
            kernels.reserve("a").expect_err("twice").code,
            ErrorCode::BadRequest
        );
        for i in 1..MAX_KERNELS {
            kernels.reserve(&format!("k{i}")).expect("room");
        }
        assert_eq!(
            kernels.reserve("more").expect_err("full").code,
            ErrorCode::LimitExceeded
        );
        assert_eq!(
            kernels.get("a").expect_err("starting").code,
            ErrorCode::BadRequest
        );
        assert_eq!(kernels.get("zz").expect_err("missing").code, ErrorCode::NotFound);
    }
}
