//! One intercepted connection: TLS towards the sandbox with a leaf from its CA, TLS towards the real
//! host (verified against the public roots and the operator's extra CAs), HTTP/1.1 via hyper on both
//! legs. Each request is checked and substituted by [`prepare_request`] on the way up; a refused one
//! gets the proxy's own 403 and never reaches the host. Nothing is logged about header values.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use paddock_types::DomainName;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::request::{prepare_request, Target};
use super::secret::SecretSet;
use crate::egress::{Sandbox, Shared};
use crate::proxy::stream::{Counted, Prefixed};
use crate::proxy::{ConnError, Findings};

/// The largest request head read from the sandbox (hyper answers 431 beyond it).
const MAX_REQUEST_HEAD: usize = 64 * 1024;

/// What the sandbox gets back: the host's response, or the proxy's refusal.
type Body = Either<Incoming, Full<Bytes>>;

/// Serves an intercepted TLS connection to `name` (port `port`) until either side closes.
#[expect(clippy::too_many_arguments, reason = "one connection's parts, passed once")]
pub(crate) async fn intercept(
    shared: &Shared,
    sandbox: &Sandbox,
    client: Counted<TcpStream>,
    prefix: Vec<u8>,
    name: &DomainName,
    port: u16,
    upstream: TcpStream,
    findings: &Arc<Findings>,
) -> Result<(), ConnError> {
    let server_config = sandbox
        .ca
        .server_config(name)
        .map_err(|source| ConnError::Certificate {
            name: name.clone(),
            source,
        })?;
    let sandbox_tls = tokio_rustls::TlsAcceptor::from(server_config)
        .accept(Prefixed::new(prefix, client))
        .await
        .map_err(ConnError::SandboxTls)?;
    let server_name =
        ServerName::try_from(name.as_str().to_owned()).expect("a DomainName is a valid server name");
    let upstream_tls = tokio_rustls::TlsConnector::from(shared.upstream_tls.clone())
        .connect(server_name, upstream)
        .await
        .map_err(|source| ConnError::UpstreamTls {
            name: name.clone(),
            source,
        })?;
    let (sender, conn) = hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream_tls))
        .await
        .map_err(|source| ConnError::UpstreamHttp {
            name: name.clone(),
            source,
        })?;
    let upstream_name = name.clone();
    // Ends when the sandbox side drops the sender (its connection closed) or the host closes.
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(host = %upstream_name, error = &e as &dyn std::error::Error, "upstream HTTP connection ended");
        }
    });
    serve_sandbox(
        sandbox_tls,
        sender,
        sandbox.secrets(),
        name.clone(),
        port,
        findings.clone(),
    )
    .await
}

/// The sandbox leg. A function of owned values only: a closure defined in a function with lifetime
/// parameters carries them in its type, which makes the connection future not `Send` for all of them.
async fn serve_sandbox(
    sandbox_tls: tokio_rustls::server::TlsStream<Prefixed<Counted<TcpStream>>>,
    sender: SendRequest<Incoming>,
    secrets: Arc<SecretSet>,
    host: DomainName,
    port: u16,
    findings: Arc<Findings>,
) -> Result<(), ConnError> {
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let service = service_fn(move |req: Request<Incoming>| {
        handle_request(
            req,
            sender.clone(),
            secrets.clone(),
            host.clone(),
            port,
            findings.clone(),
        )
    });
    hyper::server::conn::http1::Builder::new()
        // A request head is read into this buffer: 64 KiB, not hyper's ~400 KiB, so a sandbox's
        // intercepted connections (up to its door cap) hold little memory with huge heads.
        .max_buf_size(MAX_REQUEST_HEAD)
        .serve_connection(TokioIo::new(sandbox_tls), service)
        .await
        .map_err(ConnError::SandboxHttp)
}

/// Why one intercepted request failed (the sandbox sees a 502 from hyper).
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("upstream request failed")]
    Upstream(#[source] hyper::Error),
}

/// Check the request's target and substitute placeholders ([`prepare_request`]), then send it
/// upstream; or answer 403 without sending anything.
async fn handle_request(
    req: Request<Incoming>,
    sender: Arc<tokio::sync::Mutex<SendRequest<Incoming>>>,
    secrets: Arc<SecretSet>,
    host: DomainName,
    port: u16,
    findings: Arc<Findings>,
) -> Result<Response<Body>, RequestError> {
    let (mut parts, body) = req.into_parts();
    match prepare_request(&secrets, Target { host: &host, port }, &mut parts) {
        Ok(used) => findings.injected(used),
        Err(refusal) => {
            let reason = refusal.to_string();
            findings.refused(&reason);
            return Ok(forbidden(&reason));
        }
    }
    let req = Request::from_parts(parts, body);
    let mut sender = sender.lock().await;
    sender.ready().await.map_err(RequestError::Upstream)?;
    let resp = sender.send_request(req).await.map_err(RequestError::Upstream)?;
    Ok(resp.map(Either::Left))
}

/// The proxy's refusal of one request; the connection is closed after it.
fn forbidden(reason: &str) -> Response<Body> {
    let body = format!("paddock egress: request refused: {reason}\n");
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *resp.status_mut() = StatusCode::FORBIDDEN;
    let headers = resp.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    resp
}
