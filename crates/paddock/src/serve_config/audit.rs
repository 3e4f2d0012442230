//! The `[audit]` section: how the egress proxy's events become audit rows, and how long those rows
//! are kept. File only, like `[egress]`; every key has a default.
//!
//! ```toml
//! [audit]
//! network_window = "10s"                 # repeats of an event within this are one more row, with a count
//! network_rows_per_second = 10.0         # rows one sandbox may add, sustained ...
//! network_burst = 100                    # ... and at once; the excess is counted on a suppressed row
//! tenant_network_rows_per_second = 50.0  # the same for all of one tenant's sandboxes together
//! tenant_network_burst = 500
//! network_retention = "30days"           # network rows older than this are removed ...
//! network_max_rows_per_tenant = 250000   # ... and each tenant's oldest beyond this many
//! retention_interval = "1m"              # how often retention runs
//! ```
//!
//! Only network rows (`network.*`) are ever removed; every other audit row is kept for good.

use std::time::Duration;

use paddock_control::NetworkAuditConfig;
use serde::{Deserialize, Serialize};

/// The `[audit]` section, resolved (defaults filled in).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditSettings {
    #[serde(default = "d::window", with = "super::human_duration")]
    pub network_window: Duration,
    #[serde(default = "d::sandbox_rate")]
    pub network_rows_per_second: f64,
    #[serde(default = "d::sandbox_burst")]
    pub network_burst: u32,
    #[serde(default = "d::tenant_rate")]
    pub tenant_network_rows_per_second: f64,
    #[serde(default = "d::tenant_burst")]
    pub tenant_network_burst: u32,
    #[serde(default = "d::retention", with = "super::human_duration")]
    pub network_retention: Duration,
    #[serde(default = "d::max_rows")]
    pub network_max_rows_per_tenant: u64,
    #[serde(default = "d::interval", with = "super::human_duration")]
    pub retention_interval: Duration,
}

/// The defaults, from the service's.
mod d {
    use std::time::Duration;

    use paddock_control::NetworkAuditConfig;

    fn c() -> NetworkAuditConfig {
        NetworkAuditConfig::default()
    }
    pub fn window() -> Duration {
        c().window
    }
    pub fn sandbox_rate() -> f64 {
        c().sandbox_rows_per_second
    }
    pub fn sandbox_burst() -> u32 {
        c().sandbox_burst
    }
    pub fn tenant_rate() -> f64 {
        c().tenant_rows_per_second
    }
    pub fn tenant_burst() -> u32 {
        c().tenant_burst
    }
    pub fn retention() -> Duration {
        c().retention
    }
    pub fn max_rows() -> u64 {
        c().max_rows_per_tenant
    }
    pub fn interval() -> Duration {
        c().retention_interval
    }
}

impl Default for AuditSettings {
    fn default() -> Self {
        Self::from(&NetworkAuditConfig::default())
    }
}

impl From<&NetworkAuditConfig> for AuditSettings {
    fn from(c: &NetworkAuditConfig) -> Self {
        Self {
            network_window: c.window,
            network_rows_per_second: c.sandbox_rows_per_second,
            network_burst: c.sandbox_burst,
            tenant_network_rows_per_second: c.tenant_rows_per_second,
            tenant_network_burst: c.tenant_burst,
            network_retention: c.retention,
            network_max_rows_per_tenant: c.max_rows_per_tenant,
            retention_interval: c.retention_interval,
        }
    }
}

const MAX_RATE: f64 = 100_000.0;

impl AuditSettings {
    /// Checks the ranges; the error names the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        let second = Duration::from_secs(1);
        for (key, value, min, max) in [
            (
                "network_window",
                self.network_window,
                second,
                Duration::from_secs(3600),
            ),
            (
                "network_retention",
                self.network_retention,
                second,
                Duration::from_secs(10 * 365 * 24 * 3600),
            ),
            (
                "retention_interval",
                self.retention_interval,
                second,
                Duration::from_secs(24 * 3600),
            ),
        ] {
            if value < min || value > max {
                anyhow::bail!(
                    "audit.{key}: must be between {} and {}, got {}",
                    humantime::format_duration(min),
                    humantime::format_duration(max),
                    humantime::format_duration(value)
                );
            }
        }
        for (key, rate) in [
            ("network_rows_per_second", self.network_rows_per_second),
            (
                "tenant_network_rows_per_second",
                self.tenant_network_rows_per_second,
            ),
        ] {
            if !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE) {
                anyhow::bail!("audit.{key}: must be more than 0 and at most {MAX_RATE}, got {rate}");
            }
        }
        for (key, n) in [
            ("network_burst", u64::from(self.network_burst)),
            ("tenant_network_burst", u64::from(self.tenant_network_burst)),
            ("network_max_rows_per_tenant", self.network_max_rows_per_tenant),
        ] {
            if n == 0 {
                anyhow::bail!("audit.{key}: must be at least 1");
            }
        }
        Ok(())
    }

    /// What the service is configured with.
    pub fn network_audit(&self) -> NetworkAuditConfig {
        NetworkAuditConfig {
            window: self.network_window,
            sandbox_rows_per_second: self.network_rows_per_second,
            sandbox_burst: self.network_burst,
            tenant_rows_per_second: self.tenant_network_rows_per_second,
            tenant_burst: self.tenant_network_burst,
            retention: self.network_retention,
            max_rows_per_tenant: self.network_max_rows_per_tenant,
            retention_interval: self.retention_interval,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> AuditSettings {
        toml::from_str(text).expect("parses")
    }

    #[test]
    fn defaults_round_trip_and_reach_the_service() {
        let d = parse("");
        assert_eq!(d, AuditSettings::default());
        d.validate().expect("valid");
        assert_eq!(d.network_audit(), NetworkAuditConfig::default());
        let text = toml::to_string(&d).expect("renders");
        assert!(text.contains("network_retention = \"30days\""), "{text}");
        assert_eq!(parse(&text), d);
    }

    #[test]
    fn keys_parse_and_bad_values_are_named() {
        let s = parse("network_window = \"2s\"\nnetwork_burst = 7\nnetwork_max_rows_per_tenant = 10\n");
        assert_eq!(s.network_audit().window, Duration::from_secs(2));
        assert_eq!(s.network_audit().sandbox_burst, 7);
        assert_eq!(s.network_audit().max_rows_per_tenant, 10);
        for (text, key) in [
            ("network_burst = 0", "audit.network_burst"),
            ("network_rows_per_second = 0.0", "audit.network_rows_per_second"),
            (
                "tenant_network_rows_per_second = -1.0",
                "audit.tenant_network_rows_per_second",
            ),
            ("network_window = \"2h\"", "audit.network_window"),
            (
                "network_max_rows_per_tenant = 0",
                "audit.network_max_rows_per_tenant",
            ),
        ] {
            let e = parse(text).validate().expect_err(text).to_string();
            assert!(e.starts_with(key), "{text}: {e}");
        }
        assert!(toml::from_str::<AuditSettings>("retention = \"1d\"").is_err());
    }
}
