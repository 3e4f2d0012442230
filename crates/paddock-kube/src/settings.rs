//! [`JobSettings`]: where and how the executor's Jobs run, read by the binary from
//! `[executions.kubernetes]` in its configuration. Pure data and its checks; no I/O.

use serde::{Deserialize, Serialize};

use crate::names::{is_dns_label, is_dns_subdomain};

/// Where and how the `kubernetes-job` executor runs approved executions. Every field has a
/// default, so an empty `[executions.kubernetes]` table is a working (and locked-down) setup.
///
/// ```toml
/// [executions.kubernetes]
/// namespace = "paddock-executions"
/// service_account = "paddock-executor"
/// runtime_class_name = "gvisor"
/// default_image = "debian:12-slim"
///
/// [executions.kubernetes.resources]
/// requests = { cpu = "100m", memory = "128Mi" }
/// limits = { cpu = "1", memory = "512Mi" }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobSettings {
    /// The namespace the Jobs are created in (`manifests` creates it).
    pub namespace: String,
    /// The service account the Jobs' pods run as (`manifests` creates it, with no permissions).
    pub service_account: String,
    /// Whether the pods get a token of that account mounted. Off: a remediation command that needs
    /// the API must be given that explicitly.
    pub automount_service_account_token: bool,
    /// A RuntimeClass for the pods (`gvisor`, `kata-qemu`, ...), when the cluster has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// How long a finished Job is kept before Kubernetes deletes it (and its pods and logs). The
    /// control plane must have read the outcome by then: afterwards `status` says the Job is gone.
    pub ttl_seconds_after_finished: u32,
    /// The user (and group) id the container runs as; never 0.
    pub run_as_user: u32,
    /// CPU and memory requested and allowed.
    pub resources: JobResources,
    /// When the kubelet pulls the image; the cluster's default when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,
    /// The image an execution runs in when it names none.
    pub default_image: String,
    /// The most `/tmp` (the only writable path: the root file system is read-only) may hold.
    pub tmp_size_limit: String,
}

impl Default for JobSettings {
    fn default() -> Self {
        Self {
            namespace: "paddock-executions".to_owned(),
            service_account: "paddock-executor".to_owned(),
            automount_service_account_token: false,
            runtime_class_name: None,
            ttl_seconds_after_finished: 600,
            run_as_user: 65532,
            resources: JobResources::default(),
            image_pull_policy: None,
            default_image: "debian:12-slim".to_owned(),
            tmp_size_limit: "64Mi".to_owned(),
        }
    }
}

/// Requests and limits of the one container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobResources {
    pub requests: ResourceRequests,
    pub limits: ResourceLimits,
}

/// What the scheduler reserves (Kubernetes quantities: `100m`, `128Mi`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceRequests {
    pub cpu: String,
    pub memory: String,
}

impl Default for ResourceRequests {
    fn default() -> Self {
        Self {
            cpu: "100m".to_owned(),
            memory: "128Mi".to_owned(),
        }
    }
}

/// The most the container may use: CPU is throttled past it, memory past it is an OOM kill.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ResourceLimits {
    pub cpu: String,
    pub memory: String,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        Self {
            cpu: "1".to_owned(),
            memory: "512Mi".to_owned(),
        }
    }
}

/// A container's `imagePullPolicy`, spelled as Kubernetes spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    /// The value Kubernetes takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// Why [`JobSettings`] were refused; the message names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("executions.kubernetes.{key}: {problem}")]
pub struct SettingsError {
    /// The key, relative to `[executions.kubernetes]` (`resources.limits.cpu`).
    pub key: &'static str,
    pub problem: String,
}

impl JobSettings {
    /// Refuses settings Kubernetes would reject, or that would weaken the pod: names that are not
    /// DNS names, quantities that do not parse, a request above its limit, user id 0.
    pub fn validate(&self) -> Result<(), SettingsError> {
        let fail = |key, problem: String| Err(SettingsError { key, problem });
        if !is_dns_label(&self.namespace) {
            return fail(
                "namespace",
                dns_problem(&self.namespace, "a DNS label (a-z, 0-9, '-'; 1-63)"),
            );
        }
        if !is_dns_subdomain(&self.service_account) {
            return fail(
                "service_account",
                dns_problem(&self.service_account, "a DNS subdomain"),
            );
        }
        if let Some(class) = &self.runtime_class_name {
            if !is_dns_subdomain(class) {
                return fail("runtime_class_name", dns_problem(class, "a DNS subdomain"));
            }
        }
        if self.run_as_user == 0 {
            return fail(
                "run_as_user",
                "must not be 0: the pods run as non-root".to_owned(),
            );
        }
        if self.default_image.trim().is_empty() || self.default_image.contains(char::is_whitespace) {
            return fail(
                "default_image",
                format!("{:?} is not an image reference", self.default_image),
            );
        }
        let quantities = [
            ("resources.requests.cpu", &self.resources.requests.cpu),
            ("resources.requests.memory", &self.resources.requests.memory),
            ("resources.limits.cpu", &self.resources.limits.cpu),
            ("resources.limits.memory", &self.resources.limits.memory),
            ("tmp_size_limit", &self.tmp_size_limit),
        ];
        let mut values = Vec::with_capacity(quantities.len());
        for (key, text) in quantities {
            match parse_quantity(text) {
                Some(v) if v > 0.0 => values.push(v),
                Some(_) => return fail(key, format!("{text:?} must be more than zero")),
                None => {
                    return fail(
                        key,
                        format!("{text:?} is not a Kubernetes quantity (like 500m, 1, 128Mi, 1Gi)"),
                    )
                }
            }
        }
        for (request, limit, key) in [
            (values[0], values[2], "resources.requests.cpu"),
            (values[1], values[3], "resources.requests.memory"),
        ] {
            if request > limit {
                return fail(key, "is above its limit".to_owned());
            }
        }
        Ok(())
    }
}

fn dns_problem(value: &str, what: &str) -> String {
    format!("{value:?} is not {what}")
}

/// A Kubernetes quantity (`[0-9]+(.[0-9]+)?` then a suffix: `m`, `k`, `M`, `G`, `T`, `P`, `E`,
/// `Ki` ... `Ei`, or `e<exponent>`) in base units, or `None` when it does not parse.
pub(crate) fn parse_quantity(text: &str) -> Option<f64> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let mut parts = number.splitn(2, '.');
    let whole = parts.next().unwrap_or("");
    let fraction = parts.next();
    if whole.is_empty() || fraction.is_some_and(|f| f.is_empty() || f.contains('.')) {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        exp if exp.starts_with(['e', 'E']) => {
            let digits = &exp[1..];
            let digits = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            10f64.powi(exp[1..].parse::<i32>().ok()?)
        }
        _ => return None,
    };
    Some(value * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_an_empty_table_gives_them() {
        let parsed: JobSettings = serde_json::from_str("{}").expect("empty settings");
        assert_eq!(parsed, JobSettings::default());
        parsed.validate().expect("defaults validate");
        assert!(!parsed.automount_service_account_token);
    }

    #[test]
    fn partial_tables_keep_the_other_defaults_and_unknown_keys_are_refused() {
        let parsed: JobSettings =
            serde_json::from_str(r#"{"resources":{"requests":{"cpu":"250m"}},"image_pull_policy":"Always"}"#)
                .expect("partial settings");
        assert_eq!(parsed.resources.requests.cpu, "250m");
        assert_eq!(parsed.resources.requests.memory, "128Mi");
        assert_eq!(parsed.resources.limits, ResourceLimits::default());
        assert_eq!(parsed.image_pull_policy, Some(PullPolicy::Always));
        for bad in [
            r#"{"poll_interval":"1s"}"#,
            r#"{"resources":{"requests":{"gpu":"1"}}}"#,
            r#"{"image_pull_policy":"always"}"#,
        ] {
            assert!(serde_json::from_str::<JobSettings>(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn validate_names_the_key() {
        type Change = fn(&mut JobSettings);
        let cases: Vec<(Change, &str)> = vec![
            (|s| s.namespace = "Paddock".into(), "namespace"),
            (|s| s.namespace = "a".repeat(64), "namespace"),
            (|s| s.service_account = "".into(), "service_account"),
            (
                |s| s.runtime_class_name = Some("g visor".into()),
                "runtime_class_name",
            ),
            (|s| s.run_as_user = 0, "run_as_user"),
            (|s| s.default_image = " ".into(), "default_image"),
            (
                |s| s.resources.requests.cpu = "lots".into(),
                "resources.requests.cpu",
            ),
            (
                |s| s.resources.limits.memory = "0".into(),
                "resources.limits.memory",
            ),
            (
                |s| s.resources.requests.memory = "1Gi".into(),
                "resources.requests.memory",
            ),
            (|s| s.tmp_size_limit = "1.Gi".into(), "tmp_size_limit"),
        ];
        for (change, key) in cases {
            let mut settings = JobSettings::default();
            change(&mut settings);
            let err = settings.validate().expect_err(key);
            assert_eq!(err.key, key);
            assert!(
                err.to_string()
                    .starts_with(&format!("executions.kubernetes.{key}: ")),
                "{err}"
            );
        }
    }

    #[test]
    fn quantities_parse_as_kubernetes_reads_them() {
        assert_eq!(parse_quantity("100m"), Some(0.1));
        assert_eq!(parse_quantity("1"), Some(1.0));
        assert_eq!(parse_quantity("1.5"), Some(1.5));
        assert_eq!(parse_quantity("128Mi"), Some(128.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("2G"), Some(2e9));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        for bad in ["", "m", "1.", ".5", "1..2", "1 Gi", "1gi", "-1", "1e", "1e+"] {
            assert_eq!(parse_quantity(bad), None, "{bad:?}");
        }
    }
}
