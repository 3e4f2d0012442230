//! The `[executions]` section: where approved executions run and their bounds. File only, but
//! `backend` also comes from `PADDOCK_EXECUTION_BACKEND`; every key has a default.
//!
//! ```toml
//! [executions]
//! backend = "sandbox"          # or "kubernetes-job" (then [executions.kubernetes] applies)
//! default_timeout = "10m"      # of an execution whose request names none
//! max_timeout = "6h"           # the longest a request may name
//! log_limit = "1M"             # output kept per execution; past it, logs are cut and say so
//! poll_interval = "250ms"      # how often a running execution's executor is asked where it stands
//! keep_ended_per_tenant = 1000 # ended executions kept per tenant (the audit log keeps every step)
//!
//! [executions.kubernetes]      # the kubernetes-job executor (see paddock-kube's JobSettings)
//! namespace = "paddock-executions"
//! service_account = "paddock-executor"
//! runtime_class_name = "gvisor"
//! ```
//!
//! What it does not configure: who approves (approver keys) or how long an approval waits
//! (`[approvals]`).

use std::time::Duration;

use paddock_control::ExecutionsConfig;
use paddock_types::ByteSize;
use serde::{Deserialize, Serialize};

/// Where approved executions run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExecutionBackend {
    /// A fresh paddock sandbox of the execution's template.
    #[default]
    Sandbox,
    /// A Kubernetes Job, through the cluster `KUBECONFIG` (or the in-cluster account) names.
    KubernetesJob,
}

impl ExecutionBackend {
    /// Its name in the configuration and `PADDOCK_EXECUTION_BACKEND`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "sandbox" => Ok(Self::Sandbox),
            "kubernetes-job" => Ok(Self::KubernetesJob),
            other => Err(format!("{other:?} is not sandbox or kubernetes-job")),
        }
    }
}

/// The `[executions]` section, resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecutionsSettings {
    #[serde(default)]
    pub backend: ExecutionBackend,
    #[serde(default = "d::default_timeout", with = "super::human_duration")]
    pub default_timeout: Duration,
    #[serde(default = "d::max_timeout", with = "super::human_duration")]
    pub max_timeout: Duration,
    #[serde(default = "d::log_limit")]
    pub log_limit: ByteSize,
    #[serde(default = "d::poll_interval", with = "super::human_duration")]
    pub poll_interval: Duration,
    #[serde(default = "d::keep_ended")]
    pub keep_ended_per_tenant: u32,
    /// The Jobs of the `kubernetes-job` executor.
    #[serde(default)]
    pub kubernetes: paddock_kube::JobSettings,
}

mod d {
    use std::time::Duration;

    use paddock_types::ByteSize;

    fn c() -> paddock_control::ExecutionsConfig {
        paddock_control::ExecutionsConfig::default()
    }
    pub fn default_timeout() -> Duration {
        c().default_timeout
    }
    pub fn max_timeout() -> Duration {
        c().max_timeout
    }
    pub fn log_limit() -> ByteSize {
        ByteSize::bytes(c().log_limit)
    }
    pub fn poll_interval() -> Duration {
        c().poll_interval
    }
    pub fn keep_ended() -> u32 {
        c().keep_ended_per_tenant
    }
}

impl Default for ExecutionsSettings {
    fn default() -> Self {
        Self {
            backend: ExecutionBackend::default(),
            default_timeout: d::default_timeout(),
            max_timeout: d::max_timeout(),
            log_limit: d::log_limit(),
            poll_interval: d::poll_interval(),
            keep_ended_per_tenant: d::keep_ended(),
            kubernetes: paddock_kube::JobSettings::default(),
        }
    }
}

impl ExecutionsSettings {
    /// Checks the ranges; the error names the key.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.default_timeout < Duration::from_secs(1) || self.default_timeout > self.max_timeout {
            anyhow::bail!("executions.default_timeout: must be at least 1s and at most max_timeout");
        }
        if self.max_timeout > Duration::from_secs(7 * 24 * 3600) {
            anyhow::bail!("executions.max_timeout: must be at most 7days");
        }
        if self.log_limit.as_u64() == 0 || self.log_limit.as_u64() > 64 << 20 {
            anyhow::bail!("executions.log_limit: must be between 1 byte and 64M");
        }
        if self.poll_interval < Duration::from_millis(10) || self.poll_interval > Duration::from_secs(60) {
            anyhow::bail!("executions.poll_interval: must be between 10ms and 1m");
        }
        self.kubernetes.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(())
    }

    /// The service's part.
    pub fn executions_config(&self) -> ExecutionsConfig {
        ExecutionsConfig {
            default_timeout: self.default_timeout,
            max_timeout: self.max_timeout,
            log_limit: self.log_limit.as_u64(),
            poll_interval: self.poll_interval,
            keep_ended_per_tenant: self.keep_ended_per_tenant,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_backends_parse_and_faults_name_their_key() {
        ExecutionsSettings::default().validate().expect("defaults");
        assert_eq!(
            ExecutionBackend::parse("kubernetes-job"),
            Ok(ExecutionBackend::KubernetesJob)
        );
        assert!(ExecutionBackend::parse("k8s").is_err());
        let bad = ExecutionsSettings {
            poll_interval: Duration::from_millis(1),
            ..Default::default()
        };
        assert!(bad
            .validate()
            .expect_err("refused")
            .to_string()
            .starts_with("executions.poll_interval"));
        let parsed: ExecutionsSettings =
            toml::from_str("backend = \"kubernetes-job\"\nlog_limit = \"64K\"").expect("parses");
        assert_eq!(parsed.backend, ExecutionBackend::KubernetesJob);
        assert_eq!(parsed.log_limit.as_u64(), 64 << 10);
    }
}
