//! What a process's stream yields ([`ExecOutput`]): its start, its output as the bytes the agent sent
//! (never text or base64: each front-end makes its own wire form, once), its exit, or the error a
//! stream ends with when its sandbox goes away.

use bytes::Bytes;
use paddock_protocol::ExitStatus;
use paddock_types::api::{ErrorCode, ExitInfo};

/// One item of a process's stream, in order: `Started`, output, then `Exit` or `Error` (nothing
/// follows either, see [`ExecOutput::is_last`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecOutput {
    /// The process started (always first).
    Started {
        /// Its pid inside the sandbox.
        pid: u32,
    },
    /// Bytes the process wrote.
    Output {
        /// Which of its streams.
        stream: OutputStream,
        /// Offset of the first byte in that stream (for re-attach).
        offset: u64,
        /// The bytes, as the agent sent them.
        data: Bytes,
    },
    /// The process ended (after all its output).
    Exit(ExitInfo),
    /// The stream broke off (the sandbox ended before the process did).
    Error {
        /// Stable code.
        code: ErrorCode,
        /// Explanation.
        message: String,
    },
}

impl ExecOutput {
    /// Whether nothing follows this item (the process ended, or the stream broke off).
    pub fn is_last(&self) -> bool {
        matches!(self, Self::Exit(_) | Self::Error { .. })
    }

    /// Output of `stream` as the agent reported it.
    pub(crate) fn output(stream: paddock_protocol::Stream, offset: u64, data: Vec<u8>) -> Self {
        Self::Output {
            stream: stream.into(),
            offset,
            data: data.into(),
        }
    }

    /// The last item of a stream whose sandbox ended before the process did.
    pub(crate) fn sandbox_ended() -> Self {
        Self::Error {
            code: ErrorCode::SandboxNotRunning,
            message: "the sandbox ended before the process did".into(),
        }
    }
}

/// Which stream of a process output comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// The terminal of a PTY process (stdout and stderr together; its offsets count as stdout's).
    Pty,
}

impl From<paddock_protocol::Stream> for OutputStream {
    fn from(stream: paddock_protocol::Stream) -> Self {
        match stream {
            paddock_protocol::Stream::Stdout => Self::Stdout,
            paddock_protocol::Stream::Stderr => Self::Stderr,
            paddock_protocol::Stream::Pty => Self::Pty,
        }
    }
}

pub(crate) fn exit_info(s: &ExitStatus) -> ExitInfo {
    ExitInfo {
        exit_code: s.shell_code(),
        signal: s.signal,
        timed_out: s.timed_out,
        duration_ms: s.duration_ms,
        cpu_time_us: s.cpu_time_us,
        max_rss_kib: s.max_rss_kib,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_keeps_the_agents_bytes() {
        let out = ExecOutput::output(paddock_protocol::Stream::Stderr, 5, vec![0xff, 0x00]);
        assert_eq!(
            out,
            ExecOutput::Output {
                stream: OutputStream::Stderr,
                offset: 5,
                data: Bytes::from_static(&[0xff, 0x00]),
            }
        );
        assert!(!out.is_last());
        assert!(ExecOutput::sandbox_ended().is_last());
        assert!(!ExecOutput::Started { pid: 1 }.is_last());
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        let status = ExitStatus {
            code: None,
            signal: Some(9),
            timed_out: true,
            cpu_time_us: 1,
            max_rss_kib: 2,
            duration_ms: 3,
        };
        let info = exit_info(&status);
        assert_eq!(info.exit_code, 137);
        assert!(info.timed_out);
        assert!(ExecOutput::Exit(info).is_last());
    }
}
