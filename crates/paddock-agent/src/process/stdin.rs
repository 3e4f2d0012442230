//! Writing to a process's stdin (a pipe, or the PTY master): one task per process writes queued
//! chunks in order and answers each request once its bytes are written, so a process that does not
//! read its stdin blocks only its own writes, never the connection's other requests.

use std::rc::Rc;

use paddock_protocol::{ErrorCode, Reply};
use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use crate::error_code::agent_error;
use crate::outbound::Outbound;
use crate::process::table::Process;

/// Stdin chunks queued per process before the requesting connection waits.
const STDIN_QUEUE: usize = 16;

/// One `WriteStdin` request.
#[derive(Debug)]
pub(crate) struct StdinWrite {
    /// The request id to answer.
    pub(crate) id: u64,
    /// Bytes to write.
    pub(crate) data: Vec<u8>,
    /// Close stdin afterwards (ignored on a PTY, whose master also carries the output).
    pub(crate) close: bool,
    /// Where to answer.
    pub(crate) out: Outbound,
}

/// Starts the stdin task of `process` writing to `fd` and returns its queue.
pub(crate) fn start_stdin_writer(process: &Rc<Process>, fd: pipe::Sender) -> mpsc::Sender<StdinWrite> {
    let (tx, rx) = mpsc::channel(STDIN_QUEUE);
    tokio::task::spawn_local(write_stdin(process.clone(), fd, rx));
    tx
}

async fn write_stdin(process: Rc<Process>, fd: pipe::Sender, mut rx: mpsc::Receiver<StdinWrite>) {
    let pid = process.pid();
    let mut fd = Some(fd);
    while let Some(write) = rx.recv().await {
        let result = match fd.as_mut() {
            _ if process.exit_status().is_some() => Err(agent_error(
                ErrorCode::ProcessExited,
                format!("process {pid} has exited"),
            )),
            None => Err(agent_error(
                ErrorCode::BadRequest,
                format!("stdin of process {pid} is closed"),
            )),
            Some(stdin) => {
                let exited = process.exit_notified();
                tokio::select! {
                    r = stdin.write_all(&write.data) => r.map_err(|err| {
                        agent_error(ErrorCode::Io, format!("writing stdin of process {pid}: {err}"))
                    }),
                    () = exited => Err(agent_error(ErrorCode::ProcessExited, format!("process {pid} has exited"))),
                }
            }
        };
        if write.close && !process.is_pty() {
            fd = None;
            process.close_stdin();
        }
        let _ = write
            .out
            .answer(write.id, result.map(|()| (Reply::Done, Vec::new())))
            .await;
    }
}
