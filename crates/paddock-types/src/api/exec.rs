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
    /// The approval this request runs under, when its approval policy says `ask`: the id an
    /// earlier `approval_pending` answer named, once a person approved it. The request must be the
    /// same as the one approved (its other fields hash the same); an approval runs it once.
    #[serde(default)]
    pub approval_id: Option<String>,
    /// When the policy says `ask`: how long to wait for a person before answering
    /// `approval_pending` (milliseconds; default and cap: the server's `[approvals] wait`).
    /// Nothing runs while it waits; a caller that goes away leaves the approval pending.
    #[serde(default)]
    pub approval_wait_ms: Option<u64>,
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

/// Why a [`StreamData`] carries no bytes a client can trust. Not dropped silently: output a client
/// cannot decode is a broken server or a broken line, and writing nothing (or the base64 text
/// itself) in its place would hand the caller bytes the process never wrote.
#[derive(Debug, thiserror::Error)]
pub enum StreamDataError {
    /// `data_b64` is not standard base64.
    #[error("output at offset {offset} has invalid base64 in data_b64")]
    DecodeBase64 {
        /// The chunk's offset.
        offset: u64,
        /// What the decoder found.
        #[source]
        source: base64::DecodeError,
    },
    /// Both `data` and `data_b64`, or neither: exactly one must be present.
    #[error("output at offset {offset} has {found}; exactly one of data and data_b64 must be present")]
    NotExactlyOne {
        /// The chunk's offset.
        offset: u64,
        /// `"both"` or `"neither"`.
        found: &'static str,
    },
}

impl StreamData {
    /// Output bytes starting at `offset` in their wire form: text when they are valid UTF-8,
    /// standard base64 otherwise. The one encoder; [`StreamData::bytes`] is the one decoder.
    pub fn from_bytes(offset: u64, bytes: &[u8]) -> Self {
        use base64::Engine as _;
        match std::str::from_utf8(bytes) {
            Ok(text) => Self {
                offset,
                data: Some(text.to_owned()),
                data_b64: None,
            },
            Err(_) => Self {
                offset,
                data: None,
                data_b64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            },
        }
    }

    /// The bytes this chunk carries: `data`'s text, or `data_b64` decoded. Invalid base64, or both
    /// fields or neither, is an error (see [`StreamDataError`]).
    pub fn bytes(&self) -> Result<Vec<u8>, StreamDataError> {
        use base64::Engine as _;
        match (&self.data, &self.data_b64) {
            (Some(text), None) => Ok(text.as_bytes().to_vec()),
            (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|source| StreamDataError::DecodeBase64 {
                    offset: self.offset,
                    source,
                }),
            (Some(_), Some(_)) => Err(StreamDataError::NotExactlyOne {
                offset: self.offset,
                found: "both",
            }),
            (None, None) => Err(StreamDataError::NotExactlyOne {
                offset: self.offset,
                found: "neither",
            }),
        }
    }
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn output_is_text_when_it_can_be_and_base64_otherwise() {
        let text = StreamData::from_bytes(5, b"hello\n");
        assert_eq!(text.offset, 5);
        assert_eq!(text.data.as_deref(), Some("hello\n"));
        assert!(text.data_b64.is_none());
        assert_eq!(text.bytes().expect("decodes"), b"hello\n");
        let binary = StreamData::from_bytes(0, &[0xff, 0x00, 0xfe]);
        assert!(binary.data.is_none());
        assert_eq!(binary.data_b64.as_deref(), Some("/wD+"));
        assert_eq!(binary.bytes().expect("decodes"), [0xff, 0x00, 0xfe]);
        // Empty output is text (an empty string), not neither field.
        let empty = StreamData::from_bytes(9, b"");
        assert_eq!(empty.data.as_deref(), Some(""));
        assert_eq!(empty.bytes().expect("decodes"), b"");
    }

    #[test]
    fn the_wire_form_is_unchanged() {
        let json = |d: &StreamData| serde_json::to_string(d).expect("serializes");
        assert_eq!(
            json(&StreamData::from_bytes(3, b"a\nb")),
            r#"{"offset":3,"data":"a\nb"}"#
        );
        assert_eq!(
            json(&StreamData::from_bytes(0, b"\xff\x00")),
            r#"{"offset":0,"data_b64":"/wA="}"#
        );
    }

    #[test]
    fn undecodable_output_is_an_error() {
        let chunk = |data: Option<&str>, data_b64: Option<&str>| StreamData {
            offset: 7,
            data: data.map(str::to_owned),
            data_b64: data_b64.map(str::to_owned),
        };
        for bad in ["!!", "/wA", "/w=A", "G1sySg"] {
            let e = chunk(None, Some(bad)).bytes().expect_err(bad);
            assert!(
                matches!(e, StreamDataError::DecodeBase64 { offset: 7, .. }),
                "{bad}: {e}"
            );
        }
        let both = chunk(Some("x"), Some("eA==")).bytes().expect_err("both");
        assert!(
            matches!(both, StreamDataError::NotExactlyOne { found: "both", .. }),
            "{both}"
        );
        let neither = chunk(None, None).bytes().expect_err("neither");
        assert_eq!(
            neither.to_string(),
            "output at offset 7 has neither; exactly one of data and data_b64 must be present"
        );
    }

    proptest! {
        #[test]
        fn any_bytes_round_trip(bytes in proptest::collection::vec(any::<u8>(), 0..512), offset in any::<u64>()) {
            let d = StreamData::from_bytes(offset, &bytes);
            prop_assert_eq!(d.offset, offset);
            prop_assert!(d.data.is_some() != d.data_b64.is_some(), "exactly one field");
            prop_assert_eq!(d.data.is_some(), std::str::from_utf8(&bytes).is_ok());
            prop_assert_eq!(d.bytes().expect("decodes"), bytes.clone());
            // Through JSON too, as a client receives it.
            let back: StreamData = serde_json::from_str(&serde_json::to_string(&d).expect("serializes"))
                .expect("parses");
            prop_assert_eq!(back.bytes().expect("decodes"), bytes);
        }

        #[test]
        fn any_text_round_trips_as_text(text in ".{0,64}") {
            let d = StreamData::from_bytes(0, text.as_bytes());
            prop_assert_eq!(d.data.as_deref(), Some(text.as_str()));
            prop_assert_eq!(d.bytes().expect("decodes"), text.into_bytes());
        }
    }
}
