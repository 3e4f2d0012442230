//! Streaming responses of events (process output, directory changes) as NDJSON or Server-Sent Events.
//!
//! The body pulls one event from its source each time hyper asks for the next chunk, so a slow client
//! slows the source (whose channel is bounded) instead of growing a buffer here, and every event is
//! sent as soon as it is produced. When the client goes away hyper drops the body, which drops the
//! source: for a foreground process that is how the service learns to kill it.

use std::future::Future;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use paddock_control::{ExecOutput, ExecStream, OutputStream, WatchStream};
use paddock_types::api::{ApprovalEvent, CodeEvent, ExecEvent, StreamData, WatchEvent, WatchEventKind};
use serde::Serialize;

use crate::negotiate::StreamFormat;

/// How often an idle SSE stream sends a comment, so proxies keep it open and a vanished client is
/// noticed by the failed write.
const SSE_KEEPALIVE: Duration = Duration::from_secs(15);

/// Something that yields events until it ends. `next_event` must be cancel-safe (an event is never
/// lost when its future is dropped), because an SSE stream races it against the keep-alive timer.
pub(crate) trait EventSource: Send + 'static {
    /// The events.
    type Event: StreamEvent;

    /// The next event; `None` once the source is exhausted.
    fn next_event(&mut self) -> impl Future<Output = Option<Self::Event>> + Send;
}

/// An event that can be framed.
pub(crate) trait StreamEvent: Serialize + Send + 'static {
    /// The SSE `event:` name.
    fn sse_name(&self) -> &'static str;

    /// Whether nothing follows this event (the stream ends after sending it).
    fn is_last(&self) -> bool;
}

impl EventSource for ExecStream {
    type Event = ExecEvent;

    // Cancel-safe as `recv` is: the conversion happens after the only await.
    async fn next_event(&mut self) -> Option<ExecEvent> {
        self.recv().await.map(exec_event)
    }
}

/// A process's stream item in its REST wire form, the one conversion for NDJSON, SSE and the
/// WebSocket: output bytes become [`StreamData`] (text when valid UTF-8, base64 otherwise).
pub(crate) fn exec_event(output: ExecOutput) -> ExecEvent {
    match output {
        ExecOutput::Started { pid } => ExecEvent::Started { pid },
        ExecOutput::Output { stream, offset, data } => {
            let data = StreamData::from_bytes(offset, &data);
            match stream {
                OutputStream::Stdout => ExecEvent::Stdout(data),
                OutputStream::Stderr => ExecEvent::Stderr(data),
                OutputStream::Pty => ExecEvent::Pty(data),
            }
        }
        ExecOutput::Exit(info) => ExecEvent::Exit(info),
        ExecOutput::Error { code, message } => ExecEvent::Error { code, message },
    }
}

impl EventSource for paddock_control::ApprovalStream {
    type Event = ApprovalEvent;

    // Cancel-safe: the only await is a channel receive.
    fn next_event(&mut self) -> impl Future<Output = Option<ApprovalEvent>> + Send {
        self.recv()
    }
}

impl StreamEvent for ApprovalEvent {
    fn sse_name(&self) -> &'static str {
        match self.event.as_str() {
            "requested" => "requested",
            "approved" => "approved",
            "rejected" => "rejected",
            "expired" => "expired",
            "used" => "used",
            _ => "changed",
        }
    }

    fn is_last(&self) -> bool {
        false
    }
}

impl EventSource for WatchStream {
    type Event = WatchEvent;

    fn next_event(&mut self) -> impl Future<Output = Option<WatchEvent>> + Send {
        self.recv()
    }
}

impl StreamEvent for ExecEvent {
    fn sse_name(&self) -> &'static str {
        match self {
            Self::Started { .. } => "started",
            Self::Stdout(_) => "stdout",
            Self::Stderr(_) => "stderr",
            Self::Pty(_) => "pty",
            Self::Exit(_) => "exit",
            Self::Error { .. } => "error",
        }
    }

    fn is_last(&self) -> bool {
        matches!(self, Self::Exit(_) | Self::Error { .. })
    }
}

impl EventSource for paddock_control::CodeStream {
    type Event = CodeEvent;

    // Cancel-safe: the only await is a channel receive.
    fn next_event(&mut self) -> impl Future<Output = Option<CodeEvent>> + Send {
        self.recv()
    }
}

impl StreamEvent for CodeEvent {
    fn sse_name(&self) -> &'static str {
        match self {
            Self::Started { .. } => "started",
            Self::ExecutionCount { .. } => "execution_count",
            Self::Stdout { .. } => "stdout",
            Self::Stderr { .. } => "stderr",
            Self::Result(_) => "result",
            Self::Error(_) => "error",
            Self::End { .. } => "end",
            Self::Failed { .. } => "failed",
        }
    }

    fn is_last(&self) -> bool {
        matches!(self, Self::End { .. } | Self::Failed { .. })
    }
}

impl StreamEvent for WatchEvent {
    fn sse_name(&self) -> &'static str {
        match self.kind {
            WatchEventKind::Create => "create",
            WatchEventKind::Modify => "modify",
            WatchEventKind::Remove => "remove",
            WatchEventKind::RenameFrom => "rename_from",
            WatchEventKind::RenameTo => "rename_to",
            WatchEventKind::Attrib => "attrib",
            WatchEventKind::Overflow => "overflow",
            WatchEventKind::Ended => "ended",
        }
    }

    fn is_last(&self) -> bool {
        self.kind == WatchEventKind::Ended
    }
}

/// One NDJSON line: the event's JSON and `\n`.
pub(crate) fn ndjson_line<E: Serialize>(event: &E) -> Option<Bytes> {
    let mut line = to_json(event)?;
    line.push(b'\n');
    Some(line.into())
}

/// One SSE event: `event: <name>\ndata: <json>\n\n`. Compact JSON has no line breaks (those inside
/// strings are escaped), so one `data:` line carries it whole.
pub(crate) fn sse_frame<E: StreamEvent>(event: &E) -> Option<Bytes> {
    let json = to_json(event)?;
    let mut frame = Vec::with_capacity(json.len() + 32);
    frame.extend_from_slice(b"event: ");
    frame.extend_from_slice(event.sse_name().as_bytes());
    frame.extend_from_slice(b"\ndata: ");
    frame.extend_from_slice(&json);
    frame.extend_from_slice(b"\n\n");
    Some(frame.into())
}

fn to_json<E: Serialize>(event: &E) -> Option<Vec<u8>> {
    serde_json::to_vec(event)
        .inspect_err(|e| tracing::error!(error = %e, "failed to serialize a stream event; skipped"))
        .ok()
}

/// A `200` response streaming `source`'s events in `format` (NDJSON or SSE; `Json` is answered by the
/// caller, which collects first).
pub(crate) fn event_stream_response<S: EventSource>(source: S, format: StreamFormat) -> Response {
    let sse = format == StreamFormat::Sse;
    let body = Body::from_stream(event_frames(source, sse));
    let media_type = if sse {
        StreamFormat::Sse.media_type()
    } else {
        StreamFormat::Ndjson.media_type()
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(media_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            // Tells nginx-style proxies not to buffer the stream.
            (
                header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        body,
    )
        .into_response()
}

/// The framed events of `source`, pulled one at a time; ends after the last event.
fn event_frames<S: EventSource>(
    source: S,
    sse: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send {
    futures_util::stream::unfold(Some(source), move |source| async move {
        let mut source = source?;
        loop {
            let next = if sse {
                match tokio::time::timeout(SSE_KEEPALIVE, source.next_event()).await {
                    Ok(next) => next,
                    Err(_) => return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), Some(source))),
                }
            } else {
                source.next_event().await
            };
            let event = next?;
            let frame = if sse {
                sse_frame(&event)
            } else {
                ndjson_line(&event)
            };
            let Some(frame) = frame else { continue };
            // After the last event the source is dropped at once, not when the client gets around to
            // reading the end of the body.
            let rest = (!event.is_last()).then_some(source);
            return Some((Ok(frame), rest));
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use http_body_util::BodyExt as _;
    use paddock_types::api::{ErrorCode, ExitInfo};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::sync::{mpsc, oneshot};

    use super::*;

    /// Events from a channel; reports its drop.
    struct FakeSource {
        rx: mpsc::Receiver<ExecEvent>,
        dropped: Option<oneshot::Sender<()>>,
    }

    impl EventSource for FakeSource {
        type Event = ExecEvent;

        fn next_event(&mut self) -> impl Future<Output = Option<ExecEvent>> + Send {
            self.rx.recv()
        }
    }

    impl Drop for FakeSource {
        fn drop(&mut self) {
            if let Some(tx) = self.dropped.take() {
                let _ = tx.send(());
            }
        }
    }

    fn fake(capacity: usize) -> (mpsc::Sender<ExecEvent>, FakeSource, oneshot::Receiver<()>) {
        let (tx, rx) = mpsc::channel(capacity);
        let (dropped_tx, dropped_rx) = oneshot::channel();
        (
            tx,
            FakeSource {
                rx,
                dropped: Some(dropped_tx),
            },
            dropped_rx,
        )
    }

    fn stdout(offset: u64, text: &str) -> ExecEvent {
        ExecEvent::Stdout(StreamData {
            offset,
            data: Some(text.into()),
            data_b64: None,
        })
    }

    fn exit(code: i32) -> ExecEvent {
        ExecEvent::Exit(exit_info(code))
    }

    fn exit_info(code: i32) -> ExitInfo {
        ExitInfo {
            exit_code: code,
            signal: None,
            timed_out: false,
            duration_ms: 5,
            cpu_time_us: 10,
            max_rss_kib: 1024,
        }
    }

    #[test]
    fn exec_output_in_its_wire_form() {
        let output = |stream, data: &'static [u8]| ExecOutput::Output {
            stream,
            offset: 4,
            data: Bytes::from_static(data),
        };
        let lines: Vec<String> = [
            ExecOutput::Started { pid: 2 },
            output(OutputStream::Stdout, b"a\n"),
            output(OutputStream::Stderr, b"\xff\x00"),
            output(OutputStream::Pty, b""),
            ExecOutput::Exit(exit_info(0)),
            ExecOutput::Error {
                code: ErrorCode::SandboxNotRunning,
                message: "gone".into(),
            },
        ]
        .into_iter()
        .map(|o| String::from_utf8(ndjson_line(&exec_event(o)).expect("frames").to_vec()).expect("utf-8"))
        .collect();
        assert_eq!(
            lines,
            [
                "{\"type\":\"started\",\"pid\":2}\n",
                "{\"type\":\"stdout\",\"offset\":4,\"data\":\"a\\n\"}\n",
                "{\"type\":\"stderr\",\"offset\":4,\"data_b64\":\"/wA=\"}\n",
                "{\"type\":\"pty\",\"offset\":4,\"data\":\"\"}\n",
                "{\"type\":\"exit\",\"exit_code\":0,\"signal\":null,\"timed_out\":false,\"duration_ms\":5,\"cpu_time_us\":10,\"max_rss_kib\":1024}\n",
                "{\"type\":\"error\",\"code\":\"sandbox_not_running\",\"message\":\"gone\"}\n",
            ]
        );
    }

    #[test]
    fn ndjson_framing() {
        let line = ndjson_line(&stdout(3, "a\nb")).expect("frames");
        assert_eq!(
            &line[..],
            b"{\"type\":\"stdout\",\"offset\":3,\"data\":\"a\\nb\"}\n"
        );
        let line = ndjson_line(&ExecEvent::Started { pid: 7 }).expect("frames");
        assert_eq!(&line[..], b"{\"type\":\"started\",\"pid\":7}\n");
        let back: ExecEvent = serde_json::from_slice(&line).expect("parses back");
        assert_eq!(back, ExecEvent::Started { pid: 7 });
    }

    #[test]
    fn sse_framing() {
        let frame = sse_frame(&stdout(0, "line1\nline2\r\n")).expect("frames");
        let text = std::str::from_utf8(&frame).expect("utf-8");
        assert_eq!(
            text,
            "event: stdout\ndata: {\"type\":\"stdout\",\"offset\":0,\"data\":\"line1\\nline2\\r\\n\"}\n\n"
        );
        let names: Vec<_> = [
            ExecEvent::Started { pid: 1 },
            stdout(0, ""),
            ExecEvent::Stderr(StreamData {
                offset: 0,
                data: None,
                data_b64: Some("/w==".into()),
            }),
            ExecEvent::Pty(StreamData {
                offset: 0,
                data: Some(String::new()),
                data_b64: None,
            }),
            exit(0),
            ExecEvent::Error {
                code: ErrorCode::Unavailable,
                message: "shutting down".into(),
            },
        ]
        .iter()
        .map(|e| {
            let frame = sse_frame(e).expect("frames");
            let text = String::from_utf8(frame.to_vec()).expect("utf-8");
            let json: serde_json::Value = serde_json::from_str(
                text.lines()
                    .nth(1)
                    .and_then(|l| l.strip_prefix("data: "))
                    .expect("data line"),
            )
            .expect("json");
            assert_eq!(json["type"], e.sse_name(), "event name = JSON type");
            e.sse_name()
        })
        .collect();
        assert_eq!(names, ["started", "stdout", "stderr", "pty", "exit", "error"]);
    }

    #[test]
    fn watch_event_names() {
        let e = WatchEvent {
            path: "/tmp/x".into(),
            kind: WatchEventKind::RenameFrom,
            is_dir: false,
        };
        let json = serde_json::to_value(&e).expect("json");
        assert_eq!(json["kind"], e.sse_name());
        assert!(!e.is_last());
        assert!(WatchEvent {
            kind: WatchEventKind::Ended,
            ..e
        }
        .is_last());
    }

    #[tokio::test]
    async fn ndjson_body_ends_after_exit() {
        let (tx, source, dropped) = fake(8);
        for e in [ExecEvent::Started { pid: 9 }, stdout(0, "hi\n"), exit(3)] {
            tx.send(e).await.expect("send");
        }
        // The sender stays open: the body must end on Exit, not on channel close.
        let response = event_stream_response(source, StreamFormat::Ndjson);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/x-ndjson");
        let body = response.into_body().collect().await.expect("body").to_bytes();
        let lines: Vec<ExecEvent> = body
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("each line is an event"))
            .collect();
        assert_eq!(lines, [ExecEvent::Started { pid: 9 }, stdout(0, "hi\n"), exit(3)]);
        dropped.await.expect("the source is dropped at the end");
        drop(tx);
    }

    #[tokio::test]
    async fn sse_body() {
        let (tx, source, _dropped) = fake(8);
        tx.send(ExecEvent::Started { pid: 1 }).await.expect("send");
        tx.send(exit(0)).await.expect("send");
        let response = event_stream_response(source, StreamFormat::Sse);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
        assert_eq!(response.headers()[header::CACHE_CONTROL], "no-cache");
        let body = response.into_body().collect().await.expect("body").to_bytes();
        let text = String::from_utf8(body.to_vec()).expect("utf-8");
        assert!(
            text.starts_with("event: started\ndata: {\"type\":\"started\",\"pid\":1}\n\nevent: exit\n"),
            "{text}"
        );
        assert!(text.ends_with("}\n\n"));
    }

    /// Serves `source` once on a loopback port; returns the address.
    async fn serve_once(source: FakeSource) -> std::net::SocketAddr {
        let source = Arc::new(std::sync::Mutex::new(Some(source)));
        let app = axum::Router::new().route(
            "/",
            axum::routing::get(move || {
                let source = source.lock().expect("lock").take().expect("served once");
                async move { event_stream_response(source, StreamFormat::Ndjson) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }

    async fn get_headers(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        conn.write_all(b"GET / HTTP/1.1\r\nHost: test\r\n\r\n")
            .await
            .expect("request");
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
                .await
                .expect("headers in time")
                .expect("read");
            assert!(n > 0, "connection closed before the headers");
            seen.extend_from_slice(&buf[..n]);
        }
        assert!(
            seen.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&seen)
        );
        conn
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vanished_client_drops_a_silent_source() {
        let (tx, source, dropped) = fake(1);
        tx.send(ExecEvent::Started { pid: 1 }).await.expect("send");
        let addr = serve_once(source).await;
        let conn = get_headers(addr).await;
        // The process prints nothing more; the client hangs up.
        drop(conn);
        tokio::time::timeout(Duration::from_secs(10), dropped)
            .await
            .expect("source dropped after the client left")
            .expect("dropped, not leaked");
        drop(tx);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_client_holds_back_the_source() {
        let (tx, source, dropped) = fake(1);
        let addr = serve_once(source).await;
        let produced = Arc::new(AtomicU64::new(0));
        let producer = {
            let produced = produced.clone();
            tokio::spawn(async move {
                let chunk = "x".repeat(16 * 1024);
                let mut offset = 0;
                loop {
                    if tx.send(stdout(offset, &chunk)).await.is_err() {
                        return;
                    }
                    offset += chunk.len() as u64;
                    produced.store(offset, Ordering::SeqCst);
                }
            })
        };
        let conn = get_headers(addr).await;
        // The client reads nothing: production must stall once the socket buffers are full.
        let mut last = u64::MAX;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = produced.load(Ordering::SeqCst);
            if now == last {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "production never stalled");
            last = now;
        }
        assert!(
            last < 256 * 1024 * 1024,
            "{last} bytes produced for a client that reads nothing"
        );
        drop(conn);
        tokio::time::timeout(Duration::from_secs(10), dropped)
            .await
            .expect("source dropped after the client left")
            .expect("dropped");
        tokio::time::timeout(Duration::from_secs(10), producer)
            .await
            .expect("producer sees the closed channel")
            .expect("producer task");
    }
}
