//! A sandbox's link to the egress proxy: what the control plane asks of a backend (ports, the CA to
//! trust) and what the backend made (the addresses of a point-to-point link on the host). Also the
//! environment and files a networked sandbox sees, so every caller (server, `paddock run`) agrees.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// Where, inside a networked sandbox, the egress CA certificate alone is written (PEM).
pub const EGRESS_CA_PATH: &str = "/etc/paddock/egress-ca.pem";
/// Where, inside a networked sandbox, the system trust bundle plus the egress CA is written (PEM).
pub const CA_BUNDLE_PATH: &str = "/etc/paddock/ca-bundle.pem";

/// The ports the egress proxy listens on, on the host side of every sandbox's link. Each sandbox has
/// its own host address, so the ports are the same for all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressPorts {
    /// The explicit HTTP(S) proxy (`HTTP_PROXY`, `HTTPS_PROXY`).
    pub proxy: u16,
    /// Where every other TCP connection of the sandbox is redirected.
    pub transparent: u16,
    /// DNS, UDP and TCP (every UDP datagram to port 53 is redirected here; other UDP is refused).
    pub dns: u16,
}

impl Default for EgressPorts {
    fn default() -> Self {
        Self {
            proxy: 3128,
            transparent: 15001,
            dns: 53,
        }
    }
}

/// What a networked sandbox's connections may take of the host's connection tracking table (one
/// table for the whole host, `nf_conntrack_max`: every connection a sandbox opens, refused ones
/// included, is tracked there while it lasts). The link's firewall enforces both bounds on new
/// connections from the sandbox, rejecting the rest at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConntrackLimits {
    /// Most connections of the sandbox tracked at once (closed TCP connections are not counted).
    pub max_connections: u32,
    /// Most new connections per second (with bursts of twice that): bounds, with the kernel's
    /// timeouts, the closed connections the table still holds.
    pub new_per_second: u32,
}

impl Default for ConntrackLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            new_per_second: 200,
        }
    }
}

/// What a sandbox with network access asks of its backend (`SandboxSpec::network`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    /// The proxy's ports on the host side of the link.
    pub ports: EgressPorts,
    /// The sandbox's egress CA certificate (PEM): written to [`EGRESS_CA_PATH`] and appended to the
    /// trust bundle at [`CA_BUNDLE_PATH`] (and the system bundle, where the sandbox's is its own).
    pub ca_pem: String,
    /// Its share of the host's connection tracking table (absent in records of older versions:
    /// the defaults).
    #[serde(default)]
    pub conntrack: ConntrackLimits,
}

/// The point-to-point link a backend made for a networked sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkLink {
    /// The link's index on this host (names its host interface and firewall table).
    pub slot: u32,
    /// The host side's address: the proxy and DNS listen here.
    pub host_ip: Ipv4Addr,
    /// The sandbox side's address.
    pub sandbox_ip: Ipv4Addr,
    /// Prefix length of the link's network.
    pub prefix_len: u8,
}

impl NetworkLink {
    /// The `HTTP(S)_PROXY` URL for this link.
    pub fn proxy_url(&self, ports: &EgressPorts) -> String {
        format!("http://{}:{}", self.host_ip, ports.proxy)
    }

    /// Environment variables every process of the sandbox gets: proxy variables in both cases, and
    /// the trust bundle for the usual TLS stacks (OpenSSL, Python requests and pip, Node, curl).
    pub fn env(&self, ports: &EgressPorts) -> Vec<(String, String)> {
        let proxy = self.proxy_url(ports);
        let no_proxy = "localhost,127.0.0.1,::1".to_owned();
        [
            ("HTTP_PROXY", proxy.clone()),
            ("HTTPS_PROXY", proxy.clone()),
            ("http_proxy", proxy.clone()),
            ("https_proxy", proxy),
            ("NO_PROXY", no_proxy.clone()),
            ("no_proxy", no_proxy),
            ("SSL_CERT_FILE", CA_BUNDLE_PATH.to_owned()),
            ("REQUESTS_CA_BUNDLE", CA_BUNDLE_PATH.to_owned()),
            ("CURL_CA_BUNDLE", CA_BUNDLE_PATH.to_owned()),
            ("PIP_CERT", CA_BUNDLE_PATH.to_owned()),
            ("NODE_EXTRA_CA_CERTS", EGRESS_CA_PATH.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_points_every_client_at_the_proxy_and_the_bundle() {
        let link = NetworkLink {
            slot: 3,
            host_ip: Ipv4Addr::new(10, 253, 0, 13),
            sandbox_ip: Ipv4Addr::new(10, 253, 0, 14),
            prefix_len: 30,
        };
        let env = link.env(&EgressPorts::default());
        let get = |k: &str| env.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!(get("https_proxy"), Some("http://10.253.0.13:3128"));
        assert_eq!(get("SSL_CERT_FILE"), Some(CA_BUNDLE_PATH));
        assert_eq!(get("NODE_EXTRA_CA_CERTS"), Some(EGRESS_CA_PATH));
    }
}
