//! The decision: may this sandbox reach this destination? A pure function of the tenant's policy, the
//! operator's policy and the destination, so every case is testable without a network.

use std::fmt;
use std::net::IpAddr;

use paddock_types::{Cidr, DomainName, EgressRule, NetworkPolicy};
use serde::Serialize;

use super::operator::{OperatorDenial, OperatorPolicy};

/// Where a connection is going: the name the sandbox used (when known: DNS, SNI, `Host`, a proxy
/// request), the address and the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Destination<'a> {
    /// The name, when the sandbox gave one.
    pub name: Option<&'a DomainName>,
    /// The address the connection goes to.
    pub ip: IpAddr,
    /// The TCP port.
    pub port: u16,
}

/// What decided a connection (or a DNS answer), for the audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Rule {
    /// An entry of the operator's deny list.
    OperatorDeny {
        /// The listed network.
        cidr: Cidr,
    },
    /// One of the host's own addresses.
    OperatorHostAddress {
        /// The address.
        ip: IpAddr,
    },
    /// The tenant's deny rule at this index.
    TenantDeny {
        /// Index in the policy's `deny` list.
        index: usize,
    },
    /// The tenant's allow rule at this index.
    TenantAllow {
        /// Index in the policy's `allow` list.
        index: usize,
    },
    /// No allow rule matched (the default).
    NoAllowRule,
    /// No allow rule matched, the approval policy asked a person, and the person approved this
    /// connection.
    Approved,
    /// The name was allowed but the address is not one paddock's DNS answered for it (or the name
    /// does not resolve to it): no DNS rebinding, no connecting to a name's lookalike address.
    NotResolvedForName,
    /// The first bytes of the connection were not readable as TLS or HTTP with a valid name.
    Unreadable {
        /// What was wrong.
        reason: String,
    },
    /// The name does not resolve (or resolves only to denied addresses).
    Unresolvable,
    /// The query type is not A or AAAA, or the request is not one the proxy serves.
    UnsupportedQuery,
    /// A transparent connection whose original destination is unknown (not redirected to us).
    NoOriginalDestination,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::OperatorDeny { cidr } => write!(f, "operator deny {cidr}"),
            Self::OperatorHostAddress { ip } => write!(f, "operator deny host address {ip}"),
            Self::TenantDeny { index } => write!(f, "deny[{index}]"),
            Self::TenantAllow { index } => write!(f, "allow[{index}]"),
            Self::NoAllowRule => f.write_str("no allow rule"),
            Self::Approved => f.write_str("approved by a person"),
            Self::NotResolvedForName => f.write_str("address not resolved for name"),
            Self::Unreadable { reason } => write!(f, "unreadable: {reason}"),
            Self::Unresolvable => f.write_str("unresolvable"),
            Self::UnsupportedQuery => f.write_str("unsupported query"),
            Self::NoOriginalDestination => f.write_str("no original destination"),
        }
    }
}

/// The outcome and the rule that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    /// Whether the connection may proceed.
    pub allowed: bool,
    /// Which rule decided.
    pub rule: Rule,
}

impl Decision {
    /// A refusal by `rule`.
    pub fn deny(rule: Rule) -> Self {
        Self { allowed: false, rule }
    }
    fn allow(index: usize) -> Self {
        Self {
            allowed: true,
            rule: Rule::TenantAllow { index },
        }
    }
}

/// Decide a connection. In order: the operator's deny list (unless an operator exception covers the
/// address and port), then the tenant's deny rules, then the tenant's allow rules; nothing matched
/// means denied. IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry.
pub fn decide(policy: &NetworkPolicy, operator: &OperatorPolicy, dest: &Destination<'_>) -> Decision {
    let ip = dest.ip.to_canonical();
    match operator.denial(ip, dest.port) {
        Some(OperatorDenial::Listed(cidr)) => return Decision::deny(Rule::OperatorDeny { cidr }),
        Some(OperatorDenial::HostAddress(ip)) => return Decision::deny(Rule::OperatorHostAddress { ip }),
        None => {}
    }
    let matches = |r: &EgressRule| {
        r.covers_port(dest.port)
            && match (r.domain(), r.cidr()) {
                (Some(p), _) => dest.name.is_some_and(|n| p.matches(n)),
                (None, Some(c)) => c.contains(ip),
                (None, None) => false,
            }
    };
    if let Some(index) = policy.deny().iter().position(matches) {
        return Decision::deny(Rule::TenantDeny { index });
    }
    match policy.allow().iter().position(matches) {
        Some(index) => Decision::allow(index),
        None => Decision::deny(Rule::NoAllowRule),
    }
}

/// Decide whether paddock's DNS answers for `name` at all (before any address is known): a domain
/// allow rule must match it and no domain deny rule covering every port may. The addresses answered
/// are then filtered by the operator's deny list, and each connection is still decided by [`decide`].
pub fn decide_name(policy: &NetworkPolicy, name: &DomainName) -> Decision {
    let domain_match = |r: &EgressRule| r.domain().is_some_and(|p| p.matches(name));
    if let Some(index) = policy
        .deny()
        .iter()
        .position(|r| r.covers_all_ports() && domain_match(r))
    {
        return Decision::deny(Rule::TenantDeny { index });
    }
    match policy.allow().iter().position(domain_match) {
        Some(index) => Decision::allow(index),
        None => Decision::deny(Rule::NoAllowRule),
    }
}

/// Whether the allow rule that produced `decision` is a domain rule (so the address must be one the
/// name resolved to) rather than an address rule (any name may be used for an allowed address).
pub fn allowed_by_domain(policy: &NetworkPolicy, decision: &Decision) -> bool {
    match decision.rule {
        Rule::TenantAllow { index } => policy.allow().get(index).is_some_and(|r| r.domain().is_some()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use paddock_types::{DomainPattern, EgressTarget, PortRange};
    use proptest::prelude::*;

    use super::*;

    fn domain_rule(p: &str, ports: &[u16]) -> EgressRule {
        EgressRule::new(
            EgressTarget::Domain(p.parse().expect("pattern")),
            ports
                .iter()
                .map(|p| PortRange::single(*p).expect("port"))
                .collect(),
        )
    }
    fn cidr_rule(c: &str) -> EgressRule {
        EgressRule::new(EgressTarget::Cidr(c.parse().expect("cidr")), vec![])
    }
    fn policy(allow: Vec<EgressRule>, deny: Vec<EgressRule>) -> NetworkPolicy {
        NetworkPolicy::new(allow, deny).expect("policy")
    }
    fn name(s: &str) -> DomainName {
        s.parse().expect("name")
    }
    const PUBLIC: IpAddr = IpAddr::V4(Ipv4Addr::new(93, 184, 215, 14));

    #[test]
    fn examples() {
        let op = OperatorPolicy::default();
        let p = policy(
            vec![domain_rule("*.example.com", &[443]), cidr_rule("203.0.113.0/24")],
            vec![domain_rule("bad.example.com", &[])],
        );
        let api = name("api.example.com");
        let bad = name("bad.example.com");
        let d = |n, ip, port| decide(&p, &op, &Destination { name: n, ip, port });
        assert_eq!(d(Some(&api), PUBLIC, 443), Decision::allow(0));
        assert!(allowed_by_domain(&p, &d(Some(&api), PUBLIC, 443)));
        assert_eq!(d(Some(&api), PUBLIC, 80).rule, Rule::NoAllowRule);
        assert_eq!(d(None, PUBLIC, 443).rule, Rule::NoAllowRule);
        assert_eq!(d(Some(&bad), PUBLIC, 443).rule, Rule::TenantDeny { index: 0 });
        let net = "203.0.113.9".parse().expect("ip");
        assert_eq!(d(None, net, 22), Decision::allow(1));
        assert!(!allowed_by_domain(&p, &d(None, net, 22)));
        let meta = "169.254.169.254".parse().expect("ip");
        assert_eq!(
            d(Some(&api), meta, 443).rule,
            Rule::OperatorDeny {
                cidr: "169.254.0.0/16".parse().expect("cidr")
            }
        );
        assert_eq!(decide_name(&p, &api), Decision::allow(0));
        assert_eq!(decide_name(&p, &bad).rule, Rule::TenantDeny { index: 0 });
        assert_eq!(decide_name(&p, &name("example.com")).rule, Rule::NoAllowRule);
        assert!(
            !decide(
                &NetworkPolicy::default(),
                &op,
                &Destination {
                    name: Some(&api),
                    ip: PUBLIC,
                    port: 443
                }
            )
            .allowed
        );
    }

    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?"
    }
    /// A domain name: labels, the last one starting with a letter as top-level domains do (all-digit
    /// labels could otherwise spell an IPv4 literal, such as `1.3.4.9` below a suffix `3.4.9`,
    /// which is no name).
    fn domain() -> impl Strategy<Value = String> {
        (
            prop::collection::vec(label(), 0..3),
            "[a-z]([a-z0-9-]{0,8}[a-z0-9])?",
        )
            .prop_map(|(mut l, tld)| {
                l.push(tld);
                l.join(".")
            })
    }
    fn any_rule() -> impl Strategy<Value = EgressRule> {
        let ports = prop::collection::vec(1u16..=65535, 0..3);
        prop_oneof![
            (domain(), any::<bool>(), ports.clone()).prop_map(|(d, wild, ports)| {
                let p = if wild { format!("*.{d}") } else { d };
                domain_rule(&p, &ports)
            }),
            (any::<u32>(), 0u8..=32, ports).prop_map(|(ip, len, ports)| {
                let net = ipnet::Ipv4Net::new(Ipv4Addr::from(ip), len)
                    .expect("prefix")
                    .trunc();
                EgressRule::new(
                    EgressTarget::Cidr(ipnet::IpNet::V4(net).into()),
                    ports
                        .iter()
                        .map(|p| PortRange::single(*p).expect("port"))
                        .collect(),
                )
            }),
        ]
    }
    fn rules() -> impl Strategy<Value = Vec<EgressRule>> {
        prop::collection::vec(any_rule(), 0..6)
    }

    proptest! {
        #[test]
        fn deny_beats_allow(allow in rules(), deny in rules(), n in domain(), ip in any::<u32>(),
                            port in 1u16..=65535, by_name in any::<bool>(), at in 0usize..6) {
            let op = OperatorPolicy { deny: vec![], ..OperatorPolicy::default() };
            let n = name(&n);
            let ip = IpAddr::V4(Ipv4Addr::from(ip));
            let matching = if by_name { domain_rule(n.as_str(), &[port]) } else {
                EgressRule::new(EgressTarget::Cidr(ipnet::IpNet::from(ip).into()), vec![])
            };
            let (mut allow, mut deny) = (allow, deny);
            allow.insert(at.min(allow.len()), matching.clone());
            deny.insert(at.min(deny.len()), matching);
            let d = decide(&policy(allow, deny), &op, &Destination { name: Some(&n), ip, port });
            let by_tenant_deny = matches!(d.rule, Rule::TenantDeny { .. });
            prop_assert!(!d.allowed);
            prop_assert!(by_tenant_deny);
        }

        #[test]
        fn operator_deny_beats_tenant_allow(allow in rules(), n in domain(), port in 1u16..=65535,
                                            which in 0usize..6, low in any::<u16>()) {
            let op = OperatorPolicy::default();
            let [a, b] = low.to_be_bytes();
            let ip: IpAddr = match which {
                0 => Ipv4Addr::new(169, 254, a, b).into(),
                1 => Ipv4Addr::new(10, a, b, 1).into(),
                2 => Ipv4Addr::new(127, 0, a, b).into(),
                3 => Ipv4Addr::new(192, 168, a, b).into(),
                4 => Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, low, 0x254).into(),
                _ => Ipv4Addr::new(172, 16 | (a & 15), b, 1).to_ipv6_mapped().into(),
            };
            let n = name(&n);
            let mut allow = allow;
            allow.push(domain_rule(n.as_str(), &[]));
            allow.push(cidr_rule("0.0.0.0/0"));
            allow.push(cidr_rule("::/0"));
            let d = decide(&policy(allow, vec![]), &op, &Destination { name: Some(&n), ip, port });
            let by_operator = matches!(d.rule, Rule::OperatorDeny { .. });
            prop_assert!(!d.allowed);
            prop_assert!(by_operator, "{:?}", d.rule);
        }

        #[test]
        fn wildcard_never_matches_lookalikes(front in label(), suffix in domain(), sub in label()) {
            let pattern: DomainPattern = format!("*.{suffix}").parse().expect("pattern");
            let lookalike = name(&format!("{front}{suffix}"));
            prop_assert!(!pattern.matches(&lookalike));
            prop_assert!(!pattern.matches(&name(&suffix)));
            let below = name(&format!("{sub}.{suffix}"));
            prop_assert!(pattern.matches(&below));
            let p = policy(vec![EgressRule::new(EgressTarget::Domain(pattern), vec![])], vec![]);
            let op = OperatorPolicy::default();
            let by_ip = decide(&p, &op, &Destination { name: Some(&lookalike), ip: PUBLIC, port: 443 });
            prop_assert!(!by_ip.allowed);
            let by_name = decide_name(&p, &lookalike);
            prop_assert!(!by_name.allowed);
        }

        #[test]
        fn mapped_ipv6_is_judged_as_ipv4(allow in rules(), deny in rules(), ip in any::<u32>(),
                                         port in 1u16..=65535, exempt in any::<bool>()) {
            let mut op = OperatorPolicy::default();
            let v4 = Ipv4Addr::from(ip);
            if exempt {
                op.allow.push(super::super::OperatorAllow {
                    cidr: ipnet::IpNet::from(IpAddr::V4(v4)).into(), ports: vec![], reason: "test".into(),
                });
            }
            let p = policy(allow, deny);
            let a = decide(&p, &op, &Destination { name: None, ip: v4.into(), port });
            let b = decide(&p, &op, &Destination { name: None, ip: v4.to_ipv6_mapped().into(), port });
            prop_assert_eq!(a, b);
        }
    }
}
