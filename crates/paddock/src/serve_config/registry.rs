//! The `[registry]` section: how `POST /v1/templates` reaches image registries. File only; every
//! key has a default.
//!
//! ```toml
//! [registry]
//! ca_file = "/etc/paddock/registry-ca.pem"   # trusted besides the system's roots
//! insecure = ["127.0.0.1:5000"]              # plain HTTP: loopback registries only
//! docker_config = "/root/.docker/config.json" # credentials (`auths`); default: $DOCKER_CONFIG or ~/.docker
//! max_image = "16G"                          # config and layers of one image, as fetched
//! timeout = "1h"                             # a whole pull
//! ```
//!
//! Credentials also come from `PADDOCK_REGISTRY_USERNAME` / `PADDOCK_REGISTRY_PASSWORD` (before the
//! docker config).

use std::path::PathBuf;
use std::time::Duration;

use paddock_registry::{CredentialSources, PullOptions};
use paddock_types::ByteSize;
use serde::{Deserialize, Serialize};

use super::Size;

/// The `[registry]` section, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrySettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub insecure: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docker_config: Option<PathBuf>,
    #[serde(default = "d::max_image")]
    pub max_image: Size,
    #[serde(default = "d::timeout", with = "super::human_duration")]
    pub timeout: Duration,
}

mod d {
    use std::time::Duration;

    use super::Size;

    pub fn max_image() -> Size {
        Size(paddock_types::ByteSize::bytes(
            paddock_registry::PullOptions::default().max_total_bytes,
        ))
    }
    pub fn timeout() -> Duration {
        paddock_registry::PullOptions::default().timeout
    }
}

impl Default for RegistrySettings {
    fn default() -> Self {
        Self {
            ca_file: None,
            insecure: Vec::new(),
            docker_config: None,
            max_image: d::max_image(),
            timeout: d::timeout(),
        }
    }
}

impl RegistrySettings {
    /// Checks what can be checked before the first pull; the error names the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        if let Some(ca) = &self.ca_file {
            if !ca.is_absolute() {
                anyhow::bail!("registry.ca_file: {} is not an absolute path", ca.display());
            }
        }
        if self.max_image.0 == ByteSize::bytes(0) {
            anyhow::bail!("registry.max_image: must be at least 1 byte");
        }
        if self.timeout.is_zero() {
            anyhow::bail!("registry.timeout: must be more than 0");
        }
        // The pull refuses any insecure entry that is not loopback, but the operator hears it now.
        for r in &self.insecure {
            let host = r.rsplit_once(':').map_or(r.as_str(), |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let loopback =
                host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
            if !loopback {
                anyhow::bail!("registry.insecure: {r} is not a loopback registry; TLS is only ever turned off for those");
            }
        }
        Ok(())
    }

    /// The pull options: these settings with the process environment's credentials.
    pub fn pull_options(&self) -> PullOptions {
        let mut credentials = CredentialSources::from_process_environment();
        if let Some(path) = &self.docker_config {
            credentials.docker_config = Some(path.clone());
        }
        PullOptions {
            credentials,
            extra_ca_file: self.ca_file.clone(),
            insecure_registries: self.insecure.clone(),
            max_total_bytes: self.max_image.0.as_u64(),
            timeout: self.timeout,
            ..PullOptions::default()
        }
    }
}
