//! The transparent door: TCP the sandbox sent anywhere, redirected here by netfilter. The name comes
//! from the first bytes (TLS SNI, HTTP `Host`); a name allowed by a domain rule must also have been
//! answered by paddock's DNS with this very address.

use std::net::SocketAddr;

use tokio::net::TcpStream;

use super::stream::Counted;
use super::{connect, forward, ConnError, Report};
use crate::egress::{Sandbox, Shared};
use crate::policy::{allowed_by_domain, decide, Decision, Destination, Rule};
use crate::sniff::{sniff, Sniffed};

pub(super) async fn serve(
    shared: &Shared,
    sandbox: &Sandbox,
    mut client: Counted<TcpStream>,
    original: Option<SocketAddr>,
    report: &mut Report,
) -> Result<(), ConnError> {
    let Some(original) = original else {
        report.decision = Some(Decision::deny(Rule::NoOriginalDestination));
        return Ok(());
    };
    let (ip, port) = (original.ip().to_canonical(), original.port());
    report.ip = Some(ip);
    report.port = port;
    let (sniffed, prefix) = match sniff(&mut client, Vec::new(), shared.sniff).await {
        Ok(s) => s,
        Err(e) => {
            report.decision = Some(Decision::deny(Rule::Unreadable { reason: e.reason() }));
            return Err(ConnError::Sniff(e));
        }
    };
    let name = sniffed.name().cloned();
    report.name = name.clone();
    let policy = sandbox.policy();
    let mut decision = decide(
        &policy,
        &shared.operator,
        &Destination {
            name: name.as_ref(),
            ip,
            port,
        },
    );
    if allowed_by_domain(&policy, &decision) && !name.as_ref().is_some_and(|n| sandbox.is_pinned(n, ip)) {
        decision = Decision::deny(Rule::NotResolvedForName);
    }
    let allowed = decision.allowed;
    report.decision = Some(decision);
    if !allowed {
        return Ok(());
    }
    let upstream = connect(shared, SocketAddr::new(ip, port)).await?;
    let tls_name = match &sniffed {
        Sniffed::Tls(n) => n.as_ref(),
        _ => None,
    };
    forward(shared, sandbox, client, prefix, tls_name, upstream, report).await
}
