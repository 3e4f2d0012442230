//! Allow rules the operator makes useless: a tenant's address rule that can never let a connection
//! through because the operator denies every address and port it covers. The control plane refuses a
//! policy holding one (at create and when the policy changes) instead of letting each connection fail
//! silently at run time.
//!
//! The judgement, for the allow rule `R` with network `C` and ports `P` (every port when empty):
//! `R` is shadowed when
//! 1. `C` lies entirely inside one entry of the operator's deny list, or is exactly one of the host's
//!    own addresses, and
//! 2. no operator exception reaches into `C` on a port of `P`: an exception counts when its network
//!    overlaps `C` (two CIDRs overlap only when one contains the other) and its ports overlap `P`
//!    (an empty list on either side is every port). So an exception covering only some of `C`'s
//!    addresses, or only some of `P`'s ports, keeps the rule: it can take effect there. Only when
//!    every port of `R` lies outside the exception's ports does the exception not help.
//!
//! This is sound: [`decide`](super::decide) never lets a connection through by a shadowed rule,
//! whatever the rest of the policy (property-tested below against `decide`). Under 1 every address
//! of `C` is denied before any exception; under 2 no exception lifts that denial for any address of
//! `C` on any port of `P`.
//!
//! What it does not do: judge domain rules (the addresses a name resolves to are known only when a
//! connection is made); refuse a rule that merely overlaps a denied network (`0.0.0.0/0` still
//! reaches public addresses); notice a network covered only by the union of several deny entries
//! (kept: the check errs towards keeping a rule); look at the tenant's own deny rules or at rules
//! other tenant rules make useless (the tenant's own business, not the operator's).

use std::fmt;

use ipnet::IpNet;
use paddock_types::{Cidr, NetworkPolicy, PortRange};

use super::operator::{OperatorDenial, OperatorPolicy};

/// The reason given for one of the host's own addresses (they carry none in the configuration).
const HOST_ADDRESS_REASON: &str = "one of the host's own addresses";

/// An allow rule no connection can ever be let through by, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowedRule {
    /// Index in the policy's `allow` list.
    pub index: usize,
    /// The rule's network.
    pub cidr: Cidr,
    /// The operator's denial that covers all of it.
    pub denial: OperatorDenial,
    /// The operator's reason for that denial.
    pub reason: String,
}

impl fmt::Display for ShadowedRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let denied = match &self.denial {
            OperatorDenial::Listed(cidr) => cidr.to_string(),
            OperatorDenial::HostAddress(ip) => ip.to_string(),
        };
        write!(
            f,
            "{} lies inside {denied}, which the operator denies ({}) with no exception for this rule's \
             addresses and ports: the rule could never let a connection through",
            self.cidr, self.reason
        )
    }
}

/// The allow rules of `policy` that can never take effect under `operator`, in the policy's order
/// (the module's documentation says how they are judged).
pub fn shadowed_allow_rules(policy: &NetworkPolicy, operator: &OperatorPolicy) -> Vec<ShadowedRule> {
    policy
        .allow()
        .iter()
        .enumerate()
        .filter_map(|(index, rule)| {
            let cidr = rule.cidr()?;
            let (denial, reason) = covering_denial(operator, cidr.net())?;
            let excepted = operator
                .allow
                .iter()
                .any(|a| nets_overlap(a.cidr.net(), cidr.net()) && ports_overlap(rule.ports(), &a.ports));
            (!excepted).then_some(ShadowedRule {
                index,
                cidr,
                denial,
                reason,
            })
        })
        .collect()
}

/// The operator's denial covering every address of `net`, ignoring exceptions.
fn covering_denial(operator: &OperatorPolicy, net: IpNet) -> Option<(OperatorDenial, String)> {
    if let Some(d) = operator.deny.iter().find(|d| d.cidr.net().contains(&net)) {
        return Some((OperatorDenial::Listed(d.cidr), d.reason.clone()));
    }
    operator
        .host_addresses
        .iter()
        .find(|h| IpNet::from(h.to_canonical()) == net)
        .map(|h| (OperatorDenial::HostAddress(*h), HOST_ADDRESS_REASON.to_owned()))
}

/// Whether two networks share an address: CIDRs are nested or disjoint, never partly overlapping.
fn nets_overlap(a: IpNet, b: IpNet) -> bool {
    a.contains(&b) || b.contains(&a)
}

/// Whether two port lists share a port (an empty list is every port).
fn ports_overlap(a: &[PortRange], b: &[PortRange]) -> bool {
    a.is_empty() || b.is_empty() || a.iter().any(|x| b.iter().any(|y| x.overlaps(y)))
}

#[cfg(test)]
mod tests;
