//! A sandbox's network policy: which destinations it may reach, by domain or by address, and on which
//! ports. The wire model of the policy a tenant sets at create time and changes live.
//!
//! Everything here is parsed once (domain patterns, CIDRs, port ranges), so the egress proxy's pure
//! decision function (`paddock-egress`) never sees an unvalidated rule. An empty policy allows nothing.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Most rules a policy may hold (each list): decisions scan them linearly.
pub const MAX_RULES: usize = 1024;

/// A DNS name: lowercase, without a trailing dot, labels of `[a-z0-9_-]` (1 to 63 bytes), at most 253
/// bytes. Never an IP address literal, so a name and an address are never confused.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct DomainName(String);

/// Why a string is not a domain name, a domain pattern, a CIDR or a port range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct NetworkPolicyError {
    what: &'static str,
    value: String,
    reason: &'static str,
}

impl NetworkPolicyError {
    fn new(what: &'static str, value: &str, reason: &'static str) -> Self {
        let mut value = value.to_owned();
        value.truncate(300);
        Self { what, value, reason }
    }
}

impl DomainName {
    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for DomainName {
    type Err = NetworkPolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| NetworkPolicyError::new("domain name", s, reason);
        let name = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        if name.is_empty() {
            return Err(err("empty"));
        }
        if name.len() > 253 {
            return Err(err("longer than 253 bytes"));
        }
        if name.parse::<IpAddr>().is_ok() {
            return Err(err("an IP address, not a name"));
        }
        for label in name.split('.') {
            if label.is_empty() {
                return Err(err("empty label"));
            }
            if label.len() > 63 {
                return Err(err("label longer than 63 bytes"));
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
            {
                return Err(err("labels may only hold letters, digits, '-' and '_'"));
            }
        }
        Ok(Self(name))
    }
}

impl TryFrom<String> for DomainName {
    type Error = NetworkPolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<DomainName> for String {
    fn from(n: DomainName) -> Self {
        n.0
    }
}

impl fmt::Display for DomainName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `example.com` (that name only), `*.example.com` (any name below it, at any depth, but neither
/// `example.com` itself nor a lookalike such as `evilexample.com`), or `*` (any name: what "the
/// internet" means for names; addresses the operator's deny list closes stay closed).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum DomainPattern {
    /// Exactly this name.
    Exact(DomainName),
    /// Any name with at least one more label in front of this suffix.
    Below(DomainName),
    /// Any name at all.
    Any,
}

impl DomainPattern {
    /// Whether `name` matches the pattern.
    pub fn matches(&self, name: &DomainName) -> bool {
        match self {
            Self::Exact(n) => n == name,
            Self::Below(suffix) => name
                .as_str()
                .strip_suffix(suffix.as_str())
                .is_some_and(|front| front.len() > 1 && front.ends_with('.')),
            Self::Any => true,
        }
    }
}

impl FromStr for DomainPattern {
    type Err = NetworkPolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "*" {
            return Ok(Self::Any);
        }
        match s.strip_prefix("*.") {
            Some(suffix) => Ok(Self::Below(suffix.parse()?)),
            None if s.contains('*') => Err(NetworkPolicyError::new(
                "domain pattern",
                s,
                "a wildcard is only allowed as a leading '*.' or as '*' alone",
            )),
            None => Ok(Self::Exact(s.parse()?)),
        }
    }
}

impl TryFrom<String> for DomainPattern {
    type Error = NetworkPolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<DomainPattern> for String {
    fn from(p: DomainPattern) -> Self {
        p.to_string()
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(n) => write!(f, "{n}"),
            Self::Below(n) => write!(f, "*.{n}"),
            Self::Any => f.write_str("*"),
        }
    }
}

/// An IP network in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`) or a single address (`/32` or
/// `/128` implied). Host bits must be zero: `10.0.0.1/8` is refused as a likely mistake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr(IpNet);

impl Cidr {
    /// The network.
    pub fn net(&self) -> IpNet {
        self.0
    }
    /// Whether `ip` lies in the network (IPv4-mapped IPv6 addresses are compared as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(&ip.to_canonical())
    }
}

impl From<IpNet> for Cidr {
    fn from(net: IpNet) -> Self {
        Self(net.trunc())
    }
}

impl FromStr for Cidr {
    type Err = NetworkPolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| NetworkPolicyError::new("CIDR", s, reason);
        let net = match s.parse::<IpNet>() {
            Ok(net) => net,
            Err(_) => s
                .parse::<IpAddr>()
                .map(IpNet::from)
                .map_err(|_| err("not an address or ADDRESS/PREFIX"))?,
        };
        if net.trunc() != net {
            return Err(err("host bits are set"));
        }
        Ok(Self(net))
    }
}

impl TryFrom<String> for Cidr {
    type Error = NetworkPolicyError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> Self {
        c.to_string()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A TCP port or an inclusive range of them: `443` or `"8000-8100"` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "PortRangeWire", into = "String")]
pub struct PortRange {
    first: u16,
    last: u16,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PortRangeWire {
    Number(u64),
    Text(String),
}

impl PortRange {
    /// One port.
    pub fn single(port: u16) -> Result<Self, NetworkPolicyError> {
        Self::new(port, port)
    }
    /// `first..=last`; port 0 is refused.
    pub fn new(first: u16, last: u16) -> Result<Self, NetworkPolicyError> {
        let err = |reason| NetworkPolicyError::new("port range", &format!("{first}-{last}"), reason);
        if first == 0 {
            return Err(err("port 0 is not a destination"));
        }
        if first > last {
            return Err(err("first port is above the last"));
        }
        Ok(Self { first, last })
    }
    /// Whether `port` is in the range.
    pub fn contains(&self, port: u16) -> bool {
        (self.first..=self.last).contains(&port)
    }
    /// Whether some port is in both ranges.
    pub fn overlaps(&self, other: &PortRange) -> bool {
        self.first <= other.last && other.first <= self.last
    }
}

impl FromStr for PortRange {
    type Err = NetworkPolicyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let port = |p: &str| {
            p.parse::<u16>()
                .map_err(|_| NetworkPolicyError::new("port range", s, "ports are numbers 1-65535"))
        };
        match s.split_once('-') {
            Some((a, b)) => Self::new(port(a)?, port(b)?),
            None => Self::single(port(s)?),
        }
    }
}

impl TryFrom<PortRangeWire> for PortRange {
    type Error = NetworkPolicyError;
    fn try_from(w: PortRangeWire) -> Result<Self, Self::Error> {
        match w {
            PortRangeWire::Number(n) => u16::try_from(n)
                .map_err(|_| NetworkPolicyError::new("port range", &n.to_string(), "above 65535"))
                .and_then(Self::single),
            PortRangeWire::Text(s) => s.parse(),
        }
    }
}

impl From<PortRange> for String {
    fn from(p: PortRange) -> Self {
        p.to_string()
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// What a rule matches: a domain pattern or an address range.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EgressTarget {
    /// Destinations known by a name matching the pattern (the name the sandbox resolved, sent as TLS
    /// SNI, HTTP `Host` or in a proxy request).
    Domain(DomainPattern),
    /// Destinations whose address lies in the network, whatever name was used.
    Cidr(Cidr),
}

/// One rule: a target and, optionally, the ports it covers (all ports when empty).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "EgressRuleWire", into = "EgressRuleWire")]
pub struct EgressRule {
    /// Exactly one of `domain` and `cidr`: a name (`api.example.com`) or `*.suffix` pattern.
    #[schema(value_type = Option<String>, example = "*.example.com")]
    domain: Option<DomainPattern>,
    /// Exactly one of `domain` and `cidr`: an address or network (`203.0.113.0/24`).
    #[schema(value_type = Option<String>, example = "203.0.113.0/24")]
    cidr: Option<Cidr>,
    /// Ports or ranges (`443`, `"8000-8100"`); every port when absent or empty.
    #[schema(value_type = Vec<String>, example = json!(["443", "8000-8100"]))]
    ports: Vec<PortRange>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EgressRuleWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    domain: Option<DomainPattern>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cidr: Option<Cidr>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ports: Vec<PortRange>,
}

impl TryFrom<EgressRuleWire> for EgressRule {
    type Error = NetworkPolicyError;
    fn try_from(w: EgressRuleWire) -> Result<Self, Self::Error> {
        match (&w.domain, &w.cidr) {
            (Some(_), None) | (None, Some(_)) => Ok(Self {
                domain: w.domain,
                cidr: w.cidr,
                ports: w.ports,
            }),
            _ => Err(NetworkPolicyError::new(
                "egress rule",
                "",
                "give exactly one of domain and cidr",
            )),
        }
    }
}

impl From<EgressRule> for EgressRuleWire {
    fn from(r: EgressRule) -> Self {
        Self {
            domain: r.domain,
            cidr: r.cidr,
            ports: r.ports,
        }
    }
}

impl EgressRule {
    /// A rule for `target` on `ports` (all ports when empty).
    pub fn new(target: EgressTarget, ports: Vec<PortRange>) -> Self {
        let (domain, cidr) = match target {
            EgressTarget::Domain(d) => (Some(d), None),
            EgressTarget::Cidr(c) => (None, Some(c)),
        };
        Self { domain, cidr, ports }
    }
    /// What the rule matches.
    pub fn target(&self) -> EgressTarget {
        match (&self.domain, &self.cidr) {
            (Some(d), _) => EgressTarget::Domain(d.clone()),
            (None, Some(c)) => EgressTarget::Cidr(*c),
            (None, None) => unreachable!("built only with exactly one target"),
        }
    }
    /// The domain pattern, for a domain rule.
    pub fn domain(&self) -> Option<&DomainPattern> {
        self.domain.as_ref()
    }
    /// The network, for an address rule.
    pub fn cidr(&self) -> Option<Cidr> {
        self.cidr
    }
    /// The ports it covers (every port when empty).
    pub fn ports(&self) -> &[PortRange] {
        &self.ports
    }
    /// Whether the rule covers `port`.
    pub fn covers_port(&self, port: u16) -> bool {
        self.ports.is_empty() || self.ports.iter().any(|r| r.contains(port))
    }
    /// Whether the rule covers every port.
    pub fn covers_all_ports(&self) -> bool {
        self.ports.is_empty()
    }
}

/// A sandbox's egress policy. Deny rules override allow rules; nothing is reachable unless allowed.
/// The operator's deny list (link-local, metadata, private ranges, the host) applies on top and no
/// tenant rule overrides it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "NetworkPolicyWire", into = "NetworkPolicyWire")]
pub struct NetworkPolicy {
    /// Destinations the sandbox may reach.
    allow: Vec<EgressRule>,
    /// Destinations it may not reach even when an allow rule matches.
    deny: Vec<EgressRule>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkPolicyWire {
    #[serde(default)]
    allow: Vec<EgressRule>,
    #[serde(default)]
    deny: Vec<EgressRule>,
}

impl TryFrom<NetworkPolicyWire> for NetworkPolicy {
    type Error = NetworkPolicyError;
    fn try_from(w: NetworkPolicyWire) -> Result<Self, Self::Error> {
        Self::new(w.allow, w.deny)
    }
}

impl From<NetworkPolicy> for NetworkPolicyWire {
    fn from(p: NetworkPolicy) -> Self {
        Self {
            allow: p.allow,
            deny: p.deny,
        }
    }
}

impl NetworkPolicy {
    /// A policy from its rules; at most [`MAX_RULES`] in each list.
    pub fn new(allow: Vec<EgressRule>, deny: Vec<EgressRule>) -> Result<Self, NetworkPolicyError> {
        if allow.len() > MAX_RULES || deny.len() > MAX_RULES {
            return Err(NetworkPolicyError::new(
                "network policy",
                "",
                "more than 1024 rules in a list",
            ));
        }
        Ok(Self { allow, deny })
    }
    /// The allow rules, in order.
    pub fn allow(&self) -> &[EgressRule] {
        &self.allow
    }
    /// The deny rules, in order.
    pub fn deny(&self) -> &[EgressRule] {
        &self.deny
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> DomainName {
        s.parse().expect("valid name")
    }

    #[test]
    fn names_are_normalized_and_checked() {
        assert_eq!(name("Api.Example.COM.").as_str(), "api.example.com");
        for bad in [
            "",
            ".",
            "a..b",
            "a b.com",
            "1.2.3.4",
            "::1",
            "é.com",
            &"a".repeat(64),
        ] {
            assert!(bad.parse::<DomainName>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn wildcard_matches_below_the_suffix_only() {
        let p: DomainPattern = "*.example.com".parse().expect("pattern");
        assert!(p.matches(&name("a.example.com")));
        assert!(p.matches(&name("a.b.example.com")));
        assert!(!p.matches(&name("example.com")));
        assert!(!p.matches(&name("evilexample.com")));
        assert!(!p.matches(&name("example.com.evil.net")));
        let exact: DomainPattern = "example.com".parse().expect("pattern");
        assert!(exact.matches(&name("EXAMPLE.com")));
        assert!(!exact.matches(&name("a.example.com")));
        // A lone `*` is every name (E2B's allow-all spelling), shown back as written.
        let any: DomainPattern = "*".parse().expect("pattern");
        assert_eq!(any, DomainPattern::Any);
        assert!(any.matches(&name("a.example.com")) && any.matches(&name("localhost")));
        assert_eq!(any.to_string(), "*");
        for bad in ["*.", "a.*.com", "*example.com", "**.com", "* ", "*.*"] {
            assert!(bad.parse::<DomainPattern>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn cidrs_and_ports_parse() {
        let c: Cidr = "10.0.0.0/8".parse().expect("cidr");
        assert!(c.contains("10.1.2.3".parse().expect("ip")));
        assert!(c.contains("::ffff:10.1.2.3".parse().expect("ip")));
        assert_eq!(
            "192.0.2.1".parse::<Cidr>().expect("cidr").to_string(),
            "192.0.2.1/32"
        );
        assert!("10.0.0.1/8".parse::<Cidr>().is_err());
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert!("8000-8100".parse::<PortRange>().expect("range").contains(8050));
        let range = |s: &str| s.parse::<PortRange>().expect("range");
        assert!(range("8000-8100").overlaps(&range("8100-9000")));
        assert!(range("443").overlaps(&range("1-65535")) && range("1-65535").overlaps(&range("443")));
        assert!(!range("8000-8100").overlaps(&range("8101-9000")) && !range("80").overlaps(&range("443")));
        for bad in ["0", "70000", "9-1", "a", "1-", "-1"] {
            assert!(bad.parse::<PortRange>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn policies_parse_and_refuse_bad_rules() {
        let p: NetworkPolicy = serde_json::from_str(
            r#"{"allow":[{"domain":"*.example.com","ports":[443,"8000-8100"]},{"cidr":"203.0.113.0/24"}],
                "deny":[{"domain":"bad.example.com"}]}"#,
        )
        .expect("policy");
        assert_eq!(p.allow().len(), 2);
        assert!(p.allow()[0].covers_port(8080) && !p.allow()[0].covers_port(80));
        assert!(p.allow()[1].covers_all_ports());
        for bad in [
            r#"{"allow":[{"domain":"a.com","cidr":"10.0.0.0/8"}]}"#,
            r#"{"allow":[{"ports":[443]}]}"#,
            r#"{"allow":[{"domain":"a.com","port":443}]}"#,
            r#"{"allow":[{"domain":"a.com","ports":[0]}]}"#,
            r#"{"allow":[{"domain":"a.com","ports":[65536]}]}"#,
            r#"{"allw":[]}"#,
        ] {
            assert!(
                serde_json::from_str::<NetworkPolicy>(bad).is_err(),
                "{bad} accepted"
            );
        }
        assert_eq!(
            serde_json::from_str::<NetworkPolicy>("{}").expect("empty"),
            NetworkPolicy::default()
        );
    }

    /// The wire shape of a policy is a contract: frozen by `tests/golden/network_policy.json`.
    #[test]
    fn policy_wire_shape_matches_the_golden_file() {
        let golden = include_str!("../tests/golden/network_policy.json");
        let parsed: NetworkPolicy = serde_json::from_str(golden).expect("golden parses");
        let again = serde_json::to_string_pretty(&parsed).expect("serialize");
        assert_eq!(again.trim_end(), golden.trim_end());
    }
}
