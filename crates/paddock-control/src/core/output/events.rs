//! Agent events in their REST wire form: output chunks (text, or base64 when not UTF-8), exits, and
//! the event a stream ends with when its sandbox goes away.

use paddock_protocol::{ExitStatus, Stream};
use paddock_types::api::{ErrorCode, ExecEvent, ExitInfo, StreamData};

/// The bytes of a [`StreamData`] (decoding `data_b64` when that is how they came).
pub fn stream_bytes(data: &StreamData) -> Vec<u8> {
    use base64::Engine as _;
    match (&data.data, &data.data_b64) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "exec output with invalid base64; dropped");
                Vec::new()
            }),
        (None, None) => Vec::new(),
    }
}

/// Output bytes as a [`StreamData`]: text when valid UTF-8, base64 otherwise.
pub(crate) fn stream_data(offset: u64, data: &[u8]) -> StreamData {
    use base64::Engine as _;
    match std::str::from_utf8(data) {
        Ok(text) => StreamData {
            offset,
            data: Some(text.to_owned()),
            data_b64: None,
        },
        Err(_) => StreamData {
            offset,
            data: None,
            data_b64: Some(base64::engine::general_purpose::STANDARD.encode(data)),
        },
    }
}

pub(crate) fn output_event(stream: Stream, offset: u64, data: &[u8]) -> ExecEvent {
    let d = stream_data(offset, data);
    match stream {
        Stream::Stdout => ExecEvent::Stdout(d),
        Stream::Stderr => ExecEvent::Stderr(d),
        Stream::Pty => ExecEvent::Pty(d),
    }
}

/// The last event of a stream whose sandbox ended before the process did.
pub(crate) fn sandbox_ended_event() -> ExecEvent {
    ExecEvent::Error {
        code: ErrorCode::SandboxNotRunning,
        message: "the sandbox ended before the process did".into(),
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
    fn output_is_text_when_it_can_be_and_base64_otherwise() {
        let text = stream_data(5, b"hello\n");
        assert_eq!(text.data.as_deref(), Some("hello\n"));
        assert!(text.data_b64.is_none());
        let binary = stream_data(0, &[0xff, 0x00, 0xfe]);
        assert!(binary.data.is_none());
        assert_eq!(stream_bytes(&binary), vec![0xff, 0x00, 0xfe]);
        assert_eq!(stream_bytes(&text), b"hello\n");
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
    }
}
