//! The host's own addresses, which the operator's deny list covers (a sandbox must not reach the
//! host's services through the proxy). Read from procfs, whose text formats are stable kernel ABI:
//! `/proc/net/fib_trie` lists the local IPv4 addresses (`/32 host LOCAL` entries), and
//! `/proc/net/if_inet6` the IPv6 ones.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Every address configured on the host's interfaces (in this network namespace).
pub fn host_addresses() -> std::io::Result<Vec<IpAddr>> {
    let mut out = parse_fib_trie(&std::fs::read_to_string("/proc/net/fib_trie")?);
    // A host without IPv6 has no such file.
    if let Ok(text) = std::fs::read_to_string("/proc/net/if_inet6") {
        out.extend(parse_if_inet6(&text));
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// IPv4 addresses of `/32 host LOCAL` leaves: each follows the `|-- ADDRESS` line it belongs to.
fn parse_fib_trie(text: &str) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut last: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(addr) = line.strip_prefix("|-- ") {
            last = addr.trim().parse().ok();
        } else if line.contains("/32 host LOCAL") {
            if let Some(a) = last {
                out.push(IpAddr::V4(a));
            }
        }
    }
    out
}

/// The first column of each line: 32 hex digits.
fn parse_if_inet6(text: &str) -> Vec<IpAddr> {
    text.lines()
        .filter_map(|line| {
            let hex = line.split_whitespace().next()?;
            let n = u128::from_str_radix(hex, 16).ok().filter(|_| hex.len() == 32)?;
            Some(IpAddr::V6(Ipv6Addr::from(n)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_addresses_are_read_from_procfs_text() {
        let fib = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 0.0.0.0\n        /0 universe UNICAST\n     +-- 127.0.0.0/8 2 0 2\n        +-- 127.0.0.0/31 1 0 0\n           |-- 127.0.0.0\n              /8 host LOCAL\n           |-- 127.0.0.1\n              /32 host LOCAL\n     |-- 10.1.2.3\n        /32 host LOCAL\n     |-- 10.1.2.255\n        /32 link BROADCAST\n";
        assert_eq!(
            parse_fib_trie(fib),
            vec![IpAddr::from([127, 0, 0, 1]), IpAddr::from([10, 1, 2, 3])]
        );
        let v6 = "00000000000000000000000000000001 01 80 10 80       lo\nfe800000000000000000000000000001 02 40 20 80     eth0\nbad\n";
        assert_eq!(
            parse_if_inet6(v6),
            vec![
                "::1".parse::<IpAddr>().expect("ip"),
                "fe80::1".parse::<IpAddr>().expect("ip")
            ]
        );
    }

    #[test]
    fn this_host_has_loopback() {
        let addrs = host_addresses().expect("procfs");
        assert!(addrs.contains(&IpAddr::from([127, 0, 0, 1])), "{addrs:?}");
    }
}
