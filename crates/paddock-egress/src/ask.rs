//! Asking a person about a destination: when a sandbox's allowlist does not cover a named
//! destination and its approval policy says `ask`, the proxy holds the connection and asks the
//! control plane through a [`NetworkAsker`] (bounded: the asker answers `false` when no one
//! approves in time). Approved, that one connection proceeds as if one allow rule named exactly
//! that host and port: the operator's deny list and the tenant's deny rules still apply to the
//! addresses the name resolves to.
//!
//! What it does not do: decide (the asker does, with the control plane's policies and queue),
//! remember an approval for later connections, or ask about bare addresses (only names a person
//! can read).

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;

use paddock_types::{
    DomainName, DomainPattern, EgressRule, EgressTarget, NetworkPolicy, PortRange, SandboxId,
};

/// Asks whether sandbox `sandbox` may connect to `host` on `port` now; `true` only when a person
/// approved this connection.
pub trait NetworkAsker: Send + Sync + Debug + 'static {
    fn ask<'a>(
        &'a self,
        sandbox: &'a SandboxId,
        host: &'a DomainName,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>>;
}

/// `policy` with one more allow rule, last: exactly `host` on `port` (its index is the policy's
/// allow count before it).
pub(crate) fn with_approved(policy: &NetworkPolicy, host: &DomainName, port: u16) -> Option<NetworkPolicy> {
    let mut allow = policy.allow().to_vec();
    allow.push(EgressRule::new(
        EgressTarget::Domain(DomainPattern::Exact(host.clone())),
        vec![PortRange::single(port).ok()?],
    ));
    NetworkPolicy::new(allow, policy.deny().to_vec()).ok()
}
