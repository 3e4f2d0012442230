//! One API connection's clock: whether a request is in flight, when the connection last became
//! ready for a request, when the first byte of the next head arrived; and from that, when the
//! connection must be closed ([`ConnState::deadline`], a pure function).
//!
//! "Idle" is the keep-alive sense: no request in flight. A response being streamed is in flight until
//! its body is finished or dropped, however long it stays quiet, so NDJSON and SSE streams are never
//! cut for idleness; a request whose body stalls is the body timeout's business
//! ([`IdleTimeoutBody`]), which also notes whether the body was read to its end ([`BodyEnd`]): an
//! error answered before that says `Connection: close` ([`must_close`]). Nothing here applies to a
//! connection once it is upgraded to a WebSocket.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

/// The two timeouts a connection's clock applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnTimeouts {
    /// From the first byte of a request head to the whole head.
    pub(crate) header_read: Duration,
    /// With no request in flight and no byte of a new one.
    pub(crate) idle: Duration,
}

/// Why a connection's deadline is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// A request head started arriving and is not complete.
    HeaderRead,
    /// Nothing in flight, nothing arriving.
    Idle,
}

/// What the clock knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnState {
    /// Requests whose response is not finished (0 or 1 on HTTP/1.1).
    pub(crate) in_flight: u32,
    /// When the connection was accepted, or its last response finished.
    pub(crate) ready_since: Instant,
    /// When the first byte arrived after `ready_since` (the next request's head is coming).
    pub(crate) head_started: Option<Instant>,
}

impl ConnState {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            in_flight: 0,
            ready_since: now,
            head_started: None,
        }
    }

    /// When the connection must be closed if nothing changes; `None` while a request is in flight.
    pub(crate) fn deadline(&self, t: ConnTimeouts) -> Option<(Instant, Expiry)> {
        if self.in_flight > 0 {
            return None;
        }
        Some(match self.head_started {
            Some(first_byte) => (first_byte + t.header_read, Expiry::HeaderRead),
            None => (self.ready_since + t.idle, Expiry::Idle),
        })
    }

    /// Bytes arrived.
    pub(crate) fn on_read(&mut self, now: Instant) -> bool {
        if self.in_flight == 0 && self.head_started.is_none() {
            self.head_started = Some(now);
            return true;
        }
        false
    }

    /// A request head was parsed and handed to the router.
    pub(crate) fn on_request(&mut self) {
        self.in_flight += 1;
        self.head_started = None;
    }

    /// A response finished (or was dropped).
    pub(crate) fn on_response_done(&mut self, now: Instant) -> bool {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight == 0 {
            // Bytes of a pipelined next request read meanwhile are not tracked: the idle timeout
            // then bounds it instead of the header timeout.
            self.ready_since = now;
            self.head_started = None;
            return true;
        }
        false
    }
}

/// A connection's clock, shared by its reader, its service and its watchdog.
#[derive(Debug)]
pub(crate) struct ConnClock {
    state: Mutex<ConnState>,
    /// Wakes the watchdog when the deadline may have moved earlier.
    changed: Notify,
}

impl ConnClock {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(ConnState::new(Instant::now())),
            changed: Notify::new(),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut ConnState) -> T) -> T {
        // Each critical section is a few assignments; a panic cannot leave it half-done.
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub(crate) fn deadline(&self, t: ConnTimeouts) -> Option<(Instant, Expiry)> {
        self.with(|s| s.deadline(t))
    }

    /// Resolves when the state changed in a way that may bring the deadline forward.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }

    fn on_read(&self) {
        if self.with(|s| s.on_read(Instant::now())) {
            self.changed.notify_one();
        }
    }

    /// A request started: returns the guard that ends it when dropped.
    pub(crate) fn begin_request(self: &Arc<Self>) -> InFlight {
        self.with(ConnState::on_request);
        InFlight { clock: self.clone() }
    }
}

/// A request in flight; dropping it (with the response body) marks the connection ready again.
#[derive(Debug)]
pub(crate) struct InFlight {
    clock: Arc<ConnClock>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.clock.with(|s| s.on_response_done(Instant::now())) {
            self.clock.changed.notify_one();
        }
    }
}

/// A response body that holds its request's [`InFlight`] until it is finished or dropped.
pub(crate) struct TrackedBody {
    body: Body,
    _in_flight: InFlight,
}

impl TrackedBody {
    pub(crate) fn new(body: Body, in_flight: InFlight) -> Self {
        Self {
            body,
            _in_flight: in_flight,
        }
    }
}

impl hyper::body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The request body failed to send anything for the configured time.
#[derive(Debug)]
pub(crate) struct BodyStalled(Duration);

impl std::fmt::Display for BodyStalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request body sent nothing for {:?}", self.0)
    }
}

impl std::error::Error for BodyStalled {}

/// A request body that fails when the client sends nothing for `timeout` while the handler waits.
/// The clock runs only while the handler is polling and no data is there: a handler busy elsewhere
/// (writing to a sandbox that applies backpressure) does not count against the client.
/// It also notes when the body reaches its end ([`BodyEnd`]).
pub(crate) struct IdleTimeoutBody {
    inner: hyper::body::Incoming,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    end: BodyEnd,
}

impl IdleTimeoutBody {
    /// The body, and the flag that says whether it has been read to its end.
    pub(crate) fn new(inner: hyper::body::Incoming, timeout: Duration) -> (Self, BodyEnd) {
        let end = BodyEnd::default();
        if hyper::body::Body::is_end_stream(&inner) {
            end.mark();
        }
        let body = Self {
            inner,
            timeout,
            sleep: None,
            end: end.clone(),
        };
        (body, end)
    }
}

/// Whether a request body was read to its end. A response given before that (a refusal that did
/// not read an upload) must say `Connection: close`: hyper will not read the rest either, so it
/// closes the connection after the response, and a client must not send its next request there.
#[derive(Debug, Clone, Default)]
pub(crate) struct BodyEnd(Arc<std::sync::atomic::AtomicBool>);

impl BodyEnd {
    fn mark(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn reached(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Whether a response must carry `Connection: close`: an error answered before its request's body
/// was read to the end.
pub(crate) fn must_close(status: hyper::StatusCode, body_read: bool) -> bool {
    !body_read && (status.is_client_error() || status.is_server_error())
}

impl hyper::body::Body for IdleTimeoutBody {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.sleep = None;
                if frame.is_none() || hyper::body::Body::is_end_stream(&this.inner) {
                    this.end.mark();
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyStalled(timeout))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's byte stream: plain TCP, or TLS over it.
pub(crate) enum Stream {
    /// Plain HTTP.
    Plain(tokio::net::TcpStream),
    /// HTTPS (boxed: a TLS session is large).
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

macro_rules! on_stream {
    ($self:expr, $s:ident => $e:expr) => {
        match &mut $self.tcp {
            Stream::Plain($s) => $e,
            Stream::Tls($s) => $e,
        }
    };
}

/// How long a connection the server closes still reads (and discards) what its client sends.
pub(crate) const LINGER: Duration = Duration::from_secs(2);
/// The most bytes a closing connection reads and discards.
pub(crate) const LINGER_BYTES: u64 = 64 << 20;

/// A connection's stream that tells its clock when bytes arrive, and closes lingering: after its
/// side is shut down it reads and discards what the client still sends (until the client's end,
/// [`LINGER`] or [`LINGER_BYTES`]), because closing a socket with unread bytes makes the kernel
/// reset the connection, and a client still sending a request body (answered early: a refusal
/// before the body is read) would then lose the response it was sent (RFC 9112 §9.6).
pub(crate) struct ClockedIo {
    tcp: Stream,
    clock: Arc<ConnClock>,
    linger: Option<Linger>,
}

/// A closing connection's drain.
struct Linger {
    until: Pin<Box<Sleep>>,
    left: u64,
}

impl ClockedIo {
    pub(crate) fn new(tcp: Stream, clock: Arc<ConnClock>) -> Self {
        Self {
            tcp,
            clock,
            linger: None,
        }
    }
}

impl AsyncRead for ClockedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = on_stream!(self, s => Pin::new(s).poll_read(cx, buf));
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.on_read();
        }
        polled
    }
}

impl AsyncWrite for ClockedIo {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        on_stream!(self, s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        on_stream!(self, s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match &self.tcp {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        on_stream!(self, s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.linger.is_none() {
            match on_stream!(self, s => Pin::new(s).poll_shutdown(cx)) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
            self.linger = Some(Linger {
                until: Box::pin(tokio::time::sleep(LINGER)),
                left: LINGER_BYTES,
            });
        }
        let this = &mut *self;
        let Some(linger) = this.linger.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        if linger.until.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ok(()));
        }
        let mut scratch = [0u8; 16 * 1024];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            let polled = match &mut this.tcp {
                Stream::Plain(s) => Pin::new(s).poll_read(cx, &mut buf),
                Stream::Tls(s) => Pin::new(s).poll_read(cx, &mut buf),
            };
            match polled {
                Poll::Pending => return Poll::Pending,
                // The client's end, or an error: nothing more to wait for.
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    linger.left = linger.left.saturating_sub(buf.filled().len() as u64);
                    if linger.left == 0 {
                        return Poll::Ready(Ok(()));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: ConnTimeouts = ConnTimeouts {
        header_read: Duration::from_secs(10),
        idle: Duration::from_secs(60),
    };

    #[test]
    fn a_fresh_connection_is_idle_until_bytes_arrive() {
        let t0 = Instant::now();
        let mut s = ConnState::new(t0);
        assert_eq!(s.deadline(T), Some((t0 + T.idle, Expiry::Idle)));
        let t1 = t0 + Duration::from_secs(3);
        assert!(s.on_read(t1), "the first byte moves the deadline");
        assert_eq!(s.deadline(T), Some((t1 + T.header_read, Expiry::HeaderRead)));
        // More bytes of the same head do not extend it: a head dribbled byte by byte still ends.
        assert!(!s.on_read(t1 + Duration::from_secs(9)));
        assert_eq!(s.deadline(T), Some((t1 + T.header_read, Expiry::HeaderRead)));
    }

    #[test]
    fn a_request_in_flight_has_no_deadline_however_quiet() {
        let t0 = Instant::now();
        let mut s = ConnState::new(t0);
        s.on_read(t0);
        s.on_request();
        assert_eq!(s.deadline(T), None);
        // Request body bytes (or pipelined ones) while in flight change nothing.
        assert!(!s.on_read(t0 + Duration::from_secs(500)));
        assert_eq!(s.deadline(T), None);
        let done = t0 + Duration::from_secs(3600);
        assert!(s.on_response_done(done));
        assert_eq!(s.deadline(T), Some((done + T.idle, Expiry::Idle)));
    }

    #[test]
    fn keep_alive_cycles() {
        let t0 = Instant::now();
        let mut s = ConnState::new(t0);
        for i in 1..5u64 {
            let at = t0 + Duration::from_secs(i * 100);
            s.on_read(at);
            s.on_request();
            assert!(s.on_response_done(at + Duration::from_secs(1)));
            assert_eq!(
                s.deadline(T),
                Some((at + Duration::from_secs(1) + T.idle, Expiry::Idle))
            );
        }
        // A stray end never underflows.
        assert!(s.on_response_done(t0));
        assert_eq!(s.in_flight, 0);
    }
}
