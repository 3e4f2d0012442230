//! Code kernels: the agent starts Jupyter kernels inside the sandbox and speaks the Jupyter
//! messaging protocol to them (ZeroMQ on the sandbox's loopback); the host sees only these
//! messages. A kernel's messages are the sandbox's data (hostile): the agent bounds what it relays
//! ([`MAX_CELL_EVENT_LEN`]) and says when it cut something.
//!
//! Flow: [`Request::KernelStart`](crate::Request::KernelStart) → [`Reply::KernelStarted`](crate::Reply::KernelStarted);
//! [`Request::KernelExecute`](crate::Request::KernelExecute) → [`Reply::CellStarted`](crate::Reply::CellStarted),
//! then [`AgentMessage::Cell`](crate::AgentMessage::Cell) events on the same connection, the last
//! one [`CellEvent::End`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The largest cell event the agent sends (its JSON is the frame's payload): a bigger stream text is
/// split over several events, a bigger result has its largest representations replaced by a note
/// (and named in `cut`).
pub const MAX_CELL_EVENT_LEN: usize = 1024 * 1024 - 4096;

/// How to start a kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelStart {
    /// The caller's name for the kernel (a context id); unique among the agent's kernels.
    pub kernel_id: String,
    /// The kernel's command; the argument `{connection_file}` is replaced by the path of the
    /// connection file the agent writes (ports on 127.0.0.1 and a random key, readable by the
    /// kernel's user only).
    pub argv: Vec<String>,
    /// Working directory (default: the user's home).
    #[serde(default)]
    pub cwd: Option<String>,
    /// The kernel's environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The user it runs as (default: the sandbox's default user).
    #[serde(default)]
    pub user: Option<String>,
    /// How long the kernel may take to answer its first `kernel_info_request`.
    pub ready_timeout_ms: u64,
    /// How a running cell is interrupted (left out of the JSON when `signal`).
    #[serde(default, skip_serializing_if = "InterruptMode::is_signal")]
    pub interrupt: InterruptMode,
    /// Code run silently after each cell, whose end then ends the cell: for a kernel that may
    /// publish a cell's output after it said `idle` (Deno sends results and console output from
    /// other tasks), the output that comes before the barrier's end is the cell's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub barrier: Option<String>,
}

/// Code run silently around a cell (see `Request::KernelExecute`). `after` runs whenever `before`
/// ran, also when the cell failed, timed out or was interrupted; the cell runs only if `before`
/// succeeded. Their output and errors are relayed as the cell's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellAround {
    pub before: String,
    pub after: String,
}

/// How a kernel is interrupted: its kernelspec's `interrupt_mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InterruptMode {
    /// `SIGINT` to the kernel's process (ipykernel, bash_kernel).
    #[default]
    Signal,
    /// An `interrupt_request` on the control channel (Deno, whose process `SIGINT` ends).
    Message,
}

impl InterruptMode {
    fn is_signal(&self) -> bool {
        *self == Self::Signal
    }
}

/// What a kernel said about itself once started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    /// The kernel's process (its pid inside the sandbox; it is listed with tag `kernel`).
    pub pid: u32,
    /// The language it reports (`language_info.name`).
    pub language: String,
    /// The language's version it reports.
    #[serde(default)]
    pub language_version: String,
    /// The kernel's implementation (`ipython`, `bash_kernel`, ...).
    #[serde(default)]
    pub implementation: String,
}

/// One thing a running cell produced, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CellEvent {
    /// Text the code wrote (`stream`).
    Stream {
        /// `stdout` or `stderr`.
        name: CellStream,
        /// The text.
        text: String,
    },
    /// A result (`execute_result`, `main: true`) or a display (`display_data`, `main: false`): a
    /// MIME bundle as the kernel sent it (`text/plain`, `text/html`, `image/png` in base64, ...).
    Result {
        /// The cell's value, not a display.
        main: bool,
        /// MIME type to representation.
        data: BTreeMap<String, serde_json::Value>,
        /// The kernel's metadata of the bundle.
        #[serde(default)]
        metadata: BTreeMap<String, serde_json::Value>,
        /// MIME types left out because the bundle was too large.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        cut: Vec<String>,
    },
    /// The code raised (`error`).
    Error {
        /// Exception name.
        name: String,
        /// Exception value.
        value: String,
        /// Traceback lines (may hold ANSI colour codes, as kernels send them).
        traceback: Vec<String>,
    },
    /// The cell's execution count (`execute_input`).
    ExecutionCount {
        /// The count.
        count: u32,
    },
    /// The cell ended; nothing of it follows.
    End {
        /// How.
        status: CellStatus,
        /// Bytes of output the agent dropped (beyond the per-cell bound).
        #[serde(default)]
        dropped_bytes: u64,
        /// The kernel is dead after it (given up and killed: it did not stop a timed-out cell);
        /// left out of the JSON when false. A `kernel_died` end says so by itself.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        kernel_dead: bool,
    },
}

/// Which stream a [`CellEvent::Stream`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    /// It ran to the end.
    Ok,
    /// It raised (an [`CellEvent::Error`] came before).
    Error,
    /// It ran past its time limit and was interrupted; the kernel lives.
    TimedOut,
    /// [`Request::KernelInterrupt`](crate::Request::KernelInterrupt) interrupted it; the kernel lives.
    Interrupted,
    /// The kernel died (or stopped answering) while it ran; restart the kernel.
    KernelDied,
}
