//! The operator's egress configuration: a deny list no tenant policy can override, explicit
//! exceptions to it, and a static host map used instead of DNS (for tests and pinned deployments).

use std::collections::BTreeMap;
use std::net::IpAddr;

use paddock_types::{Cidr, DomainName, PortRange};
use serde::{Deserialize, Serialize};

/// One entry of the operator's deny list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorDeny {
    /// The network no sandbox may reach.
    pub cidr: Cidr,
    /// Why (for the configuration's reader and the audit).
    pub reason: String,
}

/// An explicit exception to the deny list: the network (on these ports, all when empty) is treated as
/// not denied by the operator. The tenant's policy must still allow it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorAllow {
    /// The network excepted from the deny list.
    pub cidr: Cidr,
    /// Ports the exception covers; every port when empty.
    #[serde(default)]
    pub ports: Vec<PortRange>,
    /// Why.
    pub reason: String,
}

/// The operator's part of every decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorPolicy {
    /// Networks no sandbox may reach; [`OperatorPolicy::default_deny`] when absent.
    #[serde(default = "OperatorPolicy::default_deny")]
    pub deny: Vec<OperatorDeny>,
    /// The host's own addresses (denied like the list above; filled in by the control plane at start).
    #[serde(default)]
    pub host_addresses: Vec<IpAddr>,
    /// Exceptions to the deny list (and to `host_addresses`).
    #[serde(default)]
    pub allow: Vec<OperatorAllow>,
    /// Names answered from this map instead of the system resolver.
    #[serde(default)]
    pub hosts: BTreeMap<DomainName, Vec<IpAddr>>,
}

impl Default for OperatorPolicy {
    fn default() -> Self {
        Self {
            deny: Self::default_deny(),
            host_addresses: Vec::new(),
            allow: Vec::new(),
            hosts: BTreeMap::new(),
        }
    }
}

/// Why the operator denies an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorDenial {
    /// A deny-list entry.
    Listed(Cidr),
    /// One of the host's own addresses.
    HostAddress(IpAddr),
}

impl OperatorPolicy {
    /// Link-local and cloud metadata, private and shared ranges, loopback, multicast, reserved and
    /// unspecified addresses, for IPv4 and IPv6.
    pub fn default_deny() -> Vec<OperatorDeny> {
        [
            ("0.0.0.0/8", "this network / unspecified"),
            ("10.0.0.0/8", "private (RFC 1918)"),
            ("100.64.0.0/10", "carrier-grade NAT (RFC 6598)"),
            ("127.0.0.0/8", "loopback: the host itself"),
            ("169.254.0.0/16", "link-local, cloud metadata (169.254.169.254)"),
            ("172.16.0.0/12", "private (RFC 1918)"),
            ("192.0.0.0/24", "IETF protocol assignments"),
            ("192.168.0.0/16", "private (RFC 1918)"),
            ("198.18.0.0/15", "benchmarking (RFC 2544)"),
            ("224.0.0.0/4", "multicast"),
            ("240.0.0.0/4", "reserved and broadcast"),
            ("::/128", "unspecified"),
            ("::1/128", "loopback: the host itself"),
            ("64:ff9b:1::/48", "local-use NAT64 (RFC 8215)"),
            ("fc00::/7", "unique local, cloud metadata (fd00:ec2::254)"),
            ("fe80::/10", "link-local"),
            ("ff00::/8", "multicast"),
        ]
        .into_iter()
        .map(|(cidr, reason)| OperatorDeny {
            cidr: cidr.parse().expect("built-in CIDRs are valid"),
            reason: reason.to_owned(),
        })
        .collect()
    }

    /// Whether the operator refuses `ip:port`, and why. An exception covering the address and port
    /// lifts the denial. IPv4-mapped IPv6 addresses are judged as IPv4.
    pub fn denial(&self, ip: IpAddr, port: u16) -> Option<OperatorDenial> {
        let ip = ip.to_canonical();
        if self
            .allow
            .iter()
            .any(|a| a.cidr.contains(ip) && (a.ports.is_empty() || a.ports.iter().any(|p| p.contains(port))))
        {
            return None;
        }
        self.denial_ignoring_exceptions(ip)
    }

    /// Whether the operator refuses `ip` on every port (used to filter DNS answers, which carry no
    /// port): denied and no exception covers any port of it.
    pub fn denies_every_port(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.denial_ignoring_exceptions(ip).is_some() && !self.allow.iter().any(|a| a.cidr.contains(ip))
    }

    fn denial_ignoring_exceptions(&self, ip: IpAddr) -> Option<OperatorDenial> {
        if let Some(d) = self.deny.iter().find(|d| d.cidr.contains(ip)) {
            return Some(OperatorDenial::Listed(d.cidr));
        }
        self.host_addresses
            .iter()
            .find(|h| h.to_canonical() == ip)
            .map(|h| OperatorDenial::HostAddress(*h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn defaults_deny_metadata_private_and_loopback() {
        let op = OperatorPolicy::default();
        for denied in [
            "169.254.169.254",
            "fd00:ec2::254",
            "10.1.2.3",
            "192.168.1.1",
            "172.31.0.1",
            "127.0.0.1",
            "::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "fe80::1",
            "0.0.0.0",
        ] {
            assert!(op.denial(ip(denied), 443).is_some(), "{denied} not denied");
            assert!(op.denies_every_port(ip(denied)));
        }
        for public in ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"] {
            assert_eq!(op.denial(ip(public), 443), None, "{public} denied");
        }
    }

    #[test]
    fn exceptions_lift_the_deny_list_on_their_ports_only() {
        let mut op = OperatorPolicy {
            host_addresses: vec![ip("203.0.113.7")],
            ..OperatorPolicy::default()
        };
        assert_eq!(
            op.denial(ip("203.0.113.7"), 80),
            Some(OperatorDenial::HostAddress(ip("203.0.113.7")))
        );
        op.allow.push(OperatorAllow {
            cidr: "127.0.0.1".parse().expect("cidr"),
            ports: vec![PortRange::single(8080).expect("port")],
            reason: "test server".into(),
        });
        assert_eq!(op.denial(ip("127.0.0.1"), 8080), None);
        assert!(op.denial(ip("127.0.0.1"), 8081).is_some());
        assert!(!op.denies_every_port(ip("127.0.0.1")));
        assert!(op.denies_every_port(ip("127.0.0.2")));
    }

    #[test]
    fn operator_config_parses_with_defaults() {
        let op: OperatorPolicy = serde_json::from_str(
            r#"{"allow":[{"cidr":"127.0.0.1","ports":[8443],"reason":"tests"}],
                "hosts":{"api.example.com":["127.0.0.1"]}}"#,
        )
        .expect("config");
        assert_eq!(op.deny, OperatorPolicy::default_deny());
        assert_eq!(op.hosts.len(), 1);
        assert!(serde_json::from_str::<OperatorPolicy>(r#"{"hosts":{"1.2.3.4":[]}}"#).is_err());
    }
}
