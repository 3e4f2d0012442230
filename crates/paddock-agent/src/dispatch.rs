//! Answering requests once the handshake is done: process requests here, file requests in
//! `files/`, watches in `watch/`, code kernels in `kernel/`.

use std::rc::Rc;

use paddock_protocol::{AgentError, ErrorCode, Reply, Request, SpawnRequest};
use paddock_sys::reap::send_signal;

use crate::agent::Agent;
use crate::error_code::agent_error;
use crate::files::list_dir::list_dir;
use crate::files::mkdir::mkdir;
use crate::files::read_file::read_file;
use crate::files::remove::remove;
use crate::files::rename::rename;
use crate::files::stat::stat;
use crate::files::write_file::{write_file, WriteFile};
use crate::kernel::{execute_cell, interrupt_kernel, shutdown_kernel, start_kernel, CellRequest};
use crate::outbound::{Answer, ConnectionClosed, Outbound};
use crate::process::attach::{add_cursors, start_forwarding};
use crate::process::kill_tree::kill_tree;
use crate::process::spawn::spawn_process;
use crate::process::stdin::StdinWrite;
use crate::watch::{start_watch, unwatch};

/// Handles request `id` from the connection behind `out`; fails only when the connection is gone.
pub(crate) async fn handle_request(
    agent: &Rc<Agent>,
    out: &Outbound,
    id: u64,
    request: Request,
    payload: Vec<u8>,
) -> Result<(), ConnectionClosed> {
    match request {
        Request::Hello { .. } => {
            out.answer(
                id,
                Err(agent_error(
                    ErrorCode::HandshakeRequired,
                    "hello was already received",
                )),
            )
            .await
        }
        Request::Spawn(spawn) => spawn_and_answer(agent, out, id, &spawn).await,
        Request::Attach {
            pid,
            stdout_from,
            stderr_from,
        } => {
            let process = match agent.process(pid) {
                Ok(process) => process,
                Err(err) => return out.answer(id, Err(err)).await,
            };
            let (stdout_from, stderr_from) = add_cursors(&process, out.conn_id(), stdout_from, stderr_from);
            if let Err(closed) = out
                .answer(
                    id,
                    Ok((
                        Reply::Attached {
                            stdout_from,
                            stderr_from,
                        },
                        Vec::new(),
                    )),
                )
                .await
            {
                process.unsubscribe(out.conn_id());
                return Err(closed);
            }
            start_forwarding(&process, out.clone());
            Ok(())
        }
        Request::WriteStdin { pid, close } => queue_stdin(agent, out, id, pid, close, payload).await,
        Request::Watch { path, recursive } => start_watch(agent, out, id, &path, recursive).await,
        Request::KernelStart(start) => start_kernel(agent, out, id, start).await,
        Request::KernelExecute {
            kernel_id,
            code,
            timeout_ms,
            silent,
            around,
        } => {
            let cell = CellRequest {
                code,
                timeout_ms,
                silent,
                around,
            };
            out.answer(id, execute_cell(agent, out, &kernel_id, cell)).await
        }
        Request::KernelShutdown { kernel_id } => shutdown_kernel(agent, out, id, &kernel_id).await,
        other => {
            out.answer(id, answer(agent, out.conn_id(), other, &payload))
                .await
        }
    }
}

/// Spawns, answers, and (unless detached) streams the output to this connection. The cursors are
/// placed before the answer is queued, so no output is lost while the answer waits for room.
async fn spawn_and_answer(
    agent: &Rc<Agent>,
    out: &Outbound,
    id: u64,
    request: &SpawnRequest,
) -> Result<(), ConnectionClosed> {
    let process = match spawn_process(agent, request) {
        Ok(process) => process,
        Err(err) => return out.answer(id, Err(err)).await,
    };
    let pid = process.pid();
    if !request.detached {
        add_cursors(&process, out.conn_id(), 0, 0);
    }
    if let Err(closed) = out.answer(id, Ok((Reply::Spawned { pid }, Vec::new()))).await {
        process.unsubscribe(out.conn_id());
        return Err(closed);
    }
    if !request.detached {
        start_forwarding(&process, out.clone());
    }
    Ok(())
}

/// Queues a stdin write; the process's stdin task answers once it is written.
async fn queue_stdin(
    agent: &Agent,
    out: &Outbound,
    id: u64,
    pid: u32,
    close: bool,
    data: Vec<u8>,
) -> Result<(), ConnectionClosed> {
    let queue = agent.process(pid).and_then(|process| {
        if process.exit_status().is_some() {
            return Err(exited(pid));
        }
        process.stdin().ok_or_else(|| {
            agent_error(
                ErrorCode::BadRequest,
                format!("process {pid} has no open stdin (spawned without stdin, or closed)"),
            )
        })
    });
    let queue = match queue {
        Ok(queue) => queue,
        Err(err) => return out.answer(id, Err(err)).await,
    };
    let write = StdinWrite {
        id,
        data,
        close,
        out: out.clone(),
    };
    if queue.send(write).await.is_err() {
        return out.answer(id, Err(exited(pid))).await;
    }
    Ok(())
}

/// Requests answered at once.
fn answer(agent: &Agent, conn: u64, request: Request, payload: &[u8]) -> Answer {
    let done = Ok((Reply::Done, Vec::new()));
    match request {
        Request::Signal { pid, signal } => {
            let process = running(agent, pid)?;
            send_signal(process.pid(), signal).map_err(|err| signal_error(pid, signal, &err))?;
            done
        }
        Request::KillTree { pid, signal } => {
            let signal = signal.unwrap_or(libc::SIGKILL);
            if !(1..=64).contains(&signal) {
                return Err(agent_error(
                    ErrorCode::BadRequest,
                    format!("invalid signal {signal}"),
                ));
            }
            let process = agent.process(pid)?;
            kill_tree(pid, signal, process.exit_status().is_none());
            done
        }
        Request::Resize { pid, size } => {
            let process = running(agent, pid)?;
            let size = paddock_sys::pty::WinSize {
                rows: size.rows,
                cols: size.cols,
            };
            process
                .resize_pty(size)
                .ok_or_else(|| agent_error(ErrorCode::BadRequest, format!("process {pid} has no PTY")))?
                .map_err(|err| {
                    agent_error(ErrorCode::Io, format!("resizing the PTY of process {pid}: {err}"))
                })?;
            done
        }
        Request::ListProcesses => Ok((
            Reply::Processes {
                processes: agent.processes.borrow().list(),
            },
            Vec::new(),
        )),
        Request::Detach { pid } => {
            agent.process(pid)?.unsubscribe(conn);
            done
        }
        Request::ReadFile {
            path,
            offset,
            max_len,
        } => read_file(agent, &path, offset, max_len),
        Request::WriteFile {
            path,
            offset,
            truncate,
            mode,
            user,
        } => {
            let request = WriteFile {
                path: &path,
                offset,
                truncate,
                mode,
                user: user.as_deref(),
                data: payload,
            };
            write_file(agent, &request)
        }
        Request::ListDir { path, after } => list_dir(agent, &path, after.as_deref()),
        Request::Stat { path } => stat(agent, &path),
        Request::Mkdir {
            path,
            parents,
            mode,
            user,
        } => mkdir(agent, &path, parents, mode, user.as_deref()),
        Request::Remove { path, recursive } => remove(agent, &path, recursive),
        Request::Rename { from, to } => rename(agent, &from, &to),
        Request::Symlink { path, target, user } => {
            crate::files::symlink::symlink(agent, &path, &target, user.as_deref())
        }
        Request::Unwatch { watch_id } => unwatch(agent, conn, watch_id),
        Request::Prefetch { paths } => crate::files::prefetch::prefetch(agent, &paths),
        Request::KernelInterrupt { kernel_id } => interrupt_kernel(agent, &kernel_id),
        Request::Hold => {
            agent.hold(conn);
            done
        }
        Request::Hello { .. }
        | Request::Spawn(_)
        | Request::Attach { .. }
        | Request::WriteStdin { .. }
        | Request::Watch { .. }
        | Request::KernelStart(_)
        | Request::KernelExecute { .. }
        | Request::KernelShutdown { .. } => {
            Err(agent_error(ErrorCode::BadRequest, "request handled elsewhere"))
        }
    }
}

/// The process `pid`, which must still be running.
fn running(agent: &Agent, pid: u32) -> Result<Rc<crate::process::table::Process>, AgentError> {
    let process = agent.process(pid)?;
    if process.exit_status().is_some() {
        return Err(exited(pid));
    }
    Ok(process)
}

fn exited(pid: u32) -> AgentError {
    agent_error(ErrorCode::ProcessExited, format!("process {pid} has exited"))
}

fn signal_error(pid: u32, signal: i32, err: &std::io::Error) -> AgentError {
    match err.raw_os_error() {
        Some(libc::EINVAL) => agent_error(ErrorCode::BadRequest, format!("invalid signal {signal}")),
        Some(libc::ESRCH) => exited(pid),
        _ => agent_error(ErrorCode::Io, format!("signalling process {pid}: {err}")),
    }
}
