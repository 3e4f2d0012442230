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

use crate::audit::{AuditRecord, ConnectionRecord, Cut, Door};
use crate::egress::{Sandbox, Shared};
use crate::inject::{self, SecretName};
use crate::limits::{Admission, Entry};
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
    #[error("idle for the idle timeout")]
    Idle,
    #[error("open for the longest lifetime")]
    Lifetime,
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
                let Ok((stream, admission)) = sandbox.admit_or_reset(&shared, stream, Entry::Door(door))
                else {
                    continue;
                };
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
                    admission,
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

/// Closes a connection with a reset (`SO_LINGER` 0): the sandbox sees the refusal at once, and no
/// socket lingers in `TIME_WAIT` on the host.
pub(crate) fn reset(stream: TcpStream) {
    if let Err(e) = stream.set_zero_linger() {
        tracing::debug!(error = %e, "cannot set SO_LINGER on a refused connection");
    }
    drop(stream);
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

/// Serve one connection from the sandbox and audit it, whatever happens. `admission` is its place
/// under the caps, given back when it ends.
pub(crate) async fn run_connection(
    shared: Arc<Shared>,
    sandbox: Arc<Sandbox>,
    stream: TcpStream,
    door: Door,
    original: Option<SocketAddr>,
    admission: Admission,
) {
    let started = SystemTime::now();
    let t0 = Instant::now();
    let _ = stream.set_nodelay(true);
    let counters = Arc::new(Counters::default());
    let client = Counted::new(stream, counters.clone());
    let mut report = Report::default();
    let limits = &shared.limits;
    let result = tokio::select! {
        () = sandbox.token.cancelled() => Err(ConnError::Cancelled),
        r = serve_door(&shared, &sandbox, client, door, original, &mut report) => r,
        e = watchdog(&counters, limits.idle_timeout, limits.max_lifetime) => Err(e),
    };
    drop(admission);
    let cut = match &result {
        Err(ConnError::Cancelled) => Some(Cut::SandboxRemoved),
        Err(ConnError::Idle) => Some(Cut::IdleTimeout),
        Err(ConnError::Lifetime) => Some(Cut::Lifetime),
        _ => None,
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
        cut,
        bytes_up,
        bytes_down,
        started,
        duration: t0.elapsed(),
    }));
}

/// Resolves when the connection has moved no byte either way for `idle` (checked every quarter of
/// it, so it is cut within 1.25 × `idle`), or has been open for `lifetime`.
async fn watchdog(counters: &Counters, idle: Duration, lifetime: Duration) -> ConnError {
    let start = tokio::time::Instant::now();
    let end = start + lifetime;
    let step = (idle / 4).max(Duration::from_millis(1));
    let mut seen = counters.get();
    let mut quiet_since = start;
    loop {
        let now = tokio::time::Instant::now();
        tokio::time::sleep_until((now + step).min(end)).await;
        let now = tokio::time::Instant::now();
        if now >= end {
            return ConnError::Lifetime;
        }
        let current = counters.get();
        if current != seen {
            seen = current;
            quiet_since = now;
        } else if now.duration_since(quiet_since) >= idle {
            return ConnError::Idle;
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte every `every`, `n` times, on the connection's counters.
    async fn trickle(counters: Arc<Counters>, every: Duration, n: u32) {
        for _ in 0..n {
            tokio::time::sleep(every).await;
            counters.add_up(1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_is_cut_between_one_and_one_and_a_quarter_idle_times() {
        let counters = Arc::new(Counters::default());
        let t = tokio::time::Instant::now();
        // Busy for 100 s (a byte every 50 s, under the 60 s idle time), then quiet.
        tokio::spawn(trickle(counters.clone(), Duration::from_secs(50), 2));
        let e = watchdog(&counters, Duration::from_secs(60), Duration::from_secs(3600)).await;
        assert!(matches!(e, ConnError::Idle), "{e:?}");
        let quiet = t.elapsed() - Duration::from_secs(100);
        assert!(
            quiet >= Duration::from_secs(60) && quiet <= Duration::from_secs(75),
            "{quiet:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_is_cut_at_its_lifetime() {
        let counters = Arc::new(Counters::default());
        let t = tokio::time::Instant::now();
        tokio::spawn(trickle(counters.clone(), Duration::from_secs(30), 1000));
        let e = watchdog(&counters, Duration::from_secs(60), Duration::from_secs(600)).await;
        assert!(matches!(e, ConnError::Lifetime), "{e:?}");
        assert_eq!(t.elapsed(), Duration::from_secs(600));
    }
}
