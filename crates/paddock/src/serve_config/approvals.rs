//! The `[approvals]` section: how long a request held by an approval policy waits, the queue's
//! bounds, and the webhook told of its changes. File only; every key has a default.
//!
//! ```toml
//! [approvals]
//! ttl = "1h"                      # a pending approval expires after this (and an approved one must be used by then)
//! wait = "60s"                    # how long a held request waits for a decision before answering approval_pending
//! max_pending_per_tenant = 256    # pending approvals a tenant may have at once
//! keep_decided_per_tenant = 1000  # decided approvals kept per tenant (the audit log keeps every decision)
//! webhook_url = "https://ops.example/paddock"   # POSTed each queue change (none: no webhook)
//! webhook_secret_file = "/etc/paddock/webhook.key"  # HMAC-SHA256 key of the Paddock-Signature header
//! webhook_attempts = 6            # deliveries tried per change ...
//! webhook_backoff = "1s"          # ... waiting this long after the first failure, doubling (at most 5 min)
//! ```
//!
//! What it does not configure: the policies (set per tenant and sandbox through `/v1/policy`) or
//! who may approve (keys made with `--approver`).

use std::path::PathBuf;
use std::time::Duration;

use paddock_control::ApprovalsConfig;
use serde::{Deserialize, Serialize};

/// The largest webhook key file accepted.
const MAX_KEY_FILE: u64 = 4096;

/// The `[approvals]` section, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsSettings {
    #[serde(default = "d::ttl", with = "super::human_duration")]
    pub ttl: Duration,
    #[serde(default = "d::wait", with = "super::human_duration")]
    pub wait: Duration,
    #[serde(default = "d::max_pending")]
    pub max_pending_per_tenant: u64,
    #[serde(default = "d::keep_decided")]
    pub keep_decided_per_tenant: u32,
    /// Where each queue change is POSTed; `None`: no webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
    /// A file holding the webhook's HMAC key (read at start; required with `webhook_url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_secret_file: Option<PathBuf>,
    /// Deliveries tried per change before it is recorded as failed.
    #[serde(default = "d::attempts")]
    pub webhook_attempts: u32,
    /// The wait after a failed delivery, doubled after each further one.
    #[serde(default = "d::backoff", with = "super::human_duration")]
    pub webhook_backoff: Duration,
}

mod d {
    use std::time::Duration;

    pub fn ttl() -> Duration {
        paddock_control::ApprovalsConfig::default().ttl
    }
    pub fn wait() -> Duration {
        paddock_control::ApprovalsConfig::default().wait
    }
    pub fn max_pending() -> u64 {
        paddock_control::ApprovalsConfig::default().max_pending_per_tenant
    }
    pub fn keep_decided() -> u32 {
        paddock_control::ApprovalsConfig::default().keep_decided_per_tenant
    }
    pub fn attempts() -> u32 {
        6
    }
    pub fn backoff() -> Duration {
        Duration::from_secs(1)
    }
}

impl Default for ApprovalsSettings {
    fn default() -> Self {
        Self {
            ttl: d::ttl(),
            wait: d::wait(),
            max_pending_per_tenant: d::max_pending(),
            keep_decided_per_tenant: d::keep_decided(),
            webhook_url: None,
            webhook_secret_file: None,
            webhook_attempts: d::attempts(),
            webhook_backoff: d::backoff(),
        }
    }
}

impl ApprovalsSettings {
    /// Checks the ranges and the webhook's pairing; the error names the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        let second = Duration::from_secs(1);
        if self.ttl < second || self.ttl > Duration::from_secs(30 * 24 * 3600) {
            anyhow::bail!("approvals.ttl: must be between 1s and 30days");
        }
        if self.wait > self.ttl || self.wait > Duration::from_secs(3600) {
            anyhow::bail!("approvals.wait: must be at most ttl and at most 1h");
        }
        if self.max_pending_per_tenant == 0 || self.max_pending_per_tenant > 1_000_000 {
            anyhow::bail!("approvals.max_pending_per_tenant: must be between 1 and 1000000");
        }
        if self.keep_decided_per_tenant > 1_000_000 {
            anyhow::bail!("approvals.keep_decided_per_tenant: must be at most 1000000");
        }
        if self.webhook_attempts == 0 || self.webhook_attempts > 20 {
            anyhow::bail!("approvals.webhook_attempts: must be between 1 and 20");
        }
        if self.webhook_backoff < Duration::from_millis(10) || self.webhook_backoff > Duration::from_secs(300)
        {
            anyhow::bail!("approvals.webhook_backoff: must be between 10ms and 5min");
        }
        match (&self.webhook_url, &self.webhook_secret_file) {
            (Some(url), Some(_)) => {
                let parsed = reqwest::Url::parse(url)
                    .map_err(|e| anyhow::anyhow!("approvals.webhook_url: {url:?}: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    anyhow::bail!("approvals.webhook_url: {url:?} is not an http(s) URL");
                }
            }
            (Some(_), None) => {
                anyhow::bail!(
                    "approvals.webhook_secret_file: required with webhook_url (every delivery is signed)"
                )
            }
            (None, Some(_)) => anyhow::bail!("approvals.webhook_url: webhook_secret_file is set without it"),
            (None, None) => {}
        }
        Ok(())
    }

    /// The service's part (the webhook's key file is read here: it also checks signed callbacks).
    pub fn approvals_config(&self) -> anyhow::Result<ApprovalsConfig> {
        Ok(ApprovalsConfig {
            ttl: self.ttl,
            wait: self.wait,
            max_pending_per_tenant: self.max_pending_per_tenant,
            keep_decided_per_tenant: self.keep_decided_per_tenant,
            callback_key: self.webhook_key()?.map(paddock_control::CallbackKey),
        })
    }

    /// The webhook's HMAC key, when one is configured: the file's bytes, surrounding whitespace
    /// trimmed; at most 4 KiB, at least 16 bytes.
    pub fn webhook_key(&self) -> anyhow::Result<Option<Vec<u8>>> {
        use std::io::Read as _;
        let Some(path) = &self.webhook_secret_file else {
            return Ok(None);
        };
        let file = std::fs::File::open(path).map_err(|e| {
            anyhow::anyhow!(
                "approvals.webhook_secret_file: cannot open {}: {e}",
                path.display()
            )
        })?;
        let mut text = Vec::new();
        file.take(MAX_KEY_FILE + 1).read_to_end(&mut text).map_err(|e| {
            anyhow::anyhow!(
                "approvals.webhook_secret_file: cannot read {}: {e}",
                path.display()
            )
        })?;
        if text.len() as u64 > MAX_KEY_FILE {
            anyhow::bail!(
                "approvals.webhook_secret_file: {} is larger than {MAX_KEY_FILE} bytes",
                path.display()
            );
        }
        let key = text.trim_ascii().to_vec();
        if key.len() < 16 {
            anyhow::bail!(
                "approvals.webhook_secret_file: {} holds fewer than 16 bytes of key",
                path.display()
            );
        }
        Ok(Some(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_are_bounded_and_trimmed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key");
        let settings = ApprovalsSettings {
            webhook_url: Some("http://127.0.0.1:9/hook".into()),
            webhook_secret_file: Some(path.clone()),
            ..Default::default()
        };
        std::fs::write(&path, "  0123456789abcdef0123\n").expect("write");
        assert_eq!(
            settings.webhook_key().expect("read"),
            Some(b"0123456789abcdef0123".to_vec())
        );
        std::fs::write(&path, "short").expect("write");
        assert!(settings.webhook_key().is_err());
        std::fs::write(&path, vec![b'k'; 5000]).expect("write");
        assert!(settings.webhook_key().is_err());
        assert_eq!(ApprovalsSettings::default().webhook_key().expect("none"), None);
    }

    #[test]
    fn defaults_are_valid_and_faults_name_their_key() {
        ApprovalsSettings::default().validate().expect("defaults");
        for (settings, key) in [
            (
                ApprovalsSettings {
                    wait: Duration::from_secs(7200),
                    ttl: Duration::from_secs(3600),
                    ..Default::default()
                },
                "approvals.wait",
            ),
            (
                ApprovalsSettings {
                    webhook_url: Some("http://127.0.0.1:9/hook".into()),
                    ..Default::default()
                },
                "approvals.webhook_secret_file",
            ),
            (
                ApprovalsSettings {
                    webhook_url: Some("ftp://x/".into()),
                    webhook_secret_file: Some("/k".into()),
                    ..Default::default()
                },
                "approvals.webhook_url",
            ),
            (
                ApprovalsSettings {
                    max_pending_per_tenant: 0,
                    ..Default::default()
                },
                "approvals.max_pending_per_tenant",
            ),
        ] {
            let e = settings.validate().expect_err(key).to_string();
            assert!(e.starts_with(key), "{e}");
        }
    }
}
