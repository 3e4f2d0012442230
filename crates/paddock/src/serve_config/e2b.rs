//! The `[e2b]` section: the E2B-compatible front-end on the API's listener. File only; every key
//! has a default.
//!
//! ```toml
//! [e2b]
//! enabled = true                      # serve E2B's SDKs on the same listener as /v1
//! domain = "sandbox.example.com"      # per-sandbox hosts <port>-<id>.<domain> (wildcard DNS); unset:
//!                                     # sandbox traffic is routed by the E2b-Sandbox-* headers only
//! internet_access = false             # what E2B's allow_internet_access: true means (see E2bConfig)
//! ```

use serde::{Deserialize, Serialize};

/// The `[e2b]` section, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct E2bSettings {
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
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
    /// Checks the domain is a host name (lowercase labels of letters, digits and `-`).
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(d) = &self.domain {
            let ok = !d.is_empty()
                && d.len() <= 253
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
