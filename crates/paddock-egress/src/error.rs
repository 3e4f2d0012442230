//! Errors of the egress proxy's API (per-connection failures are audited, not returned).

use std::net::SocketAddr;

use paddock_types::SandboxId;

/// Why an egress operation failed.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// A listener could not be bound.
    #[error("failed to bind the sandbox's {what} listener on {addr}")]
    Bind {
        /// `proxy`, `transparent`, `dns (udp)` or `dns (tcp)`.
        what: &'static str,
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The sandbox already has listeners.
    #[error("sandbox {id} already has egress")]
    SandboxExists {
        /// The sandbox.
        id: SandboxId,
    },
    /// The sandbox has no egress.
    #[error("sandbox {id} has no egress")]
    UnknownSandbox {
        /// The sandbox.
        id: SandboxId,
    },
    /// A connection was refused at a cap (reset at once, and counted).
    #[error("sandbox {id} is at its {} cap", limit.as_str())]
    AtCap {
        /// The sandbox.
        id: SandboxId,
        /// The cap.
        limit: crate::Limit,
    },
    /// A certificate could not be made.
    #[error("failed to issue the {what}")]
    Certificate {
        /// Which.
        what: &'static str,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// A TLS configuration could not be built.
    #[error("failed to build the {what}")]
    Tls {
        /// Which.
        what: &'static str,
        /// The cause.
        #[source]
        source: rustls::Error,
    },
    /// An extra upstream CA in the configuration is not a PEM certificate.
    #[error("extra upstream CA #{index} is not a PEM certificate")]
    UpstreamCa {
        /// Its position in the configuration.
        index: usize,
    },
}
