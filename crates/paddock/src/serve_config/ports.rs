//! The `[ports]` section: connections from outside to sandboxes' own ports (E2B's sandbox door,
//! `/v1/sandboxes/{id}/ports/...`, `paddock sandbox port-forward`). File only; every key has a
//! default.
//!
//! ```toml
//! [ports]
//! per_sandbox = 256        # open connections to one sandbox's ports
//! per_tenant = 1024        # ... to one tenant's sandboxes together
//! server = 2048            # ... to every sandbox together (each holds a descriptor)
//! connect_timeout = "5s"   # a listener whose backlog is full never answers
//! ```
//!
//! Their audit rows' window and rates are fixed (`PortsConfig`'s defaults).

use std::time::Duration;

use paddock_control::PortsConfig;
use serde::{Deserialize, Serialize};

/// The `[ports]` section, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortsSettings {
    #[serde(default = "d::per_sandbox")]
    pub per_sandbox: u32,
    #[serde(default = "d::per_tenant")]
    pub per_tenant: u32,
    #[serde(default = "d::server")]
    pub server: u32,
    #[serde(default = "d::connect_timeout", with = "super::human_duration")]
    pub connect_timeout: Duration,
}

/// The defaults, from the service's.
mod d {
    use std::time::Duration;

    use paddock_control::PortsConfig;

    fn c() -> PortsConfig {
        PortsConfig::default()
    }
    pub fn per_sandbox() -> u32 {
        c().per_sandbox
    }
    pub fn per_tenant() -> u32 {
        c().per_tenant
    }
    pub fn server() -> u32 {
        c().server
    }
    pub fn connect_timeout() -> Duration {
        c().connect_timeout
    }
}

impl Default for PortsSettings {
    fn default() -> Self {
        let c = PortsConfig::default();
        Self {
            per_sandbox: c.per_sandbox,
            per_tenant: c.per_tenant,
            server: c.server,
            connect_timeout: c.connect_timeout,
        }
    }
}

impl PortsSettings {
    /// Checks the ranges; the error names the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (key, value) in [
            ("per_sandbox", self.per_sandbox),
            ("per_tenant", self.per_tenant),
            ("server", self.server),
        ] {
            if value == 0 {
                anyhow::bail!("ports.{key}: must be at least 1");
            }
        }
        if self.connect_timeout < Duration::from_millis(100)
            || self.connect_timeout > Duration::from_secs(300)
        {
            anyhow::bail!(
                "ports.connect_timeout: must be between 100ms and 5m, got {}",
                humantime::format_duration(self.connect_timeout)
            );
        }
        Ok(())
    }

    /// The service's configuration.
    pub fn ports_config(&self) -> PortsConfig {
        PortsConfig {
            per_sandbox: self.per_sandbox,
            per_tenant: self.per_tenant,
            server: self.server,
            connect_timeout: self.connect_timeout,
            ..PortsConfig::default()
        }
    }
}
