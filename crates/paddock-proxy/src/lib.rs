//! HTTP/1.1 proxying onto a stream the caller has already opened (a connection to a sandbox's port):
//! [`forward`] sends one request over it and hands back the response; an upgrade request (a
//! WebSocket) that the upstream answers with `101 Switching Protocols` becomes a byte pipe between
//! the two upgraded connections.
//!
//! What it does to a request: removes the hop-by-hop fields (RFC 9110 §7.6.1: `Connection` and the
//! fields it names, `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade` unless
//! upgrading) and the caller's credential fields ([`Forward::strip`]), sets `X-Forwarded-For`,
//! `-Host` and `-Proto`, and refuses heads larger than [`MAX_HEAD_BYTES`]. To a response: removes
//! the hop-by-hop fields; a response head the upstream makes larger than hyper's buffer fails the
//! request.
//!
//! [`forward_pooled`] does the same over idle connections kept per key ([`Pool`], `pool.rs`).
//!
//! It does not: open connections, decide who may connect, or speak HTTP/2.

use std::net::SocketAddr;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST, UPGRADE};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// The largest request head (header names and values together) forwarded.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// The most header fields a request may carry to be forwarded.
pub const MAX_HEADERS: usize = 100;
mod pool;

pub use pool::{forward_pooled, Pool, PoolLimits, PooledBody, PooledError, ProxyBody};

/// Buffer hyper reads the upstream's response head into (and its largest head).
pub(crate) const MAX_RESPONSE_BUF: usize = 256 * 1024;

/// Hop-by-hop fields, never forwarded (RFC 9110 §7.6.1, and the old `Proxy-Connection`).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// How one request is forwarded.
#[derive(Debug, Clone)]
pub struct Forward {
    /// The client's address (`X-Forwarded-For`).
    pub client: Option<SocketAddr>,
    /// The scheme the client used (`X-Forwarded-Proto`).
    pub proto: &'static str,
    /// The `Host` the upstream sees; `None` keeps the client's.
    pub host: Option<String>,
    /// The path and query the upstream sees; `None` keeps the client's.
    pub path_and_query: Option<String>,
    /// Fields that carry the caller's credentials for the proxy itself, removed (lowercase).
    pub strip: &'static [&'static str],
}

/// Why a request was not forwarded.
#[derive(Debug)]
pub enum ForwardError {
    /// The request head is too large or malformed (answer 431 or 400).
    BadRequest(StatusCode, String),
    /// The upstream broke the exchange (closed, or answered no valid HTTP/1.1).
    Upstream(hyper::Error),
}

impl std::fmt::Display for ForwardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ForwardError::BadRequest(_, m) => f.write_str(m),
            ForwardError::Upstream(e) => write!(f, "the upstream failed: {e}"),
        }
    }
}

impl std::error::Error for ForwardError {}

/// Whether `headers` ask for a protocol upgrade (`Connection: upgrade` and an `Upgrade` field).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(UPGRADE)
        && headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Removes hop-by-hop fields (and those `Connection` names) from `headers`; `keep_upgrade` keeps
/// `Upgrade` and sets `Connection: upgrade`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    let upgrade = headers.get(UPGRADE).cloned();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_upgrade {
        if let Some(u) = upgrade {
            headers.insert(UPGRADE, u);
            headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
        }
    }
}

/// Checks the size of a request head and rewrites its fields for the upstream.
pub fn prepare_head(headers: &mut HeaderMap, fwd: &Forward, upgrade: bool) -> Result<(), ForwardError> {
    if headers.len() > MAX_HEADERS {
        return Err(ForwardError::BadRequest(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("more than {MAX_HEADERS} header fields"),
        ));
    }
    let bytes: usize = headers.iter().map(|(k, v)| k.as_str().len() + v.len() + 4).sum();
    if bytes > MAX_HEAD_BYTES {
        return Err(ForwardError::BadRequest(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("request head over {MAX_HEAD_BYTES} bytes"),
        ));
    }
    strip_hop_by_hop(headers, upgrade);
    for name in fwd.strip {
        headers.remove(*name);
    }
    let original_host = headers.get(HOST).cloned();
    if let Some(host) = &fwd.host {
        let value = HeaderValue::from_str(host)
            .map_err(|_| ForwardError::BadRequest(StatusCode::BAD_REQUEST, "invalid host".into()))?;
        headers.insert(HOST, value);
    }
    if let Some(host) = original_host {
        headers.insert("x-forwarded-host", host);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static(fwd.proto));
    if let Some(client) = fwd.client {
        let ip = client.ip().to_string();
        let value = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(prior) => format!("{prior}, {ip}"),
            None => ip,
        };
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert("x-forwarded-for", v);
        }
    }
    Ok(())
}

/// Rewrites `req`'s head for the upstream ([`prepare_head`]) and its target to the origin form
/// (`fwd.path_and_query`, else the client's path and query, whatever form the client used).
pub(crate) fn prepare_request<B>(
    req: &mut Request<B>,
    fwd: &Forward,
    upgrade: bool,
) -> Result<(), ForwardError> {
    prepare_head(req.headers_mut(), fwd, upgrade)?;
    if let Some(pq) = &fwd.path_and_query {
        let uri = pq
            .parse()
            .map_err(|_| ForwardError::BadRequest(StatusCode::BAD_REQUEST, "invalid path".into()))?;
        *req.uri_mut() = uri;
    } else if let Some(pq) = req.uri().path_and_query().cloned() {
        *req.uri_mut() = hyper::Uri::from(pq);
    }
    Ok(())
}

/// Sends `req` over `upstream` (a connection to the server that answers it) and returns the
/// response, hop-by-hop fields removed. An upgrade the upstream accepts (101) is piped in a task of
/// its own: the client's upgraded connection (from `req`'s extensions, as hyper's server leaves it)
/// to the upstream's, until either side closes. The connection (and whatever `upstream` holds) is
/// released once the response body has been read or dropped, or the pipe ends.
pub async fn forward<B, S>(
    mut req: Request<B>,
    upstream: S,
    fwd: &Forward,
) -> Result<Response<Incoming>, ForwardError>
where
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let upgrade = is_upgrade(req.headers());
    prepare_request(&mut req, fwd, upgrade)?;
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_RESPONSE_BUF)
        .handshake(TokioIo::new(upstream))
        .await
        .map_err(ForwardError::Upstream)?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "a proxied connection ended with an error");
        }
    });
    let mut resp = sender.send_request(req).await.map_err(ForwardError::Upstream)?;
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    strip_hop_by_hop(resp.headers_mut(), switching && upgrade);
    if switching {
        if let Some(client) = client_upgrade {
            let upstream = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                match (client.await, upstream.await) {
                    (Ok(client), Ok(upstream)) => {
                        let mut client = TokioIo::new(client);
                        let mut upstream = TokioIo::new(upstream);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                    (Err(e), _) | (_, Err(e)) => tracing::debug!(error = %e, "an upgrade did not complete"),
                }
            });
        }
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_str(v).expect("value"));
        }
        h
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_go() {
        let mut h = headers(&[
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("accept", "*/*"),
        ]);
        strip_hop_by_hop(&mut h, false);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("accept"));
    }

    #[test]
    fn an_upgrade_keeps_its_fields() {
        let mut h = headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "k"),
        ]);
        assert!(is_upgrade(&h));
        strip_hop_by_hop(&mut h, true);
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["sec-websocket-key"], "k");
        assert!(!is_upgrade(&headers(&[("upgrade", "websocket")])));
    }

    #[test]
    fn heads_are_rewritten_and_bounded() {
        let fwd = Forward {
            client: Some("10.0.0.7:5555".parse().expect("addr")),
            proto: "http",
            host: Some("localhost:8080".into()),
            path_and_query: None,
            strip: &["authorization"],
        };
        let mut h = headers(&[
            ("host", "8080-sb-1.example.test"),
            ("authorization", "Bearer pdk_secret"),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        prepare_head(&mut h, &fwd, false).expect("prepared");
        assert!(!h.contains_key("authorization"));
        assert_eq!(h["host"], "localhost:8080");
        assert_eq!(h["x-forwarded-host"], "8080-sb-1.example.test");
        assert_eq!(h["x-forwarded-for"], "1.2.3.4, 10.0.0.7");
        assert_eq!(h["x-forwarded-proto"], "http");
        let mut big = headers(&[("x-big", &"a".repeat(MAX_HEAD_BYTES))]);
        assert!(matches!(
            prepare_head(&mut big, &fwd, false),
            Err(ForwardError::BadRequest(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                _
            ))
        ));
    }
}
