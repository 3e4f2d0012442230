//! One intercepted connection: TLS towards the sandbox with a leaf from its CA, TLS towards the real
//! host (verified against the public roots and the operator's extra CAs), HTTP/1.1 via hyper on both
//! legs, placeholders replaced in request headers on the way up. Nothing is logged about header values.

use std::sync::{Arc, Mutex};

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::HeaderValue;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use paddock_types::DomainName;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::secret::{SecretName, SecretSet};
use crate::egress::{Sandbox, Shared};
use crate::proxy::stream::{Counted, Prefixed};
use crate::proxy::ConnError;

pub(crate) async fn intercept(
    shared: &Shared,
    sandbox: &Sandbox,
    client: Counted<TcpStream>,
    prefix: Vec<u8>,
    name: &DomainName,
    upstream: TcpStream,
    injected: &Arc<Mutex<Vec<SecretName>>>,
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
        injected.clone(),
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
    injected: Arc<Mutex<Vec<SecretName>>>,
) -> Result<(), ConnError> {
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let service = service_fn(move |req: Request<Incoming>| {
        handle_request(
            req,
            sender.clone(),
            secrets.clone(),
            host.clone(),
            injected.clone(),
        )
    });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(sandbox_tls), service)
        .await
        .map_err(ConnError::SandboxHttp)
}

/// Why one intercepted request failed (the sandbox sees a 502 from hyper).
#[derive(Debug, thiserror::Error)]
enum RequestError {
    #[error("substituted header value is invalid")]
    Header(#[source] hyper::header::InvalidHeaderValue),
    #[error("upstream request failed")]
    Upstream(#[source] hyper::Error),
}

/// Replace placeholders bound to `host` in the request's header values, then send it upstream.
async fn handle_request(
    mut req: Request<Incoming>,
    sender: Arc<tokio::sync::Mutex<SendRequest<Incoming>>>,
    secrets: Arc<SecretSet>,
    host: DomainName,
    injected: Arc<Mutex<Vec<SecretName>>>,
) -> Result<Response<Incoming>, RequestError> {
    for value in req.headers_mut().values_mut() {
        if let Some((real, used)) = secrets.substitute(&host, value.as_bytes()) {
            let mut real = HeaderValue::from_bytes(&real).map_err(RequestError::Header)?;
            real.set_sensitive(true);
            *value = real;
            let mut names = injected.lock().unwrap_or_else(|e| e.into_inner());
            for n in used {
                if !names.contains(&n) {
                    names.push(n);
                }
            }
        }
    }
    let mut sender = sender.lock().await;
    sender.ready().await.map_err(RequestError::Upstream)?;
    sender.send_request(req).await.map_err(RequestError::Upstream)
}
