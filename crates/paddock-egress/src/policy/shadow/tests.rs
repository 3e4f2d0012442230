use std::net::{IpAddr, Ipv4Addr};

use ipnet::Ipv4Net;
use paddock_types::{EgressRule, EgressTarget, NetworkPolicy, PortRange};
use proptest::prelude::*;

use super::*;
use crate::policy::{decide, Destination, OperatorAllow, OperatorDeny, Rule};

fn ports(list: &[(u16, u16)]) -> Vec<PortRange> {
    list.iter()
        .map(|(a, b)| PortRange::new(*a, *b).expect("ports"))
        .collect()
}
fn cidr_rule(c: &str, p: &[(u16, u16)]) -> EgressRule {
    EgressRule::new(EgressTarget::Cidr(c.parse().expect("cidr")), ports(p))
}
fn domain_rule(d: &str) -> EgressRule {
    EgressRule::new(EgressTarget::Domain(d.parse().expect("pattern")), vec![])
}
fn allow(rules: Vec<EgressRule>) -> NetworkPolicy {
    NetworkPolicy::new(rules, vec![]).expect("policy")
}
fn exception(c: &str, p: &[(u16, u16)]) -> OperatorAllow {
    OperatorAllow {
        cidr: c.parse().expect("cidr"),
        ports: ports(p),
        reason: "test".into(),
    }
}
/// `(index, denied network or address, reason)` of each shadowed rule.
fn judged(policy: &NetworkPolicy, op: &OperatorPolicy) -> Vec<(usize, String, String)> {
    shadowed_allow_rules(policy, op)
        .into_iter()
        .map(|s| {
            let denied = match s.denial {
                OperatorDenial::Listed(c) => c.to_string(),
                OperatorDenial::HostAddress(ip) => ip.to_string(),
            };
            (s.index, denied, s.reason)
        })
        .collect()
}

/// The default deny list, one rule at a time: the rules it makes useless and the ones it leaves.
#[test]
fn the_default_deny_list_shadows_rules_inside_it_only() {
    let op = OperatorPolicy::default();
    let golden: &[(&str, Option<(&str, &str)>)] = &[
        ("10.1.2.0/24", Some(("10.0.0.0/8", "private (RFC 1918)"))),
        ("10.0.0.0/8", Some(("10.0.0.0/8", "private (RFC 1918)"))),
        ("172.20.0.0/16", Some(("172.16.0.0/12", "private (RFC 1918)"))),
        ("192.168.1.1", Some(("192.168.0.0/16", "private (RFC 1918)"))),
        (
            "169.254.169.254",
            Some(("169.254.0.0/16", "link-local, cloud metadata (169.254.169.254)")),
        ),
        ("127.0.0.1", Some(("127.0.0.0/8", "loopback: the host itself"))),
        ("::1", Some(("::1/128", "loopback: the host itself"))),
        (
            "fd00:ec2::254",
            Some(("fc00::/7", "unique local, cloud metadata (fd00:ec2::254)")),
        ),
        ("fe80::/64", Some(("fe80::/10", "link-local"))),
        (
            "100.64.0.0/10",
            Some(("100.64.0.0/10", "carrier-grade NAT (RFC 6598)")),
        ),
        // Overlapping a denied network is not lying inside it: public addresses stay reachable.
        ("0.0.0.0/0", None),
        ("::/0", None),
        ("10.0.0.0/7", None),
        ("160.0.0.0/3", None),
        ("203.0.113.0/24", None),
        ("8.8.8.8", None),
        ("2606:4700::/32", None),
    ];
    for (cidr, expected) in golden {
        let got = judged(&allow(vec![cidr_rule(cidr, &[])]), &op);
        let expected: Vec<_> = expected
            .iter()
            .map(|(d, r)| (0, (*d).to_owned(), (*r).to_owned()))
            .collect();
        assert_eq!(got, expected, "{cidr}");
    }
}

#[test]
fn domain_rules_are_never_judged_and_indexes_are_the_policys() {
    let op = OperatorPolicy::default();
    let p = allow(vec![
        domain_rule("localhost"),
        cidr_rule("203.0.113.0/24", &[]),
        domain_rule("*"),
        cidr_rule("169.254.169.254", &[(80, 80)]),
        cidr_rule("192.168.0.0/24", &[]),
    ]);
    let got: Vec<usize> = shadowed_allow_rules(&p, &op).iter().map(|s| s.index).collect();
    assert_eq!(got, [3, 4]);
    let first = &shadowed_allow_rules(&p, &op)[0];
    assert_eq!(first.cidr.to_string(), "169.254.169.254/32");
    assert!(
        first.to_string().contains("169.254.0.0/16")
            && first.to_string().contains("link-local, cloud metadata"),
        "{first}"
    );
    assert!(shadowed_allow_rules(&NetworkPolicy::default(), &op).is_empty());
}

#[test]
fn exceptions_keep_a_rule_they_reach_into_on_one_of_its_ports() {
    let mut op = OperatorPolicy::default();
    op.allow.push(exception("10.1.2.3", &[(8080, 8080)]));
    let shadowed_under = |op: &OperatorPolicy, rule| !shadowed_allow_rules(&allow(vec![rule]), op).is_empty();
    let shadowed = |rule| shadowed_under(&op, rule);
    // The exception lies inside the rule's network, on a port the rule covers.
    assert!(!shadowed(cidr_rule("10.1.2.0/24", &[])));
    assert!(!shadowed(cidr_rule("10.1.2.0/24", &[(8000, 8100)])));
    assert!(!shadowed(cidr_rule("10.1.2.3", &[(443, 443), (8080, 8080)])));
    // Every port of the rule lies outside the exception's.
    assert!(shadowed(cidr_rule("10.1.2.0/24", &[(443, 443)])));
    assert!(shadowed(cidr_rule("10.1.2.3", &[(8081, 9000)])));
    // The exception lies outside the rule's network.
    assert!(shadowed(cidr_rule("10.1.3.0/24", &[])));
    assert!(shadowed(cidr_rule("10.1.2.4", &[(8080, 8080)])));
    // An exception on every port, around the rule.
    let mut wider = op.clone();
    wider.allow.push(exception("10.1.0.0/16", &[]));
    assert!(!shadowed_under(&wider, cidr_rule("10.1.3.0/24", &[(22, 22)])));
    assert!(shadowed_under(&wider, cidr_rule("10.2.0.0/16", &[])));
}

#[test]
fn the_hosts_own_addresses_shadow_exactly_their_address() {
    let host: IpAddr = "203.0.113.7".parse().expect("ip");
    let mut op = OperatorPolicy {
        host_addresses: vec![host, "::ffff:198.51.100.1".parse().expect("ip")],
        ..OperatorPolicy::default()
    };
    let p = allow(vec![
        cidr_rule("203.0.113.7", &[]),
        cidr_rule("203.0.113.0/24", &[]),
        cidr_rule("198.51.100.1", &[]),
    ]);
    let expected = |ip: &str| (ip.to_owned(), HOST_ADDRESS_REASON.to_owned());
    let got: Vec<_> = judged(&p, &op).into_iter().map(|(i, d, r)| (i, (d, r))).collect();
    assert_eq!(
        got,
        [(0, expected("203.0.113.7")), (2, expected("::ffff:198.51.100.1"))]
    );
    op.allow.push(exception("203.0.113.7", &[(22, 22)]));
    assert_eq!(judged(&p, &op).len(), 1);
}

// Property tests: random operator policies and tenant policies in a small address and port space
// (mostly inside 10.0.0.0/8, ports 1 to 16), so that nesting, exceptions and port overlaps are
// common. Every value is a `prop_map` of independent numbers, so a failure shrinks to small
// networks and few rules and stays a valid case while shrinking.

/// Ports 1..=16 in the generators' ranges, and a few outside them.
const PORTS: [u16; 19] = [
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 443, 65535,
];

fn net() -> impl Strategy<Value = Ipv4Net> {
    (any::<u32>(), 6u8..=32).prop_map(|(bits, len)| {
        let addr = Ipv4Addr::from(0x0a00_0000 | (bits & 0x00ff_ffff));
        Ipv4Net::new(addr, len).expect("prefix").trunc()
    })
}
fn port_list() -> impl Strategy<Value = Vec<PortRange>> {
    prop::collection::vec((1u16..=12, 0u16..4), 0..3).prop_map(|l| {
        l.into_iter()
            .map(|(a, len)| PortRange::new(a, a + len).expect("ports"))
            .collect()
    })
}
fn cidr_of(n: Ipv4Net) -> Cidr {
    IpNet::V4(n).into()
}
fn operator() -> impl Strategy<Value = OperatorPolicy> {
    (
        any::<bool>(),
        prop::collection::vec(net(), 0..4),
        prop::collection::vec((net(), port_list()), 0..3),
        prop::collection::vec(any::<u32>(), 0..2),
    )
        .prop_map(|(defaults, deny, allow, hosts)| {
            let mut op = OperatorPolicy {
                deny: if defaults {
                    OperatorPolicy::default_deny()
                } else {
                    Vec::new()
                },
                ..OperatorPolicy::default()
            };
            op.deny.extend(deny.into_iter().map(|n| OperatorDeny {
                cidr: cidr_of(n),
                reason: "generated".into(),
            }));
            op.allow = allow
                .into_iter()
                .map(|(n, ports)| OperatorAllow {
                    cidr: cidr_of(n),
                    ports,
                    reason: "generated".into(),
                })
                .collect();
            op.host_addresses = hosts
                .into_iter()
                .map(|h| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (h & 0x00ff_ffff))))
                .collect();
            op
        })
}
fn tenant_rule() -> impl Strategy<Value = EgressRule> {
    prop_oneof![
        4 => (net(), port_list()).prop_map(|(n, p)| EgressRule::new(EgressTarget::Cidr(cidr_of(n)), p)),
        1 => Just(domain_rule("*")),
    ]
}
fn tenant() -> impl Strategy<Value = NetworkPolicy> {
    (
        prop::collection::vec(tenant_rule(), 1..6),
        prop::collection::vec(tenant_rule(), 0..2),
    )
        .prop_map(|(allow, deny)| NetworkPolicy::new(allow, deny).expect("policy"))
}

/// An address of `net` from `bits` (its host part), as IPv4 and as IPv4-mapped IPv6.
fn addresses_in(net: IpNet, bits: u32) -> Vec<IpAddr> {
    match net {
        IpNet::V4(n) => {
            let ip = Ipv4Addr::from(u32::from(n.network()) | (bits & u32::from(n.hostmask())));
            vec![ip.into(), ip.to_ipv6_mapped().into()]
        }
        IpNet::V6(_) => Vec::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// A shadowed rule lets nothing through: for addresses of its network (random ones, the ones an
    /// exception or a host address shares with it) on every port, `decide` never answers "allowed
    /// by this rule".
    #[test]
    fn a_shadowed_rule_allows_no_connection(op in operator(), policy in tenant(),
                                             samples in prop::collection::vec(any::<u32>(), 1..6)) {
        for s in shadowed_allow_rules(&policy, &op) {
            let c = s.cidr.net();
            let mut candidates = Vec::new();
            for bits in &samples {
                candidates.extend(addresses_in(c, *bits));
                for a in op.allow.iter().filter(|a| nets_overlap(a.cidr.net(), c)) {
                    let inner = if c.contains(&a.cidr.net()) { a.cidr.net() } else { c };
                    candidates.extend(addresses_in(inner, *bits));
                }
            }
            candidates.extend(op.host_addresses.iter().copied());
            for ip in candidates {
                for port in PORTS {
                    let d = decide(&policy, &op, &Destination { name: None, ip, port });
                    prop_assert_ne!(&d.rule, &Rule::TenantAllow { index: s.index },
                        "{} let {}:{} through", s, ip, port);
                }
            }
        }
    }

    /// The other way round, where the judgement is exact: an address rule inside one deny entry
    /// that is kept has an address and port the operator lets through (an exception's).
    #[test]
    fn a_kept_rule_inside_a_denied_network_can_take_effect(op in operator(), policy in tenant()) {
        let shadowed: Vec<usize> = shadowed_allow_rules(&policy, &op).iter().map(|s| s.index).collect();
        for (index, rule) in policy.allow().iter().enumerate() {
            let Some(c) = rule.cidr() else { continue };
            let inside = op.deny.iter().any(|d| d.cidr.net().contains(&c.net()));
            if !inside || shadowed.contains(&index) {
                continue;
            }
            let witness = op.allow.iter().filter(|a| nets_overlap(a.cidr.net(), c.net())).any(|a| {
                let inner = if c.net().contains(&a.cidr.net()) { a.cidr } else { c };
                addresses_in(inner.net(), 0).into_iter().any(|ip| {
                    PORTS.iter().any(|&port| rule.covers_port(port) && op.denial(ip, port).is_none())
                })
            });
            prop_assert!(witness, "allow[{}] {} kept with no exception reaching it", index, c);
        }
    }
}
