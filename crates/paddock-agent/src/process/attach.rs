//! Attaching a connection to a process's output: cursors in its streams, and a forwarding task that
//! sends buffered and new output in frames of at most [`OUTPUT_FRAME`] bytes, then the exit.
//!
//! The forwarding task pulls from the ring buffers at its own pace (it waits while the connection's
//! queue is full), so the replay of old output and live output form one ordered sequence and a slow
//! connection back-pressures the process through its cursor (see `output.rs`).

use std::rc::Rc;

use paddock_protocol::AgentMessage;

use crate::outbound::Outbound;
use crate::process::table::Process;

/// Largest output payload per frame.
pub(crate) const OUTPUT_FRAME: usize = 64 * 1024;

/// Places connection `conn`'s cursors (replacing an earlier attachment): stdout (or PTY) from
/// `stdout_from`, stderr from `stderr_from`, each clamped to what is still buffered. Returns the
/// offsets replay will start from.
pub(crate) fn add_cursors(process: &Process, conn: u64, stdout_from: u64, stderr_from: u64) -> (u64, u64) {
    process.unsubscribe(conn);
    let stdout = process.stdout_stream().add_cursor(conn, stdout_from);
    let stderr = process
        .stderr_stream()
        .map_or(0, |s| s.add_cursor(conn, stderr_from));
    (stdout, stderr)
}

/// Starts forwarding `process`'s output to `out` from the cursors placed by [`add_cursors`].
pub(crate) fn start_forwarding(process: &Rc<Process>, out: Outbound) {
    let conn = out.conn_id();
    let task = tokio::task::spawn_local(forward_output(process.clone(), out));
    process.set_subscriber(conn, task);
}

async fn forward_output(process: Rc<Process>, out: Outbound) {
    let conn = out.conn_id();
    let pid = process.pid();
    loop {
        let changed = process.change_notified();
        let mut sent = false;
        for stream in process.streams() {
            let Some((offset, data)) = stream.take_chunk(conn, OUTPUT_FRAME) else {
                continue;
            };
            let message = AgentMessage::Output {
                pid,
                stream: stream.kind(),
                offset,
            };
            if out.send(&message, &data).await.is_err() {
                process.subscriber_done(conn);
                return;
            }
            sent = true;
        }
        if sent {
            continue;
        }
        let drained = process
            .streams()
            .iter()
            .all(|s| s.is_closed() && s.cursor_at_end(conn));
        if let (true, Some(status)) = (drained, process.exit_status()) {
            let _ = out.send(&AgentMessage::Exited { pid, status }, &[]).await;
            process.subscriber_done(conn);
            return;
        }
        changed.await;
    }
}
