//! The configuration's layers (the file's, the environment's, the flags') and how they resolve
//! into one [`ServeConfig`]: each layer's format, the overlay (a set key wins over the layer below),
//! validation, and the rendering back to TOML. The file's own format is [`Layer`], so unknown keys
//! are refused.
//!
//! It does not: read the environment or the command line itself (the caller hands both over), or
//! apply the configuration.

use super::*;

/// Loads the configuration: the file named by `global.config`, then the variables in `env`, then
/// the flags.
pub(super) fn load(
    global: &GlobalArgs,
    log: Option<&str>,
    args: &ServeArgs,
    env: &BTreeMap<String, String>,
) -> anyhow::Result<ServeConfig> {
    let file = match &global.config {
        Some(path) => read_file(path)?,
        None => Layer::default(),
    };
    let layer = file
        .overlay(env_layer(env)?)
        .overlay(flag_layer(global, log, args));
    layer.resolve()
}

/// `cfg` as a TOML file that loads back to the same configuration.
pub(super) fn to_toml(cfg: &ServeConfig) -> anyhow::Result<String> {
    let layer = Layer {
        listen: Some(cfg.listen),
        state_dir: Some(cfg.state_dir.clone()),
        agent: Some(cfg.agent.clone()),
        pool_size: Some(Size(cfg.pool_size)),
        cgroup_parent: Some(cfg.cgroup_parent.clone()),
        log: Some(cfg.log.clone()),
        default_timeout: Some(Human(cfg.default_timeout)),
        max_timeout: Some(Human(cfg.max_timeout)),
        reaper_interval: Some(Human(cfg.reaper_interval)),
        history_retention: Some(Human(cfg.history_retention)),
        max_import: Some(Size(cfg.max_import)),
        egress: Some(cfg.egress.clone()),
        http: Some(cfg.http.clone()),
        audit: Some(cfg.audit.clone()),
        e2b: Some(cfg.e2b.clone()),
        mcp: Some(cfg.mcp.clone()),
        approvals: Some(cfg.approvals.clone()),
        executions: Some(cfg.executions.clone()),
        execution_backend: None,
        ports: Some(cfg.ports.clone()),
        registry: Some(cfg.registry.clone()),
        default_limits: LimitsLayer::from(&cfg.default_limits),
        max_limits: LimitsLayer::from(&cfg.max_limits),
        quotas: Some(QuotasLayer::from(&cfg.quotas)),
        templates: cfg
            .templates
            .iter()
            .map(|(name, t)| {
                let layer = TemplateLayer {
                    rootfs: (t.image.is_none() && t.recipe.is_none() && t.debian.is_none())
                        .then(|| Rootfs(t.rootfs.clone())),
                    warm_pool: Some(t.warm_pool),
                    image: t.image.clone(),
                    recipe: t.recipe.clone(),
                    debian: t.debian.clone(),
                    kernels: (!t.kernels.is_empty()).then(|| t.kernels.clone()),
                    build_args: (!t.build_args.is_empty()).then(|| t.build_args.clone()),
                    build_network: t.build_network.clone(),
                };
                (name.clone(), layer)
            })
            .collect(),
    };
    toml::to_string_pretty(&layer).context("failed to render the configuration as TOML")
}

/// One layer of settings: the file's, the environment's or the flags'. Unset fields defer to the
/// layer below. This is also the file's format, so unknown keys are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Layer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    listen: Option<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state_dir: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    agent: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pool_size: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cgroup_parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    log: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    default_timeout: Option<Human>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_timeout: Option<Human>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reaper_interval: Option<Human>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    history_retention: Option<Human>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_import: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    egress: Option<EgressSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    http: Option<HttpSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    audit: Option<AuditSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    e2b: Option<E2bSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mcp: Option<McpEndpointSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    approvals: Option<ApprovalsSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    executions: Option<ExecutionsSettings>,
    /// `PADDOCK_EXECUTION_BACKEND`: replaces `[executions] backend` alone.
    #[serde(skip)]
    execution_backend: Option<ExecutionBackend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ports: Option<PortsSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    registry: Option<RegistrySettings>,
    #[serde(default)]
    default_limits: LimitsLayer,
    #[serde(default)]
    max_limits: LimitsLayer,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quotas: Option<QuotasLayer>,
    #[serde(default)]
    templates: BTreeMap<String, TemplateLayer>,
}

/// The `[quotas]` section: every tenant's quota where its own sets nothing. A key left out keeps its
/// built-in default ([`DEFAULT_QUOTAS`]); `"unlimited"` lifts it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotasLayer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_sandboxes: Option<Bound<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_memory: Option<Bound<Size>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_cpus: Option<Bound<CpuQuota>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_snapshots: Option<Bound<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_volumes: Option<Bound<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_storage: Option<Bound<Size>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_templates: Option<Bound<u32>>,
}

/// A quota in the file: a number (or size), or `"unlimited"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
enum Bound<T> {
    Limit(T),
    Unlimited(Unlimited),
}

/// The word `unlimited`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Unlimited {
    Unlimited,
}

impl<T> Bound<T> {
    fn get(self) -> Option<T> {
        match self {
            Bound::Limit(v) => Some(v),
            Bound::Unlimited(_) => None,
        }
    }

    fn of(v: Option<T>) -> Self {
        v.map_or(Bound::Unlimited(Unlimited::Unlimited), Bound::Limit)
    }
}

impl QuotasLayer {
    fn overlay(self, top: Self) -> Self {
        Self {
            max_sandboxes: top.max_sandboxes.or(self.max_sandboxes),
            max_memory: top.max_memory.or(self.max_memory),
            max_cpus: top.max_cpus.or(self.max_cpus),
            max_snapshots: top.max_snapshots.or(self.max_snapshots),
            max_volumes: top.max_volumes.or(self.max_volumes),
            max_storage: top.max_storage.or(self.max_storage),
            max_templates: top.max_templates.or(self.max_templates),
        }
    }

    fn into_quota(self, base: TenantQuota) -> TenantQuota {
        fn pick<T, U>(layer: Option<Bound<T>>, base: Option<U>, f: impl Fn(T) -> U) -> Option<U> {
            match layer {
                Some(b) => b.get().map(f),
                None => base,
            }
        }
        TenantQuota {
            max_sandboxes: pick(self.max_sandboxes, base.max_sandboxes, |v| v),
            max_memory_bytes: pick(self.max_memory, base.max_memory_bytes, |s| s.0.as_u64()),
            max_cpu_millis: pick(self.max_cpus, base.max_cpu_millis, CpuQuota::millicpus),
            max_snapshots: pick(self.max_snapshots, base.max_snapshots, |v| v),
            max_volumes: pick(self.max_volumes, base.max_volumes, |v| v),
            max_storage_bytes: pick(self.max_storage, base.max_storage_bytes, |s| s.0.as_u64()),
            max_templates: pick(self.max_templates, base.max_templates, |v| v),
        }
    }
}

impl From<&TenantQuota> for QuotasLayer {
    fn from(q: &TenantQuota) -> Self {
        Self {
            max_sandboxes: Some(Bound::of(q.max_sandboxes)),
            max_memory: Some(Bound::of(q.max_memory_bytes.map(|b| Size(ByteSize::bytes(b))))),
            max_cpus: Some(Bound::of(
                q.max_cpu_millis
                    .and_then(|m| CpuQuota::try_from(f64::from(m) / 1000.0).ok()),
            )),
            max_snapshots: Some(Bound::of(q.max_snapshots)),
            max_volumes: Some(Bound::of(q.max_volumes)),
            max_storage: Some(Bound::of(q.max_storage_bytes.map(|b| Size(ByteSize::bytes(b))))),
            max_templates: Some(Bound::of(q.max_templates)),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitsLayer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    memory: Option<Size>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cpus: Option<CpuQuota>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pids: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    disk: Option<Size>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TemplateLayer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rootfs: Option<Rootfs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    warm_pool: Option<u32>,
    /// A registry image the server builds the template from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image: Option<String>,
    /// A recipe file the server builds the template from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    recipe: Option<PathBuf>,
    /// A Debian base the server makes with `mmdebstrap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    debian: Option<paddock_control::DebianBase>,
    /// Code contexts the warm pool's sandboxes start ahead (languages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kernels: Option<Vec<String>>,
    /// A recipe's build arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    build_args: Option<BTreeMap<String, String>>,
    /// The network of a recipe's `RUN` steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    build_network: Option<paddock_types::NetworkPolicy>,
}

impl LimitsLayer {
    fn overlay(self, top: Self) -> Self {
        Self {
            memory: top.memory.or(self.memory),
            cpus: top.cpus.or(self.cpus),
            pids: top.pids.or(self.pids),
            disk: top.disk.or(self.disk),
        }
    }

    pub(super) fn into_limits(self, base: Limits) -> Limits {
        Limits {
            memory: self.memory.map(|s| s.0).or(base.memory),
            cpus: self.cpus.or(base.cpus),
            pids: self.pids.or(base.pids),
            disk: self.disk.map(|s| s.0).or(base.disk),
        }
    }
}

impl From<&Limits> for LimitsLayer {
    fn from(l: &Limits) -> Self {
        Self {
            memory: l.memory.map(Size),
            cpus: l.cpus,
            pids: l.pids,
            disk: l.disk.map(Size),
        }
    }
}

impl Layer {
    /// `top`'s settings where it has them, this layer's otherwise.
    fn overlay(self, top: Layer) -> Layer {
        let mut templates = self.templates;
        for (name, t) in top.templates {
            let below = templates.remove(&name).unwrap_or_default();
            let merged = TemplateLayer {
                rootfs: t.rootfs.or(below.rootfs),
                warm_pool: t.warm_pool.or(below.warm_pool),
                image: t.image.or(below.image),
                recipe: t.recipe.or(below.recipe),
                debian: t.debian.or(below.debian),
                kernels: t.kernels.or(below.kernels),
                build_args: t.build_args.or(below.build_args),
                build_network: t.build_network.or(below.build_network),
            };
            templates.insert(name, merged);
        }
        Layer {
            listen: top.listen.or(self.listen),
            state_dir: top.state_dir.or(self.state_dir),
            agent: top.agent.or(self.agent),
            pool_size: top.pool_size.or(self.pool_size),
            cgroup_parent: top.cgroup_parent.or(self.cgroup_parent),
            log: top.log.or(self.log),
            default_timeout: top.default_timeout.or(self.default_timeout),
            max_timeout: top.max_timeout.or(self.max_timeout),
            reaper_interval: top.reaper_interval.or(self.reaper_interval),
            history_retention: top.history_retention.or(self.history_retention),
            max_import: top.max_import.or(self.max_import),
            egress: top.egress.or(self.egress),
            http: top.http.or(self.http),
            audit: top.audit.or(self.audit),
            e2b: top.e2b.or(self.e2b),
            mcp: top.mcp.or(self.mcp),
            approvals: top.approvals.or(self.approvals),
            executions: top.executions.or(self.executions),
            execution_backend: top.execution_backend.or(self.execution_backend),
            ports: top.ports.or(self.ports),
            registry: top.registry.or(self.registry),
            default_limits: self.default_limits.overlay(top.default_limits),
            max_limits: self.max_limits.overlay(top.max_limits),
            quotas: match (self.quotas, top.quotas) {
                (Some(below), Some(top)) => Some(below.overlay(top)),
                (below, top) => top.or(below),
            },
            templates,
        }
    }

    /// Fills in the defaults and validates.
    fn resolve(self) -> anyhow::Result<ServeConfig> {
        let listen = match self.listen {
            Some(a) => a,
            None => DEFAULT_LISTEN
                .parse()
                .context("invalid built-in listen address")?,
        };
        let state_dir = self.state_dir.unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        if !state_dir.is_absolute() {
            anyhow::bail!("state_dir must be an absolute path, got {}", state_dir.display());
        }
        let agent = match self.agent {
            Some(a) => a,
            None => crate::config::default_agent()?,
        };
        let log = self.log.unwrap_or_else(|| DEFAULT_LOG.to_owned());
        if tracing_subscriber::EnvFilter::try_new(&log).is_err() {
            anyhow::bail!("log: invalid log filter {log:?} (use e.g. info or paddock=debug,warn)");
        }
        let cgroup_parent = self
            .cgroup_parent
            .unwrap_or_else(|| DEFAULT_CGROUP_PARENT.to_owned());
        let configured_defaults = self.default_limits.clone();
        let default_limits = self.default_limits.into_limits(Limits::default());
        let max_limits = self.max_limits.into_limits(Limits::unbounded());
        check_limits(&default_limits, &max_limits)?;
        let default_timeout = self.default_timeout.map_or(Duration::from_secs(300), |h| h.0);
        let max_timeout = self.max_timeout.map_or(Duration::from_secs(24 * 3600), |h| h.0);
        if default_timeout > max_timeout {
            anyhow::bail!(
                "default_timeout ({}) exceeds max_timeout ({})",
                humantime::format_duration(default_timeout),
                humantime::format_duration(max_timeout)
            );
        }
        let mut templates = BTreeMap::new();
        for (name, t) in self.templates {
            if !valid_template_name(&name) {
                anyhow::bail!(
                    "templates.{name}: invalid template name (use 1-64 letters, digits, '.', '_' or '-')"
                );
            }
            let sources = [
                t.rootfs.is_some(),
                t.image.is_some(),
                t.recipe.is_some(),
                t.debian.is_some(),
            ];
            if sources.iter().filter(|s| **s).count() > 1 {
                anyhow::bail!("templates.{name}: give one of `rootfs`, `image`, `recipe` and `debian`");
            }
            if let Some(debian) = &t.debian {
                debian
                    .validate()
                    .map_err(|e| anyhow::anyhow!("templates.{name}.debian: {e}"))?;
            }
            if let Some(image) = &t.image {
                image
                    .parse::<paddock_registry::ImageReference>()
                    .map_err(|e| anyhow::anyhow!("templates.{name}.image: {e}"))?;
            }
            if let Some(recipe) = &t.recipe {
                if !recipe.is_absolute() {
                    anyhow::bail!(
                        "templates.{name}.recipe: {} is not an absolute path",
                        recipe.display()
                    );
                }
            }
            if t.recipe.is_none() && (t.build_args.is_some() || t.build_network.is_some()) {
                anyhow::bail!("templates.{name}: `build_args` and `build_network` are for a `recipe`");
            }
            let kernels = t.kernels.unwrap_or_default();
            for language in &kernels {
                if paddock_control::code_language(language).is_none() {
                    anyhow::bail!(
                        "templates.{name}.kernels: no kernel runs {language:?} (known: {})",
                        paddock_control::code_languages()
                    );
                }
            }
            let template = Template {
                rootfs: t.rootfs.map_or(RootfsSpec::Host, |r| r.0),
                warm_pool: t.warm_pool.unwrap_or(0),
                image: t.image,
                recipe: t.recipe,
                debian: t.debian,
                kernels,
                build_args: t.build_args.unwrap_or_default(),
                build_network: t.build_network,
            };
            templates.insert(name, template);
        }
        let egress = self.egress.unwrap_or_default();
        egress.limits.validate()?;
        let http = self.http.unwrap_or_default();
        http.validate()?;
        let audit = self.audit.unwrap_or_default();
        audit.validate()?;
        let e2b = self.e2b.unwrap_or_default();
        e2b.validate()?;
        let mcp = self.mcp.unwrap_or_default();
        mcp.validate()?;
        let approvals = self.approvals.unwrap_or_default();
        approvals.validate()?;
        let mut executions = self.executions.unwrap_or_default();
        if let Some(backend) = self.execution_backend {
            executions.backend = backend;
        }
        executions.validate()?;
        let ports = self.ports.unwrap_or_default();
        ports.validate()?;
        let registry = self.registry.unwrap_or_default();
        registry.validate()?;
        templates.entry(DEFAULT_TEMPLATE.to_owned()).or_insert(Template {
            rootfs: RootfsSpec::Host,
            warm_pool: 0,
            image: None,
            recipe: None,
            debian: None,
            kernels: Vec::new(),
            build_args: BTreeMap::new(),
            build_network: None,
        });
        Ok(ServeConfig {
            listen,
            state_dir,
            agent,
            pool_size: self.pool_size.map_or(DEFAULT_POOL_SIZE, |s| s.0),
            cgroup_parent,
            log,
            default_limits,
            max_limits,
            configured_defaults,
            quotas: self.quotas.unwrap_or_default().into_quota(DEFAULT_QUOTAS),
            default_timeout,
            max_timeout,
            reaper_interval: self.reaper_interval.map_or(Duration::from_secs(1), |h| h.0),
            history_retention: self
                .history_retention
                .map_or(Duration::from_secs(7 * 24 * 3600), |h| h.0),
            max_import: self.max_import.map_or(DEFAULT_MAX_IMPORT, |s| s.0),
            templates,
            egress,
            http,
            audit,
            e2b,
            mcp,
            approvals,
            executions,
            ports,
            registry,
        })
    }
}

fn check_limits(default: &Limits, max: &Limits) -> anyhow::Result<()> {
    fn check<T: PartialOrd + fmt::Display>(
        name: &str,
        default: Option<T>,
        max: Option<T>,
    ) -> anyhow::Result<()> {
        match (default, max) {
            (Some(d), Some(m)) if d > m => {
                anyhow::bail!("default_limits.{name} ({d}) exceeds max_limits.{name} ({m})")
            }
            (None, Some(m)) => anyhow::bail!(
                "default_limits.{name} must be set when max_limits.{name} is ({m}): a sandbox asking for \
                 nothing would otherwise be unlimited"
            ),
            _ => Ok(()),
        }
    }
    check("memory", default.memory, max.memory)?;
    // No CPU limit means the host's CPUs, which only the host can compare with a maximum: that
    // check is `bound_limits`'s (a shown configuration, with the maximum derived from the host and
    // no default CPU limit, loads back).
    if default.cpus.is_some() {
        check("cpus", default.cpus, max.cpus)?;
    }
    check("pids", default.pids, max.pids)?;
    check("disk", default.disk, max.disk)
}

fn valid_template_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Reads and parses the configuration file; errors name the file, the key and the line.
fn read_file(path: &Path) -> anyhow::Result<Layer> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    parse_file(&text).map_err(|e| anyhow::anyhow!("invalid config file {}: {e}", path.display()))
}

/// Parses the text of a configuration file. The error is one line: `line N: key.path: what`.
fn parse_file(text: &str) -> Result<Layer, String> {
    let line_of = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let deserializer = toml::de::Deserializer::parse(text).map_err(|e| {
        let at = e
            .span()
            .map(|s| format!("line {}: ", line_of(s.start)))
            .unwrap_or_default();
        format!("{at}{}", e.message())
    })?;
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let at = inner
            .span()
            .map(|s| format!("line {}: ", line_of(s.start)))
            .unwrap_or_default();
        let key = if path == "." {
            String::new()
        } else {
            format!("{path}: ")
        };
        format!("{at}{key}{}", inner.message().trim_end())
    })
}

/// The variables `serve` reads beyond those of the global flags (which clap reads itself). An empty
/// variable counts as unset.
fn env_layer(env: &BTreeMap<String, String>) -> anyhow::Result<Layer> {
    fn get<T>(
        env: &BTreeMap<String, String>,
        name: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> anyhow::Result<Option<T>> {
        match env.get(name).map(|v| v.trim()) {
            None | Some("") => Ok(None),
            Some(v) => parse(v)
                .map(Some)
                .map_err(|e| anyhow::anyhow!("invalid {name}: {e}")),
        }
    }
    let size = |s: &str| s.parse::<ByteSize>().map(Size).map_err(|e| e.to_string());
    let cpus = |s: &str| s.parse::<CpuQuota>().map_err(|e| e.to_string());
    let count = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| format!("{s:?} is not a whole number"))
    };
    let duration = |s: &str| crate::cli::parse_human_duration(s).map(Human);
    let limits = |prefix: &str| -> anyhow::Result<LimitsLayer> {
        Ok(LimitsLayer {
            memory: get(env, &format!("PADDOCK_{prefix}_MEMORY"), size)?,
            cpus: get(env, &format!("PADDOCK_{prefix}_CPUS"), cpus)?,
            pids: get(env, &format!("PADDOCK_{prefix}_PIDS"), count)?,
            disk: get(env, &format!("PADDOCK_{prefix}_DISK"), size)?,
        })
    };
    let mut templates = BTreeMap::new();
    if let Some(n) = get(env, "PADDOCK_WARM_POOL", count)? {
        templates.insert(
            DEFAULT_TEMPLATE.to_owned(),
            TemplateLayer {
                warm_pool: Some(n),
                ..TemplateLayer::default()
            },
        );
    }
    Ok(Layer {
        listen: get(env, "PADDOCK_LISTEN", |s| {
            s.parse::<SocketAddr>()
                .map_err(|_| format!("{s:?} is not an address such as 127.0.0.1:7420"))
        })?,
        default_timeout: get(env, "PADDOCK_DEFAULT_TIMEOUT", duration)?,
        max_timeout: get(env, "PADDOCK_MAX_TIMEOUT", duration)?,
        reaper_interval: get(env, "PADDOCK_REAPER_INTERVAL", duration)?,
        history_retention: get(env, "PADDOCK_HISTORY_RETENTION", duration)?,
        max_import: get(env, "PADDOCK_MAX_IMPORT", size)?,
        execution_backend: get(env, "PADDOCK_EXECUTION_BACKEND", ExecutionBackend::parse)?,
        default_limits: limits("DEFAULT")?,
        max_limits: limits("MAX")?,
        templates,
        ..Layer::default()
    })
}

fn flag_layer(global: &GlobalArgs, log: Option<&str>, args: &ServeArgs) -> Layer {
    let mut templates = BTreeMap::new();
    if let Some(n) = args.warm_pool {
        templates.insert(
            DEFAULT_TEMPLATE.to_owned(),
            TemplateLayer {
                warm_pool: Some(n),
                ..TemplateLayer::default()
            },
        );
    }
    Layer {
        listen: args.listen,
        state_dir: global.state_dir.clone(),
        agent: global.agent.clone(),
        pool_size: global.pool_size.map(Size),
        cgroup_parent: global.cgroup_parent.clone(),
        log: log.map(str::to_owned),
        default_timeout: args.default_timeout.map(Human),
        max_timeout: args.max_timeout.map(Human),
        reaper_interval: args.reaper_interval.map(Human),
        history_retention: args.history_retention.map(Human),
        max_import: args.max_import.map(Size),
        egress: None,
        quotas: None,
        http: None,
        audit: None,
        e2b: None,
        mcp: None,
        approvals: None,
        executions: None,
        execution_backend: None,
        ports: None,
        registry: None,
        default_limits: LimitsLayer {
            memory: args.default_memory.map(Size),
            cpus: args.default_cpus,
            pids: args.default_pids,
            disk: args.default_disk.map(Size),
        },
        max_limits: LimitsLayer {
            memory: args.max_memory.map(Size),
            cpus: args.max_cpus,
            pids: args.max_pids,
            disk: args.max_disk.map(Size),
        },
        templates,
    }
}
