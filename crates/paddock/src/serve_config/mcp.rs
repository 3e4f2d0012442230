//! The `[mcp]` section: the MCP endpoint `/mcp` on the API listener. File only; every key has a
//! default.
//!
//! ```toml
//! [mcp]
//! enabled = true
//! public_url = "https://paddock.example"  # the base of URLs tools hand out (default: http://<listen>)
//! allowed_hosts = ["paddock.example"]     # Host names besides loopback and the listen address
//! allowed_origins = []                    # browser origins that may call it (none: agents are not pages)
//! max_sessions = 1024                     # open sessions of the initialize-based protocol generation
//! ```
//!
//! What it does not configure: the tools (the service's limits, quotas and network policy apply
//! to them as to `/v1`), or `paddock mcp` on stdio (it relays to this endpoint).

use serde::{Deserialize, Serialize};

/// The `[mcp]` section, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpEndpointSettings {
    /// Serve `/mcp`.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The server's URL as agents reach it; `None`: `http://<listen address>` (loopback for an
    /// unspecified one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
    /// Host names `/mcp` answers besides the loopback names and the listen address (DNS rebinding
    /// guard: any other `Host` is refused).
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Browser origins allowed to call `/mcp`; a request with any other `Origin` is refused.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// Sessions of the `initialize`-based generation open at once (each needs a valid key and ends
    /// after five idle minutes); the stateless generation has none.
    #[serde(default = "default_max_sessions")]
    pub max_sessions: usize,
}

fn yes() -> bool {
    true
}

fn default_max_sessions() -> usize {
    1024
}

impl Default for McpEndpointSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            public_url: None,
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            max_sessions: default_max_sessions(),
        }
    }
}

impl McpEndpointSettings {
    /// Refuses values that cannot work: a URL that is not http(s), a host name with a scheme or a
    /// path, an origin that is not `scheme://host[:port]`, no sessions at all.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(url) = &self.public_url {
            let parsed =
                reqwest::Url::parse(url).map_err(|e| anyhow::anyhow!("mcp.public_url: {url:?}: {e}"))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.cannot_be_a_base() {
                anyhow::bail!("mcp.public_url: {url:?} is not an http(s) URL");
            }
        }
        for host in &self.allowed_hosts {
            let ok = !host.is_empty()
                && host.len() <= 253
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
            if !ok {
                anyhow::bail!("mcp.allowed_hosts: {host:?} is not a host name (no scheme or path)");
            }
        }
        for origin in &self.allowed_origins {
            let parsed = reqwest::Url::parse(origin).ok();
            let ok = parsed.as_ref().is_some_and(|u| {
                matches!(u.scheme(), "http" | "https")
                    && u.host_str().is_some()
                    && u.path() == "/"
                    && !origin.ends_with('/')
            });
            if !ok {
                anyhow::bail!("mcp.allowed_origins: {origin:?} is not an origin (scheme://host[:port])");
            }
        }
        if self.max_sessions == 0 {
            anyhow::bail!("mcp.max_sessions: must be at least 1");
        }
        Ok(())
    }
}
