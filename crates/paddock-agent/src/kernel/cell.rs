//! Running a kernel's cells, one at a time: each kernel has one runner task that owns its shell and
//! iopub sockets and takes cells from a bounded queue, so a later cell waits for the earlier one
//! while cells of other kernels run concurrently. Also the heartbeat watch.
//!
//! A cell is an `execute_request` on shell; the iopub messages whose parent is that request become
//! its events, and it ends once both its `execute_reply` arrived and iopub said `idle` for it. On
//! its time limit the kernel is interrupted its way (`SIGINT`, or an `interrupt_request` for a
//! kernel whose `interrupt_mode` is `message`), repeated until it answers, and the cell ends
//! `timed_out` once the kernel finished it; a kernel still running it after [`INTERRUPT_GRACE`] is
//! marked dead and killed (Deno cannot interrupt a cell awaiting a promise that never settles).
//! An interrupt the caller asks for is repeated the same way (for at most [`INTERRUPT_GRACE`]):
//! ipykernel ignores `SIGINT` until it arms its handler, a moment after it publishes
//! `execute_input`, and a single signal landing in that moment was lost (seen under load: the cell
//! then ran to its end). Later cells ignore its leftovers, as they ignore every message
//! whose parent is not their own request. Between cells iopub is still read (and dropped), so a
//! kernel printing from a background thread cannot fill anything.
//!
//! What it does not do: restart the kernel, or time out a cell that has no limit (a cell may run
//! as long as the kernel lives; `KernelInterrupt` and `KernelShutdown` end it).

use std::rc::{Rc, Weak};
use std::time::Duration;

use jupyter_protocol::{ExecuteRequest, ExecutionState, JupyterMessageContent, ReplyStatus};
use paddock_protocol::kernel::{CellAround, CellStatus, InterruptMode};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

use super::connection::{heartbeat, Channel, Incoming, KernelClient, Received};
use super::relay::Relay;
use super::{final_status, CellRequest, Kernel};
use crate::outbound::Outbound;
use crate::process::kill_tree::kill_tree;

/// How often `SIGINT` is repeated while a timed-out cell has not stopped.
const RESIGNAL: Duration = Duration::from_millis(500);
/// How long a timed-out cell's kernel may take to stop after `SIGINT`; beyond it the kernel is
/// marked dead.
pub(crate) const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// Time between heartbeats.
const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
/// How long one heartbeat may take.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// Times a cell is sent again when the kernel aborted it before running it.
const ABORTED_RESENDS: u32 = 3;
/// Missed heartbeats in a row after which the kernel counts as dead.
const HEARTBEAT_MISSES: u32 = 3;
/// The time limit of the code run around a cell (it sets or restores variables).
const AROUND_LIMIT_MS: u64 = 10_000;

/// One queued cell.
#[derive(Debug)]
pub(crate) struct CellJob {
    pub(crate) cell_id: u64,
    pub(crate) cell: CellRequest,
    pub(crate) out: Outbound,
}

/// The kernel's runner: takes cells in order until the kernel is dead and the queue closed; cells
/// queued on a dead kernel end `kernel_died` at once.
pub(crate) async fn run_cells(
    kernel: Rc<Kernel>,
    mut client: KernelClient,
    mut jobs: mpsc::Receiver<CellJob>,
) {
    let mut reading = true;
    loop {
        let job = if reading && kernel.dead_reason().is_none() {
            tokio::select! {
                job = jobs.recv() => job,
                (_, received) = client.recv() => {
                    reading = received.is_ok();
                    continue;
                }
            }
        } else {
            jobs.recv().await
        };
        let Some(job) = job else {
            return;
        };
        if !reading {
            kernel.mark_dead("its sockets closed");
        }
        if kernel.dead_reason().is_some() {
            Relay::new(job.cell_id, job.out)
                .end(CellStatus::KernelDied, true)
                .await;
            continue;
        }
        run_cell(&kernel, &mut client, job).await;
    }
}

/// What has been seen of a running cell.
#[derive(Debug, Default)]
struct Progress {
    reply_ok: Option<bool>,
    idle: bool,
    timed_out: bool,
    /// The kernel began running it (`execute_input`).
    started: bool,
    /// Times it was sent again after an `aborted` reply.
    resent: u32,
    /// When the timed-out cell is given up on.
    grace: Option<Instant>,
    /// Until when an interrupt the caller asked for is sent again (until the kernel answers).
    interrupt_until: Option<Instant>,
    /// The kernel published an error for it (the interrupt landed): no more `SIGINT`, which would
    /// land in the kernel's own handling of the first.
    raised: bool,
    /// The barrier sent after the cell ended (kernels that publish output after `idle`).
    barrier: Option<BarrierProgress>,
}

/// A barrier's request and how far it got.
#[derive(Debug)]
struct BarrierProgress {
    msg_id: String,
    reply: bool,
    idle: bool,
}

/// Runs one cell to its end (with the code around it, if any).
async fn run_cell(kernel: &Kernel, client: &mut KernelClient, job: CellJob) {
    let CellJob { cell_id, cell, out } = job;
    let CellRequest {
        code,
        timeout_ms,
        silent,
        around,
    } = cell;
    let mut relay = Relay::new(cell_id, out);
    kernel.running_cell.set(Some(cell_id));
    let status = match around {
        None => execute(kernel, client, &mut relay, code, timeout_ms, silent).await,
        Some(CellAround { before, after }) => {
            let limit = Some(AROUND_LIMIT_MS);
            let status = match execute(kernel, client, &mut relay, before, limit, true).await {
                CellStatus::Ok => execute(kernel, client, &mut relay, code, timeout_ms, silent).await,
                failed => failed,
            };
            if kernel.dead_reason().is_none() {
                // An interrupt of the cell is not one of the code that restores after it.
                kernel.interrupted_cell.set(None);
                let restored = execute(kernel, client, &mut relay, after, limit, true).await;
                if restored != CellStatus::Ok {
                    tracing::warn!(cell_id, ?restored, "the code after a cell did not succeed");
                }
            }
            status
        }
    };
    kernel.running_cell.set(None);
    kernel.interrupted_cell.set(None);
    relay.end(status, kernel.dead_reason().is_some()).await;
}

async fn execute(
    kernel: &Kernel,
    client: &mut KernelClient,
    relay: &mut Relay,
    code: String,
    timeout_ms: Option<u64>,
    silent: bool,
) -> CellStatus {
    let cell_id = kernel.running_cell.get();
    let request = ExecuteRequest {
        code,
        silent,
        store_history: !silent,
        user_expressions: None,
        allow_stdin: false,
        stop_on_error: true,
    };
    let mut msg_id = match client.send_shell(request.clone()).await {
        Ok(msg_id) => msg_id,
        Err(err) => {
            kernel.mark_dead(&format!("sending execute_request failed: {err}"));
            return CellStatus::KernelDied;
        }
    };
    let deadline = timeout_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
    let exited = kernel.process.exit_notified();
    let died = kernel.died.notified();
    tokio::pin!(exited, died);
    let mut progress = Progress::default();
    loop {
        if kernel.dead_reason().is_some() {
            return CellStatus::KernelDied;
        }
        let interrupted =
            || progress.timed_out || (cell_id.is_some() && kernel.interrupted_cell.get() == cell_id);
        if let (Some(ok), true) = (progress.reply_ok, progress.idle) {
            match (&kernel.barrier, &progress.barrier) {
                // Output the kernel still publishes comes before the barrier's end.
                (Some(barrier), None) if !silent => {
                    let request = ExecuteRequest {
                        code: barrier.clone(),
                        silent: true,
                        store_history: false,
                        user_expressions: None,
                        allow_stdin: false,
                        stop_on_error: false,
                    };
                    match client.send_shell(request).await {
                        Ok(msg_id) => {
                            progress.barrier = Some(BarrierProgress {
                                msg_id,
                                reply: false,
                                idle: false,
                            });
                            continue;
                        }
                        Err(err) => {
                            kernel.mark_dead(&format!("sending execute_request failed: {err}"));
                            return CellStatus::KernelDied;
                        }
                    }
                }
                (Some(_), Some(b)) if !(b.reply && b.idle) => {}
                _ => return final_status(ok, progress.timed_out, interrupted()),
            }
        }
        if interrupted() && !progress.timed_out && progress.interrupt_until.is_none() {
            progress.interrupt_until = Some(Instant::now() + INTERRUPT_GRACE);
        }
        let resend = progress.reply_ok.is_none()
            && !progress.raised
            && progress
                .interrupt_until
                .is_some_and(|until| Instant::now() < until);
        let wake = match progress.grace {
            Some(grace) => Some(grace.min(Instant::now() + RESIGNAL)),
            None if resend => {
                Some(deadline.map_or(Instant::now() + RESIGNAL, |d| d.min(Instant::now() + RESIGNAL)))
            }
            None if progress.reply_ok.is_some() => None,
            None => deadline,
        };
        tokio::select! {
            (channel, received) = client.recv() => match received {
                Ok(Received::Message(Incoming { parent: Some(parent), content }))
                    if progress.barrier.as_ref().is_some_and(|b| b.msg_id == parent) =>
                {
                    // The barrier's own messages end it; what else carries it as parent is the
                    // cell's output (Deno attributes console output to its latest request).
                    let Some(barrier) = progress.barrier.as_mut() else { continue };
                    match (channel, content) {
                        (Channel::Shell, content) => barrier.reply |= content.message_type() == "execute_reply",
                        (Channel::IoPub, JupyterMessageContent::Status(status)) => {
                            barrier.idle |= status.execution_state == ExecutionState::Idle;
                        }
                        (Channel::IoPub, JupyterMessageContent::ExecuteInput(_)) => {}
                        (Channel::IoPub, content) => relay.relay_message(content, interrupted()).await,
                    }
                }
                Ok(Received::Message(Incoming { parent: Some(parent), content })) if parent == msg_id => {
                    match (channel, content) {
                        (Channel::Shell, content) if content.message_type() == "execute_reply" => {
                            let status = reply_status(&content);
                            if status == "aborted" && !progress.started && progress.resent < ABORTED_RESENDS {
                                // ipykernel aborts requests that arrive in the moment after an error
                                // (its `stop_on_error` window), even though this one was sent after
                                // the failed cell ended: the code never ran, so send it again.
                                progress.resent += 1;
                                progress.idle = false;
                                match client.send_shell(request.clone()).await {
                                    Ok(id) => msg_id = id,
                                    Err(err) => kernel.mark_dead(&format!("sending execute_request failed: {err}")),
                                }
                                continue;
                            }
                            progress.reply_ok = Some(status == "ok");
                        }
                        (Channel::Shell, _) => {}
                        (Channel::IoPub, JupyterMessageContent::Status(status)) => {
                            progress.idle |= status.execution_state == ExecutionState::Idle;
                        }
                        (Channel::IoPub, content) => {
                            progress.started |= matches!(content, JupyterMessageContent::ExecuteInput(_));
                            progress.raised |= matches!(content, JupyterMessageContent::ErrorOutput(_));
                            // Read now: the interrupt may have been requested while this waited.
                            let interrupted = interrupted();
                            relay.relay_message(content, interrupted).await;
                        }
                    }
                }
                Ok(Received::Dropped { len }) if channel == Channel::IoPub => relay.count_dropped(len),
                Ok(_) => {}
                Err(err) => kernel.mark_dead(&err.to_string()),
            },
            () = &mut exited => {}
            () = &mut died => {}
            // An interrupt was asked for: a kernel interrupted by message gets it now (a signal was
            // sent already); the loop then turns, and sends it again on its timer.
            () = kernel.interrupt_requested.notified() => {
                if kernel.interrupt == InterruptMode::Message && progress.reply_ok.is_none() {
                    if let Err(err) = kernel.send_interrupt().await {
                        tracing::warn!(cell_id, error = %err, "interrupting a cell failed");
                    }
                }
                continue;
            }
            () = sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                let now = Instant::now();
                match progress.grace {
                    Some(grace) if now >= grace => {
                        // It would still be running its old cell when the next one came: it is
                        // dead, and killed so that it stops spending the sandbox's CPU.
                        kernel.mark_dead("it did not stop a timed-out cell when interrupted");
                        kill_tree(kernel.pid(), libc::SIGKILL, true);
                        return CellStatus::TimedOut;
                    }
                    None if progress.reply_ok.is_none() && deadline.is_some_and(|d| now >= d) => {
                        progress.timed_out = true;
                        progress.grace = Some(now + INTERRUPT_GRACE);
                    }
                    _ => {}
                }
                // Again until the kernel answers: a SIGINT that arrived before the kernel began
                // running the cell (ipykernel ignores SIGINT between requests) is lost.
                if progress.reply_ok.is_none() && !progress.raised {
                    if let Err(err) = kernel.send_interrupt().await {
                        tracing::warn!(cell_id, error = %err, "interrupting a cell failed");
                    }
                }
            }
        }
    }
}

/// The `status` of an `execute_reply` (typed, or kept untyped because its shape was odd).
fn reply_status(content: &JupyterMessageContent) -> &str {
    match content {
        JupyterMessageContent::ExecuteReply(reply) => match reply.status {
            ReplyStatus::Ok => "ok",
            ReplyStatus::Error => "error",
            ReplyStatus::Aborted => "aborted",
        },
        JupyterMessageContent::UnknownMessage(unknown) => unknown
            .content
            .get("status")
            .and_then(|s| s.as_str())
            .unwrap_or("error"),
        _ => "error",
    }
}

/// Pings the kernel every [`HEARTBEAT_INTERVAL`]; after [`HEARTBEAT_MISSES`] missed answers in a
/// row the kernel is marked dead (its running cell ends `kernel_died`). Ends with the kernel.
pub(crate) async fn watch_heartbeat(kernel: Weak<Kernel>) {
    let mut missed = 0;
    loop {
        tokio::time::sleep(HEARTBEAT_INTERVAL).await;
        let Some(info) = kernel
            .upgrade()
            .filter(|k| k.dead_reason().is_none())
            .map(|k| k.info.clone())
        else {
            return;
        };
        if heartbeat(&info, HEARTBEAT_TIMEOUT).await {
            missed = 0;
            continue;
        }
        missed += 1;
        if missed >= HEARTBEAT_MISSES {
            if let Some(kernel) = kernel.upgrade() {
                kernel.mark_dead("it stopped answering heartbeats");
            }
            return;
        }
    }
}
