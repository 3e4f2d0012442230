//! `[egress.limits]`: what one networked sandbox (and all of them together) can make the egress
//! proxy and the host's connection tracking table hold. Defaults are the proxy's own
//! ([`paddock_egress::EgressLimits`], [`paddock_types::ConntrackLimits`]); every count must be at
//! least 1 (a zero would refuse everything, which `[egress] enabled = false` says more plainly).
//!
//! ```toml
//! [egress.limits]
//! proxy_connections = 256           # per sandbox, through HTTP(S)_PROXY
//! transparent_connections = 256     # per sandbox, intercepted TCP
//! dns_tcp_connections = 16          # per sandbox
//! descriptors = 10000               # all sandboxes together (default: half of RLIMIT_NOFILE)
//! idle_timeout = "5m"               # a proxied connection moving no byte is closed
//! max_lifetime = "1h"               # a proxied connection is closed after this, busy or not
//! dns_tcp_idle = "5s"               # DNS over TCP: wait for (and read) the next question
//! dns_tcp_lifetime = "30s"
//! dns_tcp_questions = 100           # per DNS/TCP connection
//! dns_in_flight = 64                # UDP questions answered at once, per sandbox
//! resolutions_per_sandbox = 8       # system resolver lookups at once, per sandbox
//! resolutions = 64                  # ... all sandboxes together
//! conntrack_max = 4096              # per sandbox: tracked connections (host-wide nf_conntrack table)
//! new_connections_per_second = 200  # per sandbox, bursts of twice that
//! ```

use paddock_egress::EgressLimits;
use paddock_types::ConntrackLimits;
use serde::{Deserialize, Serialize};

use super::Human;

/// The `[egress.limits]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressLimitSettings {
    /// Concurrent connections per sandbox through its explicit proxy.
    pub proxy_connections: u32,
    /// Concurrent connections per sandbox through its transparent door.
    pub transparent_connections: u32,
    /// Concurrent DNS-over-TCP connections per sandbox.
    pub dns_tcp_connections: u32,
    /// Descriptors all sandboxes' connections may hold (`None`: half of `RLIMIT_NOFILE` at start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub descriptors: Option<u32>,
    /// A proxied connection moving no byte for this long is closed.
    pub idle_timeout: Human,
    /// A proxied connection is closed after this long.
    pub max_lifetime: Human,
    /// DNS over TCP: wait for, and time to read, the next question.
    pub dns_tcp_idle: Human,
    /// DNS over TCP: how long a connection may stay open.
    pub dns_tcp_lifetime: Human,
    /// DNS over TCP: questions per connection.
    pub dns_tcp_questions: u32,
    /// DNS over UDP: questions answered at once per sandbox.
    pub dns_in_flight: u32,
    /// System resolver lookups at once per sandbox.
    pub resolutions_per_sandbox: u32,
    /// System resolver lookups at once, all sandboxes together.
    pub resolutions: u32,
    /// Connections per sandbox tracked at once in the host's connection tracking table.
    pub conntrack_max: u32,
    /// New connections per sandbox per second (bursts of twice that).
    pub new_connections_per_second: u32,
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Default for EgressLimitSettings {
    fn default() -> Self {
        let e = EgressLimits::default();
        let c = ConntrackLimits::default();
        Self {
            proxy_connections: count(e.proxy_connections),
            transparent_connections: count(e.transparent_connections),
            dns_tcp_connections: count(e.dns_tcp_connections),
            descriptors: e.descriptors.map(count),
            idle_timeout: Human(e.idle_timeout),
            max_lifetime: Human(e.max_lifetime),
            dns_tcp_idle: Human(e.dns_tcp_idle),
            dns_tcp_lifetime: Human(e.dns_tcp_lifetime),
            dns_tcp_questions: e.dns_tcp_questions,
            dns_in_flight: count(e.dns_in_flight),
            resolutions_per_sandbox: count(e.resolutions_per_sandbox),
            resolutions: count(e.resolutions),
            conntrack_max: c.max_connections,
            new_connections_per_second: c.new_per_second,
        }
    }
}

impl EgressLimitSettings {
    /// Every count is at least 1 (`descriptors` at least 2: one proxied connection).
    pub fn validate(&self) -> anyhow::Result<()> {
        let counts = [
            ("proxy_connections", self.proxy_connections),
            ("transparent_connections", self.transparent_connections),
            ("dns_tcp_connections", self.dns_tcp_connections),
            ("dns_tcp_questions", self.dns_tcp_questions),
            ("dns_in_flight", self.dns_in_flight),
            ("resolutions_per_sandbox", self.resolutions_per_sandbox),
            ("resolutions", self.resolutions),
            ("conntrack_max", self.conntrack_max),
            ("new_connections_per_second", self.new_connections_per_second),
        ];
        for (name, n) in counts {
            if n == 0 {
                anyhow::bail!("egress.limits.{name} must be at least 1");
            }
        }
        if self.descriptors.is_some_and(|d| d < 2) {
            anyhow::bail!("egress.limits.descriptors must be at least 2 (one proxied connection holds two)");
        }
        Ok(())
    }

    /// The egress proxy's part.
    pub fn egress(&self) -> EgressLimits {
        let n = |v: u32| usize::try_from(v).unwrap_or(usize::MAX);
        EgressLimits {
            proxy_connections: n(self.proxy_connections),
            transparent_connections: n(self.transparent_connections),
            dns_tcp_connections: n(self.dns_tcp_connections),
            descriptors: self.descriptors.map(n),
            idle_timeout: self.idle_timeout.0,
            max_lifetime: self.max_lifetime.0,
            dns_tcp_idle: self.dns_tcp_idle.0,
            dns_tcp_lifetime: self.dns_tcp_lifetime.0,
            dns_tcp_questions: self.dns_tcp_questions,
            dns_in_flight: n(self.dns_in_flight),
            resolutions_per_sandbox: n(self.resolutions_per_sandbox),
            resolutions: n(self.resolutions),
            ..EgressLimits::default()
        }
    }

    /// The link firewall's part.
    pub fn conntrack(&self) -> ConntrackLimits {
        ConntrackLimits {
            max_connections: self.conntrack_max,
            new_per_second: self.new_connections_per_second,
        }
    }
}
