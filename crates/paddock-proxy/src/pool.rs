//! Idle upstream connections kept for the next request with the same key ([`Pool`]), and
//! [`forward_pooled`], which sends a request over one of them or over a connection the caller opens.
//!
//! A connection goes back to the pool only once its response body has been read to the end (or
//! was empty) and hyper says it can take another request; one the upstream closes, or that
//! answered `Connection: close`, never does. An idle connection is used for requests of its own
//! key only, so a caller that keys by (sandbox, port, credential) never sends one sandbox's
//! traffic over another's connection or under another credential. Bounds: idle connections per key
//! and in all, and an idle time after which one is closed (checked whenever the pool is used).
//! Upgrades (WebSockets) always get a connection of their own and never join the pool.
//!
//! It does not: open connections (the caller's `connect` does), retry a request that may have
//! reached the upstream, or pool HTTP/2.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::{
    forward, is_upgrade, prepare_request, strip_hop_by_hop, Forward, ForwardError, MAX_RESPONSE_BUF,
};

/// A request body as the pool's connections carry it.
pub type ProxyBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// How many idle connections a [`Pool`] keeps, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLimits {
    /// Idle connections kept per key.
    pub per_key: usize,
    /// Idle connections kept in all.
    pub total: usize,
    /// How long a connection may stay idle.
    pub idle: Duration,
}

impl Default for PoolLimits {
    fn default() -> Self {
        Self {
            per_key: 8,
            total: 256,
            idle: Duration::from_secs(30),
        }
    }
}

/// Idle upstream connections by key.
pub struct Pool<K> {
    inner: Arc<Mutex<State<K>>>,
    limits: PoolLimits,
}

impl<K> std::fmt::Debug for Pool<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl<K> Clone for Pool<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            limits: self.limits,
        }
    }
}

struct State<K> {
    idle: HashMap<K, Vec<Idle>>,
}

struct Idle {
    sender: SendRequest<ProxyBody>,
    since: Instant,
}

impl<K: Eq + Hash + Clone + Send + Unpin + 'static> Pool<K> {
    /// An empty pool.
    pub fn new(limits: PoolLimits) -> Self {
        Self {
            inner: Arc::new(Mutex::new(State { idle: HashMap::new() })),
            limits,
        }
    }

    /// Idle connections held (for tests and metrics).
    pub fn idle_connections(&self) -> usize {
        let mut state = self.lock();
        self.sweep(&mut state, Instant::now());
        state.idle.values().map(Vec::len).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<K>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops what has been idle too long or was closed, everywhere.
    fn sweep(&self, state: &mut State<K>, now: Instant) {
        let idle = self.limits.idle;
        state.idle.retain(|_, conns| {
            conns.retain(|c| now.duration_since(c.since) < idle && !c.sender.is_closed());
            !conns.is_empty()
        });
    }

    /// The most recently idle connection of `key`'s, if any.
    fn take(&self, key: &K) -> Option<SendRequest<ProxyBody>> {
        let mut state = self.lock();
        self.sweep(&mut state, Instant::now());
        let conns = state.idle.get_mut(key)?;
        let idle = conns.pop();
        if conns.is_empty() {
            state.idle.remove(key);
        }
        idle.map(|c| c.sender)
    }

    /// Keeps `sender` for `key` unless the pool is full.
    fn put(&self, key: K, sender: SendRequest<ProxyBody>) {
        let mut state = self.lock();
        let now = Instant::now();
        self.sweep(&mut state, now);
        let total: usize = state.idle.values().map(Vec::len).sum();
        let conns = state.idle.entry(key).or_default();
        if conns.len() < self.limits.per_key && total < self.limits.total {
            conns.push(Idle { sender, since: now });
        }
    }

    /// Puts `sender` back once it can take another request (in a task: hyper readies a
    /// connection after the response that used it is fully read).
    fn put_when_ready(&self, key: K, mut sender: SendRequest<ProxyBody>) {
        let pool = self.clone();
        tokio::spawn(async move {
            if sender.ready().await.is_ok() {
                pool.put(key, sender);
            }
        });
    }
}

/// Why [`forward_pooled`] did not forward a request.
#[derive(Debug)]
pub enum PooledError<E> {
    /// The caller's `connect` failed.
    Connect(E),
    /// The request or the upstream failed.
    Forward(ForwardError),
}

/// A response body that gives its connection back to the pool once read to the end.
pub struct PooledBody<K: Eq + Hash + Clone + Send + Unpin + 'static> {
    inner: Incoming,
    back: Option<(Pool<K>, K, SendRequest<ProxyBody>)>,
}

impl<K: Eq + Hash + Clone + Send + Unpin + 'static> std::fmt::Debug for PooledBody<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody")
            .field("pooled", &self.back.is_some())
            .finish_non_exhaustive()
    }
}

impl<K: Eq + Hash + Clone + Send + Unpin + 'static> Body for PooledBody<K> {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<K: Eq + Hash + Clone + Send + Unpin + 'static> Drop for PooledBody<K> {
    fn drop(&mut self) {
        if let Some((pool, key, sender)) = self.back.take() {
            // A body dropped before its end leaves the connection mid-response: not reusable.
            if self.inner.is_end_stream() {
                pool.put_when_ready(key, sender);
            }
        }
    }
}

/// Forwards `req` (see [`forward`] for what is done to it) over an idle connection of `key`'s, else
/// over one `connect` opens, which joins the pool after its response. A request the pooled
/// connection did not send (the upstream had closed it) goes over a new one; one it sent and lost
/// is an error, never sent twice. An upgrade always goes over a new connection, never pooled.
pub async fn forward_pooled<K, B, S, E, F, Fut>(
    mut req: Request<B>,
    pool: &Pool<K>,
    key: K,
    connect: F,
    fwd: &Forward,
) -> Result<Response<PooledBody<K>>, PooledError<E>>
where
    K: Eq + Hash + Clone + Send + Unpin + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<S, E>>,
{
    if is_upgrade(req.headers()) {
        let upstream = connect().await.map_err(PooledError::Connect)?;
        let resp = forward(req, upstream, fwd).await.map_err(PooledError::Forward)?;
        return Ok(resp.map(|inner| PooledBody { inner, back: None }));
    }
    prepare_request(&mut req, fwd, false).map_err(PooledError::Forward)?;
    let mut req = req.map(|b| b.map_err(Into::into).boxed_unsync());
    if let Some(mut sender) = pool.take(&key) {
        match sender.try_send_request(req).await {
            Ok(resp) => return Ok(pooled(resp, pool, key, sender)),
            Err(mut e) => match e.take_message() {
                // Not sent: the upstream closed the idle connection; a new one takes it.
                Some(unsent) => req = unsent,
                None => return Err(PooledError::Forward(ForwardError::Upstream(e.into_error()))),
            },
        }
    }
    let upstream = connect().await.map_err(PooledError::Connect)?;
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_RESPONSE_BUF)
        .handshake(TokioIo::new(upstream))
        .await
        .map_err(|e| PooledError::Forward(ForwardError::Upstream(e)))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "a pooled proxied connection ended with an error");
        }
    });
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| PooledError::Forward(ForwardError::Upstream(e)))?;
    Ok(pooled(resp, pool, key, sender))
}

fn pooled<K: Eq + Hash + Clone + Send + Unpin + 'static>(
    mut resp: Response<Incoming>,
    pool: &Pool<K>,
    key: K,
    sender: SendRequest<ProxyBody>,
) -> Response<PooledBody<K>> {
    strip_hop_by_hop(resp.headers_mut(), false);
    resp.map(|inner| PooledBody {
        inner,
        back: Some((pool.clone(), key, sender)),
    })
}

#[cfg(test)]
mod tests;
