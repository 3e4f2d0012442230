//! Planning a create: a request's template, limits (defaults merged, bounds checked), user, environment,
//! labels and timeout, resolved into a `CreatePlan`; nothing is booted or recorded here.

use std::collections::BTreeMap;

use paddock_types::api::{CreateSandboxRequest, LimitsRequest};
use paddock_types::{EnvVar, Limits, SandboxPath, UserSpec};

use crate::core::live::StoredSpec;
use crate::plan::labels::{MAX_LABELS, MAX_LABEL_LEN};
use crate::plan::template::ResolvedTemplate;
use crate::{Principal, SandboxService, ServiceError};

/// The template every server has.
pub(crate) const DEFAULT_TEMPLATE: &str = "default";

/// A validated create request.
pub(crate) struct CreatePlan {
    pub(crate) spec: StoredSpec,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) timeout_ms: i64,
    pub(crate) memory_bytes: u64,
    pub(crate) cpu_millis: u32,
    /// Its network, when it has one.
    pub(crate) network: Option<crate::plan::network::NetworkPlan>,
}

impl SandboxService {
    /// [`Self::plan_create`] plus the volumes the request mounts, resolved for `p`'s tenant.
    pub(crate) async fn plan_request(
        &self,
        p: &Principal,
        req: CreateSandboxRequest,
    ) -> Result<CreatePlan, ServiceError> {
        let name = req.template.as_deref().unwrap_or(DEFAULT_TEMPLATE);
        let image = match self.inner.config.templates.get(name) {
            Some(t) if t.is_built() => Some(self.configured_template(name).await?),
            Some(_) => None,
            None => match self.resolve_template(&p.tenant, name).await? {
                Some(t) => Some(t),
                None => return Err(self.no_template(name)),
            },
        };
        self.plan_request_with(p, req, image).await
    }

    /// [`Self::plan_request`] with the image template already resolved (a recipe's step runs on a
    /// template no name resolves to).
    pub(crate) async fn plan_request_with(
        &self,
        p: &Principal,
        req: CreateSandboxRequest,
        image: Option<ResolvedTemplate>,
    ) -> Result<CreatePlan, ServiceError> {
        let volumes = self.resolve_volume_mounts(p, &req.volumes).await?;
        let network = self
            .plan_network(p, req.network.clone(), req.secrets.clone())
            .await?;
        let mut plan = self.plan_create(req, image)?;
        plan.spec.volumes = volumes;
        plan.spec.network = network.is_some();
        plan.network = network;
        Ok(plan)
    }

    fn no_template(&self, template: &str) -> ServiceError {
        ServiceError::invalid(
            "template",
            format!(
                "no template {template:?}; this server has: {} (and the caller's own, `GET /v1/templates`)",
                self.inner
                    .config
                    .templates
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    }

    /// The plan of `req`, made from the image template `image` when it names one (whose process
    /// defaults apply where the request sets none).
    fn plan_create(
        &self,
        mut req: CreateSandboxRequest,
        image: Option<ResolvedTemplate>,
    ) -> Result<CreatePlan, ServiceError> {
        let config = &self.inner.config;
        let template = req.template.take().unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned());
        if image.is_none() && !config.templates.contains_key(&template) {
            return Err(self.no_template(&template));
        }
        if let Some(image) = &image {
            apply_image_defaults(&mut req, &image.detail.built.config);
        }
        let limits = merge_limits(&config.default_limits, &req.limits);
        check_limits(&limits, &config.max_limits)?;
        let user = match req.user {
            Some(u) => u
                .parse::<UserSpec>()
                .map_err(|e| ServiceError::invalid("user", e.to_string()))?
                .to_string(),
            None => UserSpec::default_user().to_string(),
        };
        if let Some(dir) = &req.workdir {
            dir.parse::<SandboxPath>()
                .map_err(|e| ServiceError::invalid("workdir", e.to_string()))?;
        }
        check_env("env", &req.env)?;
        if req.labels.len() > MAX_LABELS {
            return Err(ServiceError::invalid(
                "labels",
                format!("at most {MAX_LABELS} labels"),
            ));
        }
        for (k, v) in &req.labels {
            if k.is_empty() || k.len() > MAX_LABEL_LEN || v.len() > MAX_LABEL_LEN || k.contains(['=', ',']) {
                return Err(ServiceError::invalid(
                    format!("labels.{k}"),
                    format!("label keys are 1-{MAX_LABEL_LEN} characters without '=' or ',', values at most {MAX_LABEL_LEN}"),
                ));
            }
        }
        let timeout = match req.timeout_secs {
            Some(0) => {
                return Err(ServiceError::invalid(
                    "timeout_secs",
                    "timeout_secs must be at least 1",
                ))
            }
            Some(s) => std::time::Duration::from_secs(s),
            None => config.default_timeout,
        };
        if timeout > config.max_timeout {
            return Err(ServiceError::invalid(
                "timeout_secs",
                format!("at most {} seconds", config.max_timeout.as_secs()),
            ));
        }
        let memory_bytes = limits.memory.map_or(0, u64::from);
        let cpu_millis = limits.cpus.map_or_else(host_millicpus, |c| c.millicpus());
        Ok(CreatePlan {
            spec: StoredSpec {
                template,
                template_id: image.as_ref().map(|i| i.id.to_string()),
                start: image.and_then(|i| i.detail.start),
                limits,
                env: req.env,
                workdir: req.workdir,
                user,
                on_timeout: req.on_timeout.unwrap_or_default(),
                audit_exec_diff: req.audit_exec_diff,
                timeout_ms: Some(timeout.as_millis() as i64),
                volumes: Vec::new(),
                network: false,
                public_ports: req.public_ports,
            },
            network: None,
            labels: req.labels,
            timeout_ms: timeout.as_millis() as i64,
            memory_bytes,
            cpu_millis,
        })
    }
}

/// Refuses limits outside their absolute bounds or above `max`, naming the field (`limits.pids`).
pub(crate) fn check_limits(limits: &Limits, max: &Limits) -> Result<(), ServiceError> {
    paddock_types::check_limits(limits, max, host_millicpus())
        .map_err(|e| ServiceError::invalid(format!("limits.{}", e.field), e.reason))
}

/// A request's working directory, when it names one: an absolute path inside the sandbox
/// (refused as `cwd`).
pub(crate) fn check_cwd(cwd: Option<&str>) -> Result<(), ServiceError> {
    if let Some(cwd) = cwd {
        cwd.parse::<SandboxPath>()
            .map_err(|e| ServiceError::invalid("cwd", e.to_string()))?;
    }
    Ok(())
}

pub(crate) fn check_env(field: &str, env: &BTreeMap<String, String>) -> Result<(), ServiceError> {
    if env.len() > MAX_ENV {
        return Err(ServiceError::invalid(
            field,
            format!("at most {MAX_ENV} variables"),
        ));
    }
    for (k, v) in env {
        // A name holding '=' would parse as a different name and value; the agent refuses it.
        if k.contains('=') {
            return Err(ServiceError::invalid(
                format!("{field}.{k}"),
                format!("invalid environment variable name {k:?}: names cannot contain '='"),
            ));
        }
        format!("{k}={v}")
            .parse::<EnvVar>()
            .map_err(|e| ServiceError::invalid(format!("{field}.{k}"), e.to_string()))?;
    }
    Ok(())
}

pub(crate) const MAX_ENV: usize = 1024;

pub(crate) fn merge_limits(defaults: &Limits, req: &LimitsRequest) -> Limits {
    Limits {
        memory: req.memory.or(defaults.memory),
        cpus: req.cpus.or(defaults.cpus),
        pids: req.pids.or(defaults.pids),
        disk: req.disk.or(defaults.disk),
    }
}

/// The CPUs this process may use: what an unlimited sandbox may use.
///
/// Read once per process. `available_parallelism` reads `/proc/self/cgroup` (and on cgroup v1
/// `/proc/self/mountinfo` and the CPU quota) on every call; per create, under a burst of creates,
/// those reads took about 4 % of the server's CPU in `bench/throughput.py --clients 100` (the
/// kernel's `css_set_lock`, which every process start and exit also takes). A change of the
/// server's own CPUs is seen after a restart.
pub fn host_cpus() -> u32 {
    static CPUS: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32))
}

/// [`host_cpus`] in millicpus: the most a sandbox may ask for.
pub(crate) fn host_millicpus() -> u32 {
    host_cpus() * 1000
}

pub(crate) fn encode_spec(spec: &StoredSpec) -> Result<String, ServiceError> {
    serde_json::to_string(spec).map_err(|e| ServiceError::internal("encode a sandbox spec", &e))
}

/// Fills what `req` leaves unset from an image's config: its environment (the request's own
/// variables win), working directory and user. Values paddock cannot use are left out (a numeric
/// `User` has no name to run as; the sandbox's default user applies), never refused: the image is
/// what it is.
pub(crate) fn apply_image_defaults(req: &mut CreateSandboxRequest, image: &paddock_types::ImageConfig) {
    for entry in &image.env {
        if let Some((key, value)) = entry.split_once('=') {
            if check_env(
                "env",
                &std::collections::BTreeMap::from([(key.to_owned(), value.to_owned())]),
            )
            .is_ok()
            {
                req.env.entry(key.to_owned()).or_insert_with(|| value.to_owned());
            }
        }
    }
    if req.workdir.is_none() {
        req.workdir = image
            .working_dir
            .clone()
            .filter(|w| w.parse::<SandboxPath>().is_ok());
    }
    if req.user.is_none() {
        let name = image.user.as_deref().map(|u| u.split(':').next().unwrap_or(u));
        req.user = name.filter(|n| n.parse::<UserSpec>().is_ok()).map(str::to_owned);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_types::api::ErrorCode;
    use paddock_types::ByteSize;

    #[test]
    fn request_limits_override_defaults_field_by_field() {
        let defaults = Limits::default();
        let req = LimitsRequest {
            memory: Some(ByteSize::mib(256)),
            ..Default::default()
        };
        let merged = merge_limits(&defaults, &req);
        assert_eq!(merged.memory, Some(ByteSize::mib(256)));
        assert_eq!(merged.pids, defaults.pids);
        assert_eq!(merged.disk, defaults.disk);
    }

    #[test]
    fn limits_outside_their_bounds_name_the_field() {
        let max = Limits {
            memory: None,
            cpus: None,
            pids: Some(10),
            disk: None,
        };
        let with_pids = |pids| Limits {
            pids,
            ..Limits::default()
        };
        assert!(check_limits(&with_pids(Some(10)), &max).is_ok());
        let e = check_limits(&with_pids(Some(11)), &max).expect_err("above the cap");
        assert_eq!(e.field.as_deref(), Some("limits.pids"));
        // No limit at all is more than any cap.
        let e = check_limits(&with_pids(None), &max).expect_err("unlimited");
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        let e = check_limits(&with_pids(Some(1)), &max).expect_err("below the minimum");
        assert_eq!(e.field.as_deref(), Some("limits.pids"));
        let tiny = Limits {
            memory: Some(paddock_types::ByteSize::bytes(1)),
            ..Limits::default()
        };
        let e = check_limits(&tiny, &Limits::default()).expect_err("1 byte of memory");
        assert_eq!(e.field.as_deref(), Some("limits.memory"));
    }

    #[test]
    fn env_keys_are_validated() {
        let mut env = BTreeMap::new();
        env.insert("GOOD".to_owned(), "x=y".to_owned());
        assert!(check_env("env", &env).is_ok());
        let mut bad = env.clone();
        bad.insert("A=B".to_owned(), "x".to_owned());
        let e = check_env("env", &bad).expect_err("'=' in a name");
        assert_eq!(e.field.as_deref(), Some("env.A=B"));
        env.insert(String::new(), "v".to_owned());
        let e = check_env("env", &env).expect_err("empty key");
        assert_eq!(e.field.as_deref(), Some("env."));
    }
}
