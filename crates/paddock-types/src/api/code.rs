//! Code contexts and cells: `POST /v1/sandboxes/{id}/code`, `/v1/sandboxes/{id}/contexts`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContextRequest {
    /// `python` (the default) or `bash`.
    #[serde(default)]
    pub language: Option<String>,
    /// The kernel's working directory (default: the sandbox's working directory, else the user's
    /// home).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment of the kernel (on top of the sandbox's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A code context: a kernel with its own state (variables, imports), in one language.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ContextInfo {
    /// Its id (`python`, `bash`: the default context of that language).
    pub id: String,
    /// Its language.
    pub language: String,
    /// The kernel's working directory, as requested (`null`: the default).
    pub cwd: Option<String>,
    /// The language's version the kernel reported.
    pub language_version: String,
    /// `ready`, or `dead` (its kernel died: restart it).
    pub state: ContextState,
    /// The kernel's process in the sandbox (also in `GET .../processes`, tag `kernel`).
    pub pid: u32,
}

/// A context's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ContextState {
    /// Its kernel runs.
    Ready,
    /// Its kernel died (or was killed); `POST .../restart` starts a new one.
    Dead,
}

/// `GET /v1/sandboxes/{id}/contexts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ContextList {
    /// Oldest first.
    pub contexts: Vec<ContextInfo>,
}

/// `POST /v1/sandboxes/{id}/code`: one cell.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeRequest {
    /// The code.
    pub code: String,
    /// Run in the default context of this language (`python` when neither this nor `context` is
    /// given); the context is created at the first use.
    #[serde(default)]
    pub language: Option<String>,
    /// Run in this context (exclusive with `language`).
    #[serde(default)]
    pub context: Option<String>,
    /// Interrupt the cell after this many milliseconds (it ends `timed_out`; the context lives).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Environment variables for this cell only: set in the kernel just before it and restored
    /// just after it (also when it fails or times out). Names are letters, digits and `_`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// One event of a cell, streamed (NDJSON, one per line, or SSE).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    /// The cell was queued on its context.
    Started {
        /// The context.
        context: String,
        /// Its language.
        language: String,
    },
    /// The cell's execution count.
    ExecutionCount {
        /// The count.
        execution_count: u32,
    },
    /// Text written to stdout.
    Stdout {
        /// The text.
        text: String,
    },
    /// Text written to stderr.
    Stderr {
        /// The text.
        text: String,
    },
    /// A result (the cell's value) or a display (a figure, a table).
    Result(Box<CodeResult>),
    /// The cell raised.
    Error(CodeError),
    /// The cell ended; nothing follows.
    End {
        /// How.
        status: CodeStatus,
        /// Output bytes dropped beyond the per-cell bound.
        #[serde(default)]
        dropped_bytes: u64,
    },
    /// The service failed mid-stream (the connection to the sandbox broke); nothing follows.
    Failed {
        /// A stable error code.
        code: super::ErrorCode,
        /// What happened.
        message: String,
    },
}

/// A result's representations, by MIME type (`text/plain` → `text`, `text/html` → `html`,
/// `image/png` → `png` in base64, ...; other types in `extra`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeResult {
    /// The cell's value (`execute_result`), not a display (`display_data`).
    pub is_main_result: bool,
    /// `text/plain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// `text/html` (a pandas DataFrame's table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// `text/markdown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub markdown: Option<String>,
    /// `image/svg+xml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub svg: Option<String>,
    /// `image/png`, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub png: Option<String>,
    /// `image/jpeg`, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jpeg: Option<String>,
    /// `application/pdf`, base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pdf: Option<String>,
    /// `text/latex`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latex: Option<String>,
    /// `application/json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub json: Option<serde_json::Value>,
    /// `application/javascript`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub javascript: Option<String>,
    /// A matplotlib figure's data (`application/vnd.paddock.chart+json`): its `type` (`line`,
    /// `scatter`, `bar`, `pie`, or `superchart` for several axes), `title`, axes labels, ticks and
    /// scales, and `elements` (points, bars or slices), in the shapes E2B's SDK reads as `chart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub chart: Option<serde_json::Value>,
    /// Other MIME types.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = Object)]
    pub extra: BTreeMap<String, serde_json::Value>,
    /// MIME types left out because the result was too large.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<String>,
}

/// An exception a cell raised.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CodeError {
    /// Its name (`ZeroDivisionError`).
    pub name: String,
    /// Its value (`division by zero`).
    pub value: String,
    /// The traceback, lines joined with newlines (ANSI colour codes as the kernel sent them).
    pub traceback: String,
}

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CodeStatus {
    /// It ran to the end.
    Ok,
    /// It raised.
    Error,
    /// It ran past `timeout_ms` and was interrupted; the context lives.
    TimedOut,
    /// It was interrupted; the context lives.
    Interrupted,
    /// The context's kernel died; restart the context.
    KernelDied,
}

/// A cell answered as one JSON document (`Accept: application/json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CodeRunResult {
    /// The context it ran in.
    pub context: String,
    /// Its execution count.
    pub execution_count: Option<u32>,
    /// Stdout pieces, in order.
    pub stdout: Vec<String>,
    /// Stderr pieces, in order.
    pub stderr: Vec<String>,
    /// Results and displays, in order.
    pub results: Vec<CodeResult>,
    /// The exception, if it raised.
    pub error: Option<CodeError>,
    /// How it ended.
    pub status: CodeStatus,
    /// Output bytes dropped (beyond the per-cell bound, or the collected document's).
    pub dropped_bytes: u64,
}
