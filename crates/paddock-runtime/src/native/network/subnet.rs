//! The host subnet networked sandboxes' links are cut from: one /30 per slot.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use paddock_types::NetworkLink;

/// An IPv4 subnet (`a.b.c.d/n`, `n` at most 30, no host bits set) cut into /30 links: slot `s` is
/// `base + 4s .. base + 4s + 3`, with the host side at `+1` and the sandbox at `+2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkSubnet {
    base: Ipv4Addr,
    prefix_len: u8,
}

/// Why a subnet string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid network subnet {input:?}: {reason}")]
pub struct ParseSubnetError {
    input: String,
    reason: &'static str,
}

impl NetworkSubnet {
    /// `10.253.0.0/16`: 16,384 links.
    pub const DEFAULT: Self = Self {
        base: Ipv4Addr::new(10, 253, 0, 0),
        prefix_len: 16,
    };

    /// Prefix length of every link.
    pub const LINK_PREFIX_LEN: u8 = 30;

    /// How many links the subnet holds.
    pub fn slots(self) -> u32 {
        let addresses = 1u64 << (32 - u32::from(self.prefix_len));
        u32::try_from(addresses / 4).unwrap_or(u32::MAX)
    }

    /// The addresses of link `slot`, if the subnet has it.
    pub fn link(self, slot: u32) -> Option<NetworkLink> {
        if slot >= self.slots() {
            return None;
        }
        let first = u32::from(self.base) + 4 * slot;
        Some(NetworkLink {
            slot,
            host_ip: Ipv4Addr::from(first + 1),
            sandbox_ip: Ipv4Addr::from(first + 2),
            prefix_len: Self::LINK_PREFIX_LEN,
        })
    }
}

impl Default for NetworkSubnet {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for NetworkSubnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix_len)
    }
}

impl FromStr for NetworkSubnet {
    type Err = ParseSubnetError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseSubnetError {
            input: s.to_owned(),
            reason,
        };
        let (addr, len) = s.split_once('/').ok_or_else(|| err("expected a.b.c.d/n"))?;
        let base: Ipv4Addr = addr.parse().map_err(|_| err("not an IPv4 address"))?;
        let prefix_len: u8 = len.parse().map_err(|_| err("not a prefix length"))?;
        if prefix_len > Self::LINK_PREFIX_LEN {
            return Err(err("the prefix must be 30 or shorter (each link takes a /30)"));
        }
        let host_bits = u32::MAX.checked_shr(u32::from(prefix_len)).unwrap_or(0);
        if u32::from(base) & host_bits != 0 {
            return Err(err("host bits are set"));
        }
        Ok(Self { base, prefix_len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_consecutive_slash_30s() {
        let subnet = NetworkSubnet::DEFAULT;
        assert_eq!(subnet.slots(), 16_384);
        let link = subnet.link(3).expect("slot 3");
        assert_eq!(link.host_ip, Ipv4Addr::new(10, 253, 0, 13));
        assert_eq!(link.sandbox_ip, Ipv4Addr::new(10, 253, 0, 14));
        assert_eq!(link.prefix_len, 30);
        let last = subnet.link(16_383).expect("last slot");
        assert_eq!(last.host_ip, Ipv4Addr::new(10, 253, 255, 253));
        assert_eq!(last.sandbox_ip, Ipv4Addr::new(10, 253, 255, 254));
        assert_eq!(subnet.link(16_384), None);
    }

    #[test]
    fn parses_and_refuses() {
        assert_eq!("10.253.0.0/16".parse(), Ok(NetworkSubnet::DEFAULT));
        assert_eq!(NetworkSubnet::DEFAULT.to_string(), "10.253.0.0/16");
        let one: NetworkSubnet = "192.168.7.4/30".parse().expect("a /30");
        assert_eq!(one.slots(), 1);
        assert_eq!(
            one.link(0).map(|l| l.host_ip),
            Some(Ipv4Addr::new(192, 168, 7, 5))
        );
        let all: NetworkSubnet = "0.0.0.0/0".parse().expect("everything");
        assert_eq!(all.slots(), 1 << 30);
        for bad in [
            "10.253.0.0",
            "10.253.0.1/16",
            "10.253.0.0/31",
            "10.253.0.0/x",
            "::1/64",
            "a/8",
        ] {
            assert!(bad.parse::<NetworkSubnet>().is_err(), "{bad}");
        }
    }
}
