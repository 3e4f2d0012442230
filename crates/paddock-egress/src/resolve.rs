//! Name resolution for the proxy and the DNS responder: the operator's host map first, then (when
//! enabled) the system resolver. Addresses the operator denies on every port are dropped here, so a
//! public name that resolves to 127.0.0.1 or 169.254.169.254 is never answered nor connected to.

use std::net::IpAddr;
use std::time::Duration;

use paddock_types::DomainName;

use crate::policy::OperatorPolicy;

/// The TTL given for answers: the host map has none, and `getaddrinfo` does not report one.
pub(crate) const ANSWER_TTL: Duration = Duration::from_secs(60);
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Resolves names for every sandbox.
#[derive(Debug)]
pub(crate) struct Resolver {
    system: bool,
}

impl Resolver {
    pub(crate) fn new(system: bool) -> Self {
        Self { system }
    }

    /// Addresses of `name` the operator does not deny outright; empty when the name does not resolve.
    pub(crate) async fn resolve(&self, operator: &OperatorPolicy, name: &DomainName) -> Vec<IpAddr> {
        let ips = match operator.hosts.get(name) {
            Some(ips) => ips.clone(),
            None if self.system => {
                let lookup = tokio::net::lookup_host((name.as_str(), 0));
                match tokio::time::timeout(LOOKUP_TIMEOUT, lookup).await {
                    Ok(Ok(addrs)) => addrs.map(|a| a.ip()).collect(),
                    Ok(Err(e)) => {
                        tracing::debug!(name = %name, error = %e, "name does not resolve");
                        Vec::new()
                    }
                    Err(_) => {
                        tracing::debug!(name = %name, "name resolution timed out");
                        Vec::new()
                    }
                }
            }
            None => Vec::new(),
        };
        let mut out: Vec<IpAddr> = Vec::with_capacity(ips.len());
        for ip in ips.into_iter().map(|ip| ip.to_canonical()) {
            if !operator.denies_every_port(ip) && !out.contains(&ip) {
                out.push(ip);
            }
        }
        out
    }
}
