//! What streaming operations hand to a front-end: process events, file bytes, directory events.

use std::pin::Pin;

use bytes::Bytes;
use futures_util::Stream;
use paddock_types::api::WatchEvent;
use tokio::sync::mpsc;

use crate::core::output::collect::{CollectedOutput, JsonText, OutputBudget, COLLECT_LIMIT};
use crate::core::output::events::{ExecOutput, OutputStream};

/// A stream of bytes (file contents, tar archives, request bodies).
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

/// The events of one process, in order: `Started`, output (the agent's bytes, encoded only by the
/// front-end that sends them, so a collected answer never pays for text or base64 it does not
/// keep), then `Exit` (or `Error`). Dropping the stream of a foreground process before its exit
/// kills the process tree.
#[derive(Debug)]
pub struct ExecStream {
    pub(crate) pid: u32,
    pub(crate) rx: Option<mpsc::Receiver<ExecOutput>>,
    pub(crate) started_sent: bool,
    /// The server's budget for collected output and the tenant it is charged to.
    pub(crate) budget: (OutputBudget, String),
}

impl ExecStream {
    /// The process's pid inside the sandbox.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether this is a background process (no events follow; read them with `attach_process`).
    pub fn is_background(&self) -> bool {
        self.rx.is_none()
    }

    /// The next event; `None` after the last one. Cancel-safe: an event is never lost when the
    /// future is dropped.
    pub async fn recv(&mut self) -> Option<ExecOutput> {
        if !self.started_sent {
            self.started_sent = true;
            return Some(ExecOutput::Started { pid: self.pid });
        }
        self.rx.as_mut()?.recv().await
    }

    /// Waits for the end and collects the output as JSON text: each stream at most
    /// [`COLLECT_LIMIT`](crate::COLLECT_LIMIT) bytes once encoded, and all collecting requests
    /// together within the server's budget; what does not fit is dropped and flagged.
    pub async fn collect(mut self) -> CollectedOutput {
        let pid = self.pid;
        let Some(rx) = self.rx.as_mut() else {
            return CollectedOutput::background(pid);
        };
        let (budget, tenant) = &self.budget;
        let mut held = budget.claim(tenant);
        let (mut stdout, mut stderr) = (JsonText::default(), JsonText::default());
        let mut exit = None;
        // Bytes escaped since this task last let others run: escaping is CPU work that tokio's
        // budget does not see, and a process writing as fast as it can would otherwise keep a
        // worker thread to itself for a whole budget of chunks (tens of milliseconds).
        let mut since_yield = 0usize;
        while let Some(item) = rx.recv().await {
            match item {
                ExecOutput::Output { stream, data, .. } => {
                    since_yield += data.len();
                    if since_yield >= YIELD_EVERY {
                        since_yield = 0;
                        tokio::task::yield_now().await;
                    }
                    let text = match stream {
                        OutputStream::Stdout | OutputStream::Pty => &mut stdout,
                        OutputStream::Stderr => &mut stderr,
                    };
                    // Past the cut, output is only drained (the process runs to its end).
                    text.push(&data, COLLECT_LIMIT, &mut held);
                }
                ExecOutput::Exit(info) => exit = Some(info),
                ExecOutput::Started { .. } | ExecOutput::Error { .. } => {}
            }
        }
        stdout.finish(COLLECT_LIMIT, &mut held);
        stderr.finish(COLLECT_LIMIT, &mut held);
        CollectedOutput::new(pid, stdout, stderr, exit, held)
    }
}

/// Bytes of output [`ExecStream::collect`] escapes between two yields to the runtime.
const YIELD_EVERY: usize = 256 * 1024;

/// A file being downloaded.
pub struct FileDownload {
    /// Its size when the download started, when it is known (`None` for files whose size the file
    /// system does not report, such as `/proc` files, and for symlinks).
    pub size: Option<u64>,
    /// Its bytes.
    pub stream: ByteStream,
}

impl std::fmt::Debug for FileDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDownload")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Events of a watched directory; ends with a `WatchEventKind::Ended` event when the directory goes
/// away, or when the sandbox ends.
#[derive(Debug)]
pub struct WatchStream {
    pub(crate) rx: mpsc::Receiver<WatchEvent>,
}

impl WatchStream {
    /// The next event.
    pub async fn recv(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }
}

/// Appends as much of `data` to `buf` as keeps it within `cap` bytes; the rest is dropped.
pub(crate) fn append_capped(buf: &mut Vec<u8>, data: &[u8], cap: usize) {
    let room = cap.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
}
