//! Processes: exec, streamed events, re-attach, stdin, signals, PTY size.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// `POST /v1/sandboxes/{id}/exec` (and the first message of `GET .../exec/ws`). Exactly one of
/// `argv` and `shell` must be given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// The program and its arguments, run without a shell.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// A shell command line, run with `/bin/sh -c`.
    #[serde(default)]
    pub shell: Option<String>,
    /// Extra environment (on top of the sandbox's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (the sandbox's default when absent).
    #[serde(default)]
    pub cwd: Option<String>,
    /// User to run as (the sandbox's default when absent).
    #[serde(default)]
    pub user: Option<String>,
    /// Kill the process tree after this many milliseconds (`timed_out` is then set in the exit).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bytes written to the process's stdin (UTF-8 text); stdin is closed afterwards unless
    /// `stdin_open` is set.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Keep stdin open for `POST .../processes/{pid}/stdin` (or WebSocket input).
    #[serde(default)]
    pub stdin_open: bool,
    /// Start in the background: the response is `{"pid": N}` at once; the output is kept and can be
    /// read with `GET .../processes/{pid}/output`.
    #[serde(default)]
    pub background: bool,
    /// A caller-chosen tag, shown in the process list.
    #[serde(default)]
    pub tag: Option<String>,
    /// Run under a pseudo-terminal of this size (stdout and stderr then arrive as one `pty` stream).
    #[serde(default)]
    pub pty: Option<PtySizeBody>,
}

/// A terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PtySizeBody {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// Output bytes: `data` holds them as text when they are valid UTF-8, `data_b64` (standard base64)
/// otherwise. Exactly one is present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamData {
    /// Offset of the first byte in the stream (for re-attach with `stdout_from`/`stderr_from`).
    pub offset: u64,
    /// The bytes as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// The bytes as base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_b64: Option<String>,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExitInfo {
    /// Exit code as a shell reports it (128+N for signal N).
    pub exit_code: i32,
    /// The signal that killed it, if any.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Killed because its `timeout_ms` passed.
    pub timed_out: bool,
    /// Wall-clock run time in milliseconds.
    pub duration_ms: u64,
    /// CPU time (user + system) in microseconds, children included.
    pub cpu_time_us: u64,
    /// Peak resident memory in KiB.
    pub max_rss_kib: u64,
}

/// One line of an exec stream (NDJSON: one JSON object per line; SSE: `event: <type>`, `data: <json>`;
/// WebSocket: one text message each).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    /// The process started (always first).
    Started {
        /// Its pid inside the sandbox.
        pid: u32,
    },
    /// Standard output.
    Stdout(StreamData),
    /// Standard error.
    Stderr(StreamData),
    /// Terminal output (PTY processes).
    Pty(StreamData),
    /// The process ended (always last, after all output).
    Exit(ExitInfo),
    /// The stream broke off (the sandbox died, or the server is shutting down).
    Error {
        /// Stable code.
        code: super::ErrorCode,
        /// Explanation.
        message: String,
    },
}

/// Response of a foreground exec asked for as plain JSON (`Accept: application/json`), and of a
/// background exec (only `pid`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ExecResult {
    /// The process's pid inside the sandbox.
    pub pid: u32,
    /// Standard output (lossy UTF-8), foreground only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    /// Present (and true) when `stdout` was cut: a collected answer holds at most 16 MiB of
    /// JSON-encoded text per stream (a control character counts 6 bytes, as `\u0000`), less when
    /// other requests hold the server's budget for collected output. The process ran to its end
    /// regardless; stream the output (NDJSON or SSE) to get all of it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stdout_truncated: bool,
    /// Standard error (lossy UTF-8), foreground only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// Present (and true) when `stderr` was cut (see `stdout_truncated`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub stderr_truncated: bool,
    /// How it ended, foreground only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitInfo>,
}

/// The command of a process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProcessCommand {
    /// Run without a shell.
    Argv {
        /// Program and arguments.
        argv: Vec<String>,
    },
    /// Run with `/bin/sh -c`.
    Shell {
        /// The command line.
        script: String,
    },
}

/// A process started through the API (running, or finished and still remembered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessInfo {
    /// Pid inside the sandbox.
    pub pid: u32,
    /// The caller's tag.
    #[serde(default)]
    pub tag: Option<String>,
    /// What runs.
    pub command: ProcessCommand,
    /// Runs under a PTY.
    pub pty: bool,
    /// Start time (RFC 3339).
    pub started_at: String,
    /// Still running.
    pub running: bool,
    /// How it ended, once it has.
    #[serde(default)]
    pub exit: Option<ExitInfo>,
}

/// `GET .../processes/{pid}/output` query: replay from these offsets, then follow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AttachQuery {
    /// First stdout (or pty) byte to replay (default 0; the oldest kept byte if that is gone).
    #[serde(default)]
    pub stdout_from: u64,
    /// First stderr byte to replay.
    #[serde(default)]
    pub stderr_from: u64,
    /// Keep streaming until the process exits (default true); `false` returns what is buffered.
    #[serde(default)]
    pub follow: Option<bool>,
}

/// `POST .../processes/{pid}/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// Signal name (`TERM`, `SIGINT`, ...) or number.
    #[schema(value_type = String, example = "TERM")]
    pub signal: serde_json::Value,
}

/// `POST .../processes/{pid}/kill`: signal the process and all its descendants.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KillRequest {
    /// Signal name or number (default `KILL`).
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "KILL")]
    pub signal: Option<serde_json::Value>,
}

/// For `skip_serializing_if`: a flag that is off is left out.
fn is_false(b: &bool) -> bool {
    !*b
}
