//! The API listener: accepts connections under two caps (all connections, connections per source
//! address), serves each with hyper's HTTP/1.1 connection (upgrades kept for WebSockets) under a
//! clock that closes connections whose request head is too slow or that sit idle
//! ([`conn::ConnState`]), and survives running out of descriptors: `accept` failing with EMFILE or
//! ENFILE backs off and retries, it never ends the server nor spins.
//!
//! At the connection cap the loop stops accepting, so further connections wait in the kernel's listen
//! backlog; over the per-address cap a connection is closed as soon as it is accepted. On shutdown it
//! stops accepting, asks every connection to finish its request in flight and close, and returns once
//! all have (the caller bounds the wait).
//!
//! An error answered before its request body was read to the end (a refused upload) says
//! `Connection: close`, since the connection is closed after it.
//!
//! It does not: serve HTTP/2 (the API never offered it), apply any limit to a WebSocket once upgraded,
//! or know what a request is for (the router does).

mod conn;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt as _;

use crate::serve_config::HttpSettings;
use conn::{must_close, ClockedIo, ConnClock, ConnTimeouts, Expiry, IdleTimeoutBody, Stream, TrackedBody};

/// The longest pause between two `accept` attempts while descriptors (or memory) are exhausted.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);
/// The first pause.
const MIN_ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
/// How often a persisting accept failure, or refused connections, are logged again.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` resolves and every connection has finished.
pub(crate) async fn serve_api(
    listener: TcpListener,
    app: Router,
    settings: &HttpSettings,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let limits = Arc::new(ConnLimits::from(settings));
    let slots = Arc::new(Semaphore::new(settings.max_connections as usize));
    let clients = ClientSlots::new(settings.max_connections_per_client);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut backoff = AcceptBackoff::default();
    let mut refused = EveryFew::default();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => {
                backoff.succeeded();
                a
            }
            Err(e) => {
                if let Some(pause) = backoff.failed(&e) {
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = &mut shutdown => break,
                    }
                }
                continue;
            }
        };
        let Some(client) = clients.take(peer.ip()) else {
            if let Some(n) = refused.tick() {
                tracing::warn!(
                    client = %peer.ip(),
                    refused = n,
                    limit = settings.max_connections_per_client,
                    "connections over the per-client cap closed"
                );
            }
            drop(tcp);
            continue;
        };
        let conn = Connection {
            tcp,
            tls: tls.clone(),
            peer,
            app: app.clone(),
            limits: limits.clone(),
            stop: stop_rx.clone(),
            _slot: permit,
            _client: client,
        };
        tokio::spawn(conn.serve());
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(stop_rx);
    // Every connection holds a receiver: this resolves when the last one is done.
    stop_tx.closed().await;
}

/// The per-connection limits, taken from `[http]`.
#[derive(Debug)]
struct ConnLimits {
    timeouts: ConnTimeouts,
    request_body: Duration,
    max_header_bytes: usize,
}

impl From<&HttpSettings> for ConnLimits {
    fn from(s: &HttpSettings) -> Self {
        Self {
            timeouts: ConnTimeouts {
                header_read: s.header_read_timeout,
                idle: s.idle_timeout,
            },
            request_body: s.request_body_timeout,
            max_header_bytes: usize::try_from(s.max_header_bytes.as_u64()).unwrap_or(usize::MAX),
        }
    }
}

/// One accepted connection and what it holds until it closes.
struct Connection {
    tcp: TcpStream,
    tls: Option<tokio_rustls::TlsAcceptor>,
    peer: SocketAddr,
    app: Router,
    limits: Arc<ConnLimits>,
    stop: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
    _client: ClientSlot,
}

impl Connection {
    async fn serve(mut self) {
        // Streams are written as many small chunks (one per exec event); without TCP_NODELAY, Nagle
        // holds each one back until the previous is acknowledged, and delayed ACKs make that 40 ms.
        if let Err(e) = self.tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let stream = match self.tls.take() {
            None => Stream::Plain(self.tcp),
            // The handshake is bounded like a request head: a client that opens a connection and
            // sends nothing holds it no longer.
            Some(acceptor) => {
                let handshake = acceptor.accept(self.tcp);
                match tokio::time::timeout(self.limits.timeouts.header_read, handshake).await {
                    Ok(Ok(tls)) => Stream::Tls(Box::new(tls)),
                    Ok(Err(e)) => {
                        tracing::debug!(peer = %self.peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(peer = %self.peer, "TLS handshake took too long");
                        return;
                    }
                }
            }
        };
        let clock = ConnClock::new();
        let io = TokioIo::new(ClockedIo::new(stream, clock.clone()));
        let service = {
            let clock = clock.clone();
            let app = self.app;
            let body_timeout = self.limits.request_body;
            let peer = self.peer;
            hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let in_flight = clock.begin_request();
                let (mut parts, body) = req.into_parts();
                // The client's address, for handlers that forward requests (`X-Forwarded-For`).
                parts.extensions.insert(axum::extract::ConnectInfo(peer));
                let (body, body_end) = IdleTimeoutBody::new(body, body_timeout);
                let req = hyper::Request::from_parts(parts, Body::new(body));
                let app = app.clone();
                async move {
                    let mut response = match app.oneshot(req).await {
                        Ok(r) => r,
                        Err(never) => match never {},
                    };
                    if must_close(response.status(), body_end.reached()) {
                        response.headers_mut().insert(
                            hyper::header::CONNECTION,
                            hyper::header::HeaderValue::from_static("close"),
                        );
                    }
                    Ok::<_, Infallible>(response.map(|b| TrackedBody::new(b, in_flight)))
                }
            })
        };
        let t = self.limits.timeouts;
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            // hyper's own head timer runs from the moment the connection is ready for a request, so
            // it covers idle time too: set past both of ours, it is only a backstop.
            .header_read_timeout(t.idle + t.header_read + Duration::from_secs(1))
            .max_buf_size(self.limits.max_header_bytes)
            .keep_alive(true)
            .serve_connection(io, service)
            .with_upgrades();
        tokio::pin!(conn);
        let mut stopping = false;
        loop {
            let deadline = clock.deadline(t);
            let expired = async {
                match deadline {
                    Some((at, why)) => {
                        tokio::time::sleep_until(at).await;
                        why
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                done = conn.as_mut() => {
                    if let Err(e) = done {
                        tracing::debug!(peer = %self.peer, error = %e, "API connection ended with an error");
                    }
                    return;
                }
                changed = self.stop.changed(), if !stopping => {
                    stopping = true;
                    if changed.is_ok() {
                        conn.as_mut().graceful_shutdown();
                    }
                }
                why = expired => {
                    // Re-checked: a request may have started since the deadline was read.
                    if clock.deadline(t).is_some_and(|(at, _)| at <= Instant::now()) {
                        let what = match why {
                            Expiry::HeaderRead => "its request head took too long",
                            Expiry::Idle => "it was idle",
                        };
                        tracing::debug!(peer = %self.peer, "closing an API connection: {what}");
                        return;
                    }
                }
                () = clock.changed() => {}
            }
        }
    }
}

/// Open connections per source address.
#[derive(Debug, Clone)]
struct ClientSlots {
    limit: u32,
    open: Arc<Mutex<HashMap<IpAddr, u32>>>,
}

impl ClientSlots {
    fn new(limit: u32) -> Self {
        Self {
            limit,
            open: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A slot for a connection from `ip`, or `None` when it holds `limit` already.
    fn take(&self, ip: IpAddr) -> Option<ClientSlot> {
        let ip = ip.to_canonical();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_insert(0);
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            ip,
            open: self.open.clone(),
        })
    }
}

/// One connection's place in [`ClientSlots`], given back on drop.
#[derive(Debug)]
struct ClientSlot {
    ip: IpAddr,
    open: Arc<Mutex<HashMap<IpAddr, u32>>>,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// What an `accept` error means for the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AcceptFailure {
    /// That one connection failed before it was accepted: take the next one at once.
    Connection,
    /// Descriptors or memory ran out: wait for some to be freed.
    Exhausted,
    /// Anything else: wait too (never exit, never spin).
    Other,
}

fn classify(e: &io::Error) -> AcceptFailure {
    match e.raw_os_error() {
        Some(libc::ECONNABORTED | libc::ECONNRESET | libc::ECONNREFUSED | libc::EPROTO | libc::EPERM) => {
            AcceptFailure::Connection
        }
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => AcceptFailure::Exhausted,
        _ => AcceptFailure::Other,
    }
}

/// Exponential pause after failed `accept`s, and logging that says how many failed without
/// flooding the log.
#[derive(Debug, Default)]
struct AcceptBackoff {
    pause: Option<Duration>,
    /// Failed attempts since the last accepted connection.
    failures: u64,
    log: EveryFew,
}

impl AcceptBackoff {
    /// Records a failure; returns how long to wait before the next attempt.
    fn failed(&mut self, e: &io::Error) -> Option<Duration> {
        let kind = classify(e);
        if kind == AcceptFailure::Connection {
            return None;
        }
        let pause = self
            .pause
            .map_or(MIN_ACCEPT_BACKOFF, |p| (p * 2).min(MAX_ACCEPT_BACKOFF));
        self.pause = Some(pause);
        self.failures += 1;
        if let Some(n) = self.log.tick() {
            let what = if kind == AcceptFailure::Exhausted {
                "the API cannot accept connections: the server is out of descriptors or memory; retrying"
            } else {
                "the API cannot accept connections; retrying"
            };
            tracing::warn!(error = %e, failures = n, "{what}");
        }
        Some(pause)
    }

    fn succeeded(&mut self) {
        if self.pause.take().is_some() {
            tracing::info!(
                failed_attempts = self.failures,
                "the API accepts connections again"
            );
        }
        self.failures = 0;
        self.log = EveryFew::default();
    }
}

/// Counts events; says "log now" for the first and then at most once per [`LOG_EVERY`], with the
/// count since the last time.
#[derive(Debug, Default)]
struct EveryFew {
    last: Option<Instant>,
    count: u64,
}

impl EveryFew {
    fn tick(&mut self) -> Option<u64> {
        self.count += 1;
        let now = Instant::now();
        if self.last.is_some_and(|l| now.duration_since(l) < LOG_EVERY) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.count))
    }
}

#[cfg(test)]
mod tests;
