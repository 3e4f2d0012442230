//! paddock's egress proxy: the pure policy decision and the mechanism that enforces it.
//!
//! One [`Egress`] serves many sandboxes. Each gets its own listeners (the address a connection
//! arrives on says which sandbox it is from): an explicit HTTP(S) proxy, a transparent listener for
//! TCP redirected by netfilter, and a DNS responder that answers allowed names only and pins each
//! answer so connections must go where DNS said. Every connection and DNS question is audited through
//! an [`AuditSink`]. Hosts a secret is bound to have their TLS intercepted (a per-sandbox CA) so the
//! proxy can replace `paddock-secret:NAME` placeholders in the request header fields (and query
//! strings) the secret's [`SecretBinding`] names, in requests whose target is that very host.
//!
//! What one sandbox can make the proxy hold is bounded ([`EgressLimits`]): connections per door and
//! per sandbox, descriptors across sandboxes, DNS questions and resolutions in flight, idle and total
//! lifetimes. Refusals at a cap are counted and reported as [`RefusalRecord`]s, a few per window.
//!
//! What this crate does not do: create network namespaces, veth pairs or nftables rules (the runtime
//! does, pointing the sandbox at the addresses [`SandboxEgress`] reports), store policies or secrets
//! (the control plane does), or carry UDP other than DNS (refused by the namespace's rules).

mod ask;
mod audit;
mod dns;
mod egress;
mod error;
mod host;
mod inject;
mod limits;
mod pins;
pub mod policy;
mod proxy;
mod resolve;
pub mod sniff;

pub use ask::NetworkAsker;
pub use audit::{AuditRecord, AuditSink, ConnectionRecord, Cut, DnsRecord, Door};
pub use egress::{Egress, EgressConfig, SandboxEgress, SandboxListen};
pub use error::EgressError;
pub use host::host_addresses;
pub use inject::{
    BoundHeader, SandboxCaKey, Secret, SecretBinding, SecretError, SecretName, DEFAULT_HEADER,
    MAX_BOUND_HEADERS, PLACEHOLDER_PREFIX,
};
pub use limits::{descriptor_budget, EgressLimits, Limit, RefusalRecord};
