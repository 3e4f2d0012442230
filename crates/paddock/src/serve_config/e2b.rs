//! The `[e2b]` section: the E2B-compatible front-end on the API listener. File only; every key has
//! a default.
//!
//! ```toml
//! [e2b]
//! enabled = true              # serve E2B's control plane and sandbox traffic beside /v1
//! domain = "sandbox.example"  # per-sandbox hosts <port>-<id>.<domain> (wildcard DNS + certificate)
//! internet_access = false     # what allow_internet_access: true (E2B's default) opens
//! ```

use serde::{Deserialize, Serialize};

/// The `[e2b]` section, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2bSettings {
    /// Serve the E2B front-end.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The domain of per-sandbox hosts; without it sandbox traffic is routed by the
    /// `E2b-Sandbox-Id` / `E2b-Sandbox-Port` headers only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Whether E2B's `allow_internet_access: true` (sent by older SDKs on every create) opens every
    /// public destination; when false (the default) a sandbox gets a network only for explicit
    /// `network.allowOut` entries.
    #[serde(default)]
    pub internet_access: bool,
}

fn yes() -> bool {
    true
}

impl Default for E2bSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            domain: None,
            internet_access: false,
        }
    }
}

impl E2bSettings {
    /// Refuses a domain that cannot be the suffix of a host name.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(d) = &self.domain {
            let ok = !d.is_empty()
                && d.len() <= 200
                && d.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !ok {
                anyhow::bail!("e2b.domain: {d:?} is not a domain name");
            }
        }
        Ok(())
    }
}
