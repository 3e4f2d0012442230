//! Reaching a sandbox's own ports from the host: a socket made in the sandbox's network namespace.
//!
//! The namespace is found through the init's pidfd, which names that very process whatever happens
//! to its pid (a pid reused by another process never leads into another namespace; an exited init
//! answers `ESRCH`). A sandbox without egress networking has its init's own namespace (loopback
//! only); a networked one's init joined the namespace pinned at `<run>/netns`, so the pidfd leads
//! there too. Should the init have no pidfd (its `pidfd_open` failed), a networked sandbox's pin is
//! used, opened without following a symlink (the run directory is not the sandbox's to write, but
//! nothing is taken on trust); otherwise the port is refused.
//!
//! It does not connect: the caller does, asynchronously and with its own timeout, so a sandbox
//! whose listener never answers holds no blocking thread and no handle lock.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;

use super::network::netns_pin;
use super::sandbox::NativeSandbox;
use crate::{PortSocket, RuntimeError};

/// A socket to port `port` on the loopback of `sb`'s network namespace.
pub(super) fn open_port(sb: &NativeSandbox, port: u16) -> Result<PortSocket, RuntimeError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let socket = match &sb.pidfd {
        Some(pidfd) => paddock_sys::namespace::tcp_socket_in_netns(pidfd.as_fd(), false),
        None => {
            let pin = netns_pin(&sb.run_dir);
            let ns = rustix::fs::open(
                &pin,
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC | rustix::fs::OFlags::NOFOLLOW,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| {
                RuntimeError::Unsupported(format!(
                    "the sandbox's network namespace cannot be found (its init has no pidfd and {}: {e})",
                    pin.display()
                ))
            })?;
            paddock_sys::namespace::tcp_socket_in_netns(ns.as_fd(), false)
        }
    };
    let socket = socket.map_err(|source| RuntimeError::State {
        what: "make a socket in the network namespace of",
        path: sb.run_dir.clone(),
        source,
    })?;
    Ok(PortSocket::new(socket, addr))
}
