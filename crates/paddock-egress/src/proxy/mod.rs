//! The TCP side of the proxy: per-sandbox accept loops, the two doors (transparent and explicit), and
//! what happens once a destination is allowed (relay, or interception for secret injection).

mod explicit;
mod relay;
pub(crate) mod stream;
mod transparent;

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use paddock_types::DomainName;
use tokio::net::{TcpListener, TcpStream};

use crate::audit::{AuditRecord, ConnectionRecord, Door};
use crate::egress::{Sandbox, Shared};
use crate::inject::{self, SecretName};
use crate::policy::{Decision, Rule};
use crate::sniff::SniffError;
use stream::{Counted, Counters};

/// Why a connection ended early (logged at debug; the audit record has the decision).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnError {
    #[error("failed to read the first bytes")]
    Sniff(#[source] SniffError),
    #[error("failed to read the proxy request")]
    ReadRequest(#[source] std::io::Error),
    #[error("failed to answer the proxy request")]
    Respond(#[source] std::io::Error),
    #[error("failed to connect to {addr}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("relay failed")]
    Relay(#[source] std::io::Error),
    #[error("TLS handshake with the sandbox failed")]
    SandboxTls(#[source] std::io::Error),
    #[error("TLS handshake with {name} failed")]
    UpstreamTls {
        name: DomainName,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP to {name} failed")]
    UpstreamHttp {
        name: DomainName,
        #[source]
        source: hyper::Error,
    },
    #[error("HTTP with the sandbox failed")]
    SandboxHttp(#[source] hyper::Error),
    #[error("no certificate for {name}")]
    Certificate {
        name: DomainName,
        #[source]
        source: crate::error::EgressError,
    },
    #[error("sandbox removed")]
    Cancelled,
}

/// What is known about a connection so far, for its audit record.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) name: Option<DomainName>,
    pub(crate) ip: Option<IpAddr>,
    pub(crate) port: u16,
    pub(crate) decision: Option<Decision>,
    pub(crate) findings: Arc<Findings>,
}

/// Most distinct refusal reasons kept for one connection's record.
const MAX_REFUSALS_KEPT: usize = 8;

/// What the requests of an intercepted connection did, gathered from hyper's tasks.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    injected: Mutex<Vec<SecretName>>,
    refused: Mutex<Vec<String>>,
}

impl Findings {
    /// Secrets substituted into a request.
    pub(crate) fn injected(&self, names: Vec<SecretName>) {
        let mut all = self.injected.lock().unwrap_or_else(|e| e.into_inner());
        for n in names {
            if !all.contains(&n) {
                all.push(n);
            }
        }
    }
    /// A request refused (distinct reasons, a few at most).
    pub(crate) fn refused(&self, reason: &str) {
        let mut all = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() < MAX_REFUSALS_KEPT && !all.iter().any(|r| r == reason) {
            all.push(reason.to_owned());
        }
    }
    fn take(&self) -> (Vec<String>, Vec<String>) {
        let injected = self
            .injected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|n| n.as_str().to_owned())
            .collect();
        let refused = std::mem::take(&mut *self.refused.lock().unwrap_or_else(|e| e.into_inner()));
        (injected, refused)
    }
}

/// Accept connections for one sandbox until it is removed.
pub(crate) async fn accept_loop(
    shared: Arc<Shared>,
    sandbox: Arc<Sandbox>,
    listener: TcpListener,
    door: Door,
) {
    loop {
        let accepted = tokio::select! {
            () = sandbox.token.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                let original = match door {
                    Door::Transparent => original_destination(&stream),
                    Door::Proxy => None,
                };
                tokio::spawn(run_connection(
                    shared.clone(),
                    sandbox.clone(),
                    stream,
                    door,
                    original,
                ));
            }
            Err(e) => {
                // Out of file descriptors or memory: back off rather than spin.
                tracing::warn!(sandbox_id = %sandbox.id, error = %e, "egress accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The destination a redirected connection was sent to (netfilter's `SO_ORIGINAL_DST`); `None` when
/// the kernel has none, or when it is our own address (the connection was not redirected).
fn original_destination(stream: &TcpStream) -> Option<SocketAddr> {
    let local = stream.local_addr().ok()?;
    let original = match local {
        SocketAddr::V4(_) => rustix::net::sockopt::ip_original_dst(stream).map(SocketAddr::V4),
        SocketAddr::V6(_) => rustix::net::sockopt::ipv6_original_dst(stream).map(SocketAddr::V6),
    };
    match original {
        Ok(addr) if addr != local => Some(addr),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(error = %e, "no original destination");
            None
        }
    }
}

/// Serve one connection from the sandbox and audit it, whatever happens.
pub(crate) async fn run_connection(
    shared: Arc<Shared>,
    sandbox: Arc<Sandbox>,
    stream: TcpStream,
    door: Door,
    original: Option<SocketAddr>,
) {
    let started = SystemTime::now();
    let t0 = Instant::now();
    let _ = stream.set_nodelay(true);
    let counters = Arc::new(Counters::default());
    let client = Counted::new(stream, counters.clone());
    let mut report = Report::default();
    let result = tokio::select! {
        () = sandbox.token.cancelled() => Err(ConnError::Cancelled),
        r = serve_door(&shared, &sandbox, client, door, original, &mut report) => r,
    };
    if let Err(e) = result {
        tracing::debug!(sandbox_id = %sandbox.id, error = &e as &dyn std::error::Error, "egress connection ended with an error");
    }
    let (bytes_up, bytes_down) = counters.get();
    let decision = report.decision.unwrap_or_else(|| {
        Decision::deny(Rule::Unreadable {
            reason: "closed before naming a destination".into(),
        })
    });
    let (secrets_injected, requests_refused) = report.findings.take();
    shared.audit.record(AuditRecord::Connection(ConnectionRecord {
        sandbox: sandbox.id.clone(),
        door,
        name: report.name,
        ip: report.ip,
        port: report.port,
        allowed: decision.allowed,
        rule: decision.rule,
        secrets_injected,
        requests_refused,
        bytes_up,
        bytes_down,
        started,
        duration: t0.elapsed(),
    }));
}

async fn serve_door(
    shared: &Shared,
    sandbox: &Sandbox,
    client: Counted<TcpStream>,
    door: Door,
    original: Option<SocketAddr>,
    report: &mut Report,
) -> Result<(), ConnError> {
    match door {
        Door::Proxy => explicit::serve(shared, sandbox, client, report).await,
        Door::Transparent => transparent::serve(shared, sandbox, client, original, report).await,
    }
}

/// Connect upstream to an allowed destination.
async fn connect(shared: &Shared, addr: SocketAddr) -> Result<TcpStream, ConnError> {
    relay::connect(addr, shared.connect_timeout)
        .await
        .map_err(|source| ConnError::Connect { addr, source })
}

/// Carry an allowed connection: intercept it when it is TLS for a host a secret is bound to
/// (`tls_name`), relay it untouched otherwise. `prefix` holds bytes already read from the sandbox.
async fn forward(
    shared: &Shared,
    sandbox: &Sandbox,
    mut client: Counted<TcpStream>,
    prefix: Vec<u8>,
    tls_name: Option<&DomainName>,
    upstream: TcpStream,
    report: &Report,
) -> Result<(), ConnError> {
    match tls_name.filter(|n| sandbox.secrets().any_bound_to(n)) {
        // Boxed: the interception state machine is large, and most connections are plain relays.
        Some(name) => {
            Box::pin(inject::intercept(
                shared,
                sandbox,
                client,
                prefix,
                name,
                report.port,
                upstream,
                &report.findings,
            ))
            .await
        }
        None => relay::relay(&mut client, upstream, prefix, shared.relay_buffer)
            .await
            .map_err(ConnError::Relay),
    }
}
