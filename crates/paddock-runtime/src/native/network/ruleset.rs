//! The text handed to `nft` and `ip` for one link, as pure functions (golden-tested below, so a
//! change to the firewall is a reviewed change to a file).
//!
//! The firewall, one table per slot in the host's network namespace, for packets arriving from the
//! sandbox (`iifname pdk<slot>`):
//! - `prerouting` (nat): TCP to the host address on the proxy or DNS port is left alone; every other
//!   TCP connection, whatever its destination (the host address's other ports included), is
//!   redirected to the transparent port, where `SO_ORIGINAL_DST` tells the proxy where it was going
//!   (the NAT happens in the host's namespace, where the proxy's socket is); UDP to port 53 is
//!   redirected to the DNS port; anything else over IPv4 is redirected to the host address itself,
//!   so that `input` refuses it at once whether or not the host forwards packets.
//! - `input`: new connections beyond the sandbox's share of the host's connection tracking table
//!   are rejected first: more than `new_per_second` a second (`limit rate`, bursts of twice that),
//!   or more than `max_connections` tracked at once (`ct count`); TCP with a reset (the kernel
//!   rate-limits ICMP errors, so an ICMP rejection of a flood would leave most clients waiting for a
//!   retransmission), the rest with ICMP (`over_share`). A rejected connection never enters
//!   the table (its entry is only confirmed once a packet is accepted), so a sandbox opening
//!   connections to closed ports, or to the proxy faster than it accepts them, cannot fill the
//!   host-wide `nf_conntrack_max`. Then only TCP to the host address on the proxy, transparent and
//!   DNS ports and UDP to it on the DNS port are accepted; everything else (IPv6 included) is
//!   rejected with an ICMP "administratively prohibited", so a client fails fast instead of waiting
//!   for a timeout.
//! - `forward`: nothing is forwarded from or to the link, should the host forward packets.
//!
//! The table is replaced whole (`add` + `flush` + the definition, one transaction): owning the
//! interface means owning the slot, so a table of the same name is a crashed owner's leftover.

use paddock_types::{ConntrackLimits, EgressPorts, NetworkLink};

/// The host side's interface name of slot `slot` (at most 15 bytes: `pdk` and up to 10 digits).
pub fn interface_name(slot: u32) -> String {
    format!("pdk{slot}")
}

/// The nftables table of slot `slot` (family `inet`).
pub fn table_name(slot: u32) -> String {
    format!("paddock_{slot}")
}

/// The `nft -f -` input that installs (or replaces) the firewall of `link`.
pub fn render_ruleset(link: &NetworkLink, ports: &EgressPorts, conntrack: &ConntrackLimits) -> String {
    let table = table_name(link.slot);
    let dev = interface_name(link.slot);
    let host = link.host_ip;
    let EgressPorts {
        proxy,
        transparent,
        dns,
    } = *ports;
    // At least one of each, or nothing would ever pass.
    let max = conntrack.max_connections.max(1);
    let rate = conntrack.new_per_second.max(1);
    let burst = rate.saturating_mul(2);
    format!(
        "add table inet {table}
flush table inet {table}
table inet {table} {{
\tchain prerouting {{
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tiifname \"{dev}\" ip daddr {host} tcp dport {{ {proxy}, {dns} }} accept
\t\tiifname \"{dev}\" ip protocol tcp redirect to :{transparent}
\t\tiifname \"{dev}\" ip protocol udp udp dport 53 redirect to :{dns}
\t\tiifname \"{dev}\" meta nfproto ipv4 redirect
\t}}
\tchain over_share {{
\t\tmeta l4proto tcp reject with tcp reset
\t\treject with icmpx admin-prohibited
\t}}
\tchain input {{
\t\ttype filter hook input priority filter; policy accept;
\t\tiifname \"{dev}\" ct state new limit rate over {rate}/second burst {burst} packets goto over_share
\t\tiifname \"{dev}\" ct state new ct count over {max} goto over_share
\t\tiifname \"{dev}\" ip daddr {host} tcp dport {{ {proxy}, {transparent}, {dns} }} accept
\t\tiifname \"{dev}\" ip daddr {host} udp dport {dns} accept
\t\tiifname \"{dev}\" reject with icmpx admin-prohibited
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter; policy accept;
\t\tiifname \"{dev}\" reject with icmpx admin-prohibited
\t\toifname \"{dev}\" drop
\t}}
}}
"
    )
}

/// The `ip -batch -` input run inside the new namespace: loopback up, the veth pair created with
/// its host end (`pdk<slot>`) put into the host's namespace (`host_netns`, a path such as
/// `/proc/<pid>/ns/net`), and the sandbox end (`eth0`) addressed, without IPv6 link-local address,
/// with the default route through the host end. Line 2 is the one that fails with "File exists"
/// when another process owns the slot.
pub fn render_sandbox_side(link: &NetworkLink, host_netns: &str) -> String {
    let dev = interface_name(link.slot);
    format!(
        "link set dev lo up
link add eth0 type veth peer name {dev} netns {host_netns}
link set dev eth0 addrgenmode none
addr add {sandbox}/{len} dev eth0
link set dev eth0 up
route add default via {host} dev eth0 onlink
",
        sandbox = link.sandbox_ip,
        host = link.host_ip,
        len = link.prefix_len,
    )
}

/// The line of [`render_sandbox_side`] that creates the pair.
pub const CREATE_LINE: u32 = 2;

/// The `ip -batch -` input run in the host's namespace: the host end addressed (without IPv6
/// link-local address) and up.
pub fn render_host_side(link: &NetworkLink) -> String {
    let dev = interface_name(link.slot);
    format!(
        "link set dev {dev} addrgenmode none
addr add {host}/{len} dev {dev}
link set dev {dev} up
",
        host = link.host_ip,
        len = link.prefix_len,
    )
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    fn link() -> NetworkLink {
        NetworkLink {
            slot: 5,
            host_ip: Ipv4Addr::new(10, 253, 0, 21),
            sandbox_ip: Ipv4Addr::new(10, 253, 0, 22),
            prefix_len: 30,
        }
    }

    /// Compares with a golden file; `PADDOCK_BLESS=1` rewrites it.
    fn golden(name: &str, actual: &str) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src/native/network/golden")
            .join(name);
        if std::env::var_os("PADDOCK_BLESS").is_some() {
            std::fs::write(&path, actual).expect("bless");
        }
        let expected = std::fs::read_to_string(&path).expect("golden file");
        assert_eq!(
            actual,
            expected,
            "{} changed (PADDOCK_BLESS=1 to accept)",
            path.display()
        );
    }

    #[test]
    fn ruleset_is_golden() {
        golden(
            "ruleset.nft",
            &render_ruleset(&link(), &EgressPorts::default(), &ConntrackLimits::default()),
        );
    }

    #[test]
    fn ip_batches_are_golden() {
        golden(
            "sandbox-side.ip",
            &render_sandbox_side(&link(), "/proc/4242/ns/net"),
        );
        golden("host-side.ip", &render_host_side(&link()));
        let create = render_sandbox_side(&link(), "/proc/1/ns/net");
        let line = create
            .lines()
            .nth(CREATE_LINE as usize - 1)
            .expect("the create line");
        assert!(line.starts_with("link add eth0 type veth"), "{line}");
    }

    #[test]
    fn names_fit_the_kernel_limit() {
        assert!(interface_name(u32::MAX).len() <= 15);
        assert_eq!(interface_name(7), "pdk7");
        assert_eq!(table_name(7), "paddock_7");
    }

    #[test]
    fn other_ports_are_used_everywhere() {
        let ports = EgressPorts {
            proxy: 8080,
            transparent: 9000,
            dns: 5353,
        };
        let conntrack = ConntrackLimits {
            max_connections: 64,
            new_per_second: 10,
        };
        let text = render_ruleset(&link(), &ports, &conntrack);
        assert!(text.contains("ct state new limit rate over 10/second burst 20 packets goto over_share"));
        assert!(text.contains("ct state new ct count over 64 goto over_share"));
        assert!(text.contains("tcp dport { 8080, 5353 } accept"));
        assert!(text.contains("redirect to :9000"));
        assert!(text.contains("udp dport 53 redirect to :5353"));
        assert!(text.contains("tcp dport { 8080, 9000, 5353 } accept"));
        assert!(text.contains("udp dport 5353 accept"));
    }
}
