//! Code kernels through the agent: start, run a cell (its events as a stream), interrupt, stop.
//! The agent is the kernels' Jupyter client; this side sees only `paddock_protocol::kernel`.

use std::time::Duration;

use paddock_protocol::kernel::{CellAround, CellEvent, KernelInfo, KernelStart};
use paddock_protocol::{Reply, Request};
use tokio::sync::mpsc;

use super::routing::Subscribe;
use super::{expect_done, unexpected, AgentClient, AgentClientError, REQUEST_TIMEOUT};

/// The events of one running cell, in order; the last is `CellEvent::End` (if the connection ends
/// first, the stream just ends).
#[derive(Debug)]
pub struct CellEvents {
    cell_id: u64,
    rx: mpsc::Receiver<CellEvent>,
}

impl CellEvents {
    /// The agent's id of the cell.
    pub fn cell_id(&self) -> u64 {
        self.cell_id
    }

    /// The next event; `None` once the stream ended.
    pub async fn next(&mut self) -> Option<CellEvent> {
        self.rx.recv().await
    }
}

impl AgentClient {
    /// Starts a kernel and waits until it answers (the agent bounds that by
    /// `start.ready_timeout_ms`; this call allows that plus a margin).
    pub async fn kernel_start(&self, start: KernelStart) -> Result<KernelInfo, AgentClientError> {
        let timeout = Duration::from_millis(start.ready_timeout_ms) + REQUEST_TIMEOUT;
        let answer = self
            .call(
                "kernel_start",
                Request::KernelStart(start),
                &[],
                Subscribe::No,
                Some(timeout),
            )
            .await?;
        match answer.body {
            Reply::KernelStarted { kernel } => Ok(kernel),
            other => Err(unexpected("kernel_start", &other)),
        }
    }

    /// Queues `code` on kernel `kernel_id` (`silent`: Jupyter's silent execution); its events
    /// follow on the returned stream.
    pub async fn kernel_execute(
        &self,
        kernel_id: &str,
        code: &str,
        timeout_ms: Option<u64>,
        silent: bool,
        around: Option<CellAround>,
    ) -> Result<CellEvents, AgentClientError> {
        let request = Request::KernelExecute {
            kernel_id: kernel_id.to_owned(),
            code: code.to_owned(),
            timeout_ms,
            silent,
            around,
        };
        let answer = self
            .call(
                "kernel_execute",
                request,
                &[],
                Subscribe::Cell,
                Some(REQUEST_TIMEOUT),
            )
            .await?;
        match answer.body {
            Reply::CellStarted { cell_id } => Ok(CellEvents {
                cell_id,
                rx: answer.cell.unwrap_or_else(|| mpsc::channel(1).1),
            }),
            other => Err(unexpected("kernel_execute", &other)),
        }
    }

    /// Interrupts the running cell of `kernel_id`.
    pub async fn kernel_interrupt(&self, kernel_id: &str) -> Result<(), AgentClientError> {
        let request = Request::KernelInterrupt {
            kernel_id: kernel_id.to_owned(),
        };
        let answer = self
            .call(
                "kernel_interrupt",
                request,
                &[],
                Subscribe::No,
                Some(REQUEST_TIMEOUT),
            )
            .await?;
        expect_done("kernel_interrupt", answer.body)
    }

    /// Stops kernel `kernel_id`.
    pub async fn kernel_shutdown(&self, kernel_id: &str) -> Result<(), AgentClientError> {
        let request = Request::KernelShutdown {
            kernel_id: kernel_id.to_owned(),
        };
        let answer = self
            .call(
                "kernel_shutdown",
                request,
                &[],
                Subscribe::No,
                Some(REQUEST_TIMEOUT),
            )
            .await?;
        expect_done("kernel_shutdown", answer.body)
    }
}
