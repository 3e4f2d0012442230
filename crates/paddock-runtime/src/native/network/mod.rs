//! A networked sandbox's link to the egress proxy (`SandboxSpec::network`).
//!
//! Each networked sandbox gets a network namespace made and owned by the host (so by the initial user
//! namespace: the sandbox's root, root only of its own user namespace, holds no `CAP_NET_ADMIN` or
//! `CAP_NET_RAW` over it and cannot change its addresses, routes or firewall), pinned by a bind mount
//! of its nsfs file at `<run>/netns` (a run directory is per pool, so pools never collide). It
//! outlives the sandbox's init, so a rollback's new init (cold, or the prepared `<id>.next`) joins the
//! same one. A veth pair links it to the host: `pdk<slot>` on the host, `eth0` inside, one /30 of
//! the configured subnet per slot ([`NetworkSubnet`]). The kernel arbitrates slots: creating
//! `pdk<slot>` fails with `EEXIST` while another process (another pool, a `paddock run`) owns that
//! slot, and the next one is tried. One nftables table per slot, in the host's namespace
//! (`inet paddock_<slot>`, [`ruleset`]), sends every TCP connection but those to the proxy's own
//! ports to its transparent listener and every UDP datagram to port 53 to its DNS listener, and
//! refuses everything else; the caller binds those listeners on the link's host address.
//!
//! The `ip`, `nft`, `unshare` and `nsenter` command-line tools do the work, run from the runtime
//! (never from the sandbox), batched: three processes per link. Why not netlink from Rust: it was
//! quicker to build, the tools are what operators debug with, and nftables has no well-kept Rust
//! crate that does more than wrap `nft -j`; the processes cost a few milliseconds, and most of them
//! run while the sandbox's setup shim and volume are being made.
//!
//! What this module does not do: bind the proxy's listeners (the caller does, on the link's host
//! address), decide what the proxy allows, or give a sandbox IPv6 (there is no IPv6 path at all:
//! no addresses but `::1`, no routes, and the firewall refuses it).

mod boot;
mod error;
mod files;
mod link;
pub mod ruleset;
mod subnet;
mod tools;

pub(super) use boot::{netns_pin, BootNetwork};
pub use error::NetworkError;
pub(super) use files::write_network_files;
pub(super) use link::{create_link, remove_link, LinkRecord, PendingLink, NETNS_PIN};
pub use subnet::{NetworkSubnet, ParseSubnetError};
pub(super) use tools::NetworkTools;
