//! The server's one typed configuration, loaded once: built-in defaults, then the TOML file
//! (`--config` / `PADDOCK_CONFIG`), then `PADDOCK_*` variables, then flags. It is validated here, at
//! startup, and handed explicitly to what needs it (the service, the backend, the listener).
//!
//! ```toml
//! listen = "127.0.0.1:7420"
//! state_dir = "/var/lib/paddock"
//! default_timeout = "5m"
//! max_timeout = "24h"
//! max_import = "10G"          # largest snapshot archive `POST /v1/snapshots/import` accepts
//!
//! [default_limits]
//! memory = "1G"
//! pids = 1024
//!
//! [max_limits]                # unset keys: derived from the host at startup (3/4 of its memory,
//! memory = "16G"              # its CPUs, 1/4 of its pid budget, the pool's size)
//! cpus = 8.0
//!
//! [quotas]                    # every tenant's quota where its own (PUT /v1/tenants/{name}/quota)
//! max_sandboxes = 100         # sets none; running, paused and stopped sandboxes count
//! max_snapshots = 1000        # checkpoints and imports count
//! max_volumes = 100
//! max_memory = "64G"          # unset: unlimited (as max_cpus and max_storage)
//! max_storage = "500G"        # sandbox disks (+ what they started from), snapshots, volume sizes
//!
//! [templates.default]
//! rootfs = "host"
//! warm_pool = 2
//!
//! [templates.debian]
//! rootfs = "/srv/rootfs/debian"
//!
//! # Sandbox networks (file only). Sandboxes created with a `network` policy reach the outside
//! # through the egress proxy; the operator's deny list (link-local and metadata, private ranges,
//! # loopback, the host's own addresses) applies whatever the policy says, except where `allow` lifts it.
//! [egress]
//! enabled = true                  # false: requests for a network are refused
//! system_resolver = true          # resolve names absent from `hosts` with the host's resolver
//! subnet = "10.253.0.0/16"        # sandboxes' link addresses, one /30 each
//! upstream_ca_files = []          # more CAs trusted for TLS-intercepted upstreams (secret hosts)
//! [egress.hosts]                  # names answered from here, not DNS
//! "pypi.internal" = ["10.0.0.5"]
//! [[egress.allow]]                # an exception to the deny list (the tenant must still allow it)
//! cidr = "10.0.0.5/32"
//! ports = [443]
//! reason = "internal package mirror"
//! [[egress.deny]]                 # more networks no sandbox may reach
//! cidr = "203.0.113.0/24"
//! reason = "partner network"
//! [egress.limits]                 # per-sandbox and server-wide bounds (see `egress_limits.rs`)
//! proxy_connections = 256
//! dns_tcp_connections = 16
//! conntrack_max = 4096
//!
//! # The API listener (file only): timeouts and connection caps (see `serve_config/http.rs`).
//! [http]
//! header_read_timeout = "10s"
//! idle_timeout = "60s"
//! max_connections = 1024
//! max_connections_per_client = 256
//!
//! # The egress proxy's audit rows (file only): aggregation, rates, retention (see `serve_config/audit.rs`).
//! [audit]
//! network_window = "10s"
//! network_rows_per_second = 10.0
//! network_retention = "30days"
//! network_max_rows_per_tenant = 250000
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use paddock_control::{ServiceConfig, TemplateConfig};
use paddock_store::TenantQuota;
use paddock_types::{ByteSize, CpuQuota, HostFacts, Limits, RootfsSpec};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::cli::{GlobalArgs, ServeArgs};
use crate::config::{Config, DEFAULT_CGROUP_PARENT, DEFAULT_POOL_SIZE, DEFAULT_STATE_DIR};

mod audit;
mod e2b;
mod http;
mod ports;

pub use audit::AuditSettings;
pub use e2b::E2bSettings;
pub use http::{HttpSettings, API_FD_OVERHEAD};
pub use ports::PortsSettings;

/// The largest snapshot archive an import accepts when the configuration names none.
const DEFAULT_MAX_IMPORT: ByteSize = ByteSize::bytes(10 << 30);
/// Every tenant's quota when `[quotas]` says nothing: counts of stored things are bounded (each is a
/// subvolume in the pool and rows in the database, and a stopped sandbox can be resumed at will);
/// memory, CPUs and storage bytes depend on the host and the tenants, and are left to the operator
/// (each sandbox is bounded by `max_limits`, the pool by its size).
const DEFAULT_QUOTAS: TenantQuota = TenantQuota {
    max_sandboxes: Some(100),
    max_memory_bytes: None,
    max_cpu_millis: None,
    max_snapshots: Some(1000),
    max_volumes: Some(100),
    max_storage_bytes: None,
};

/// The name of the template that always exists.
pub const DEFAULT_TEMPLATE: &str = "default";
const DEFAULT_LISTEN: &str = "127.0.0.1:7420";
const DEFAULT_LOG: &str = "info";

/// The resolved, validated server configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// Address of the HTTP API.
    pub listen: SocketAddr,
    /// State directory (pool, run state, `paddock.db`, `admin.key`, `serve.lock`).
    pub state_dir: PathBuf,
    /// The in-sandbox agent binary.
    pub agent: PathBuf,
    /// Pool image size (when the state directory is not on btrfs).
    pub pool_size: ByteSize,
    /// Parent cgroup of the sandboxes.
    pub cgroup_parent: String,
    /// Log filter (`tracing` env-filter syntax).
    pub log: String,
    /// Limits a sandbox gets for those its request leaves out.
    pub default_limits: Limits,
    /// The most a sandbox may ask for: as configured (`None`: not configured) until
    /// [`ServeConfig::bound_limits`] fills the rest in from the host.
    pub max_limits: Limits,
    /// Which default limits the configuration set (the others are built-in guesses, lowered to fit a
    /// small host).
    configured_defaults: LimitsLayer,
    /// Every tenant's quota where its own sets nothing.
    pub quotas: TenantQuota,
    /// Timeout of a sandbox whose request names none.
    pub default_timeout: Duration,
    /// The longest timeout a sandbox may have.
    pub max_timeout: Duration,
    /// How often the reaper runs.
    pub reaper_interval: Duration,
    /// How long ended sandboxes stay listed.
    pub history_retention: Duration,
    /// The largest snapshot archive an import accepts.
    pub max_import: ByteSize,
    /// Templates by name; `default` is always present.
    pub templates: BTreeMap<String, Template>,
    /// Sandbox networks.
    pub egress: EgressSettings,
    /// The API listener's timeouts and connection caps.
    pub http: HttpSettings,
    /// The egress proxy's audit rows: aggregation, rates, retention.
    pub audit: AuditSettings,
    /// The E2B-compatible front-end.
    pub e2b: E2bSettings,
    /// Connections to sandboxes' own ports.
    pub ports: PortsSettings,
}

/// The `[egress]` section: whether sandboxes may have a network, and the operator's part of every
/// egress decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EgressSettings {
    /// Whether sandboxes may have a network at all.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Resolve names absent from `hosts` with the host's resolver.
    #[serde(default = "yes")]
    pub system_resolver: bool,
    /// Where networked sandboxes' links get their addresses: one /30 per sandbox (the host side is
    /// where the proxy listens). Pick a range no real network of the host uses.
    #[serde(default = "default_subnet", with = "display_fromstr")]
    pub subnet: paddock_runtime::NetworkSubnet,
    /// PEM files of more CAs trusted for TLS-intercepted upstream connections.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upstream_ca_files: Vec<PathBuf>,
    /// Names answered from this map instead of DNS.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub hosts: BTreeMap<paddock_types::DomainName, Vec<std::net::IpAddr>>,
    /// Exceptions to the deny list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<paddock_egress::policy::OperatorAllow>,
    /// Networks denied on top of the built-in list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<paddock_egress::policy::OperatorDeny>,
    /// What sandboxes can make the proxy and the host's connection tracking hold.
    #[serde(default)]
    pub limits: EgressLimitSettings,
}

fn yes() -> bool {
    true
}

fn default_subnet() -> paddock_runtime::NetworkSubnet {
    paddock_runtime::NetworkSubnet::DEFAULT
}

/// Serde through `Display` and `FromStr`.
mod display_fromstr {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl Default for EgressSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            system_resolver: true,
            subnet: default_subnet(),
            upstream_ca_files: Vec::new(),
            hosts: BTreeMap::new(),
            allow: Vec::new(),
            deny: Vec::new(),
            limits: EgressLimitSettings::default(),
        }
    }
}

/// A template: its root file system and its warm pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    /// The root file system.
    pub rootfs: RootfsSpec,
    /// Sandboxes kept pre-started.
    pub warm_pool: u32,
}

impl ServeConfig {
    /// Loads the configuration: the file named by `global.config` (flag or `PADDOCK_CONFIG`), then the
    /// variables in `env`, then the flags. `global` and `log` carry their own variables already (clap
    /// reads them), and count as flags.
    pub fn load(
        global: &GlobalArgs,
        log: Option<&str>,
        args: &ServeArgs,
        env: &BTreeMap<String, String>,
    ) -> anyhow::Result<Self> {
        let file = match &global.config {
            Some(path) => read_file(path)?,
            None => Layer::default(),
        };
        let layer = file
            .overlay(env_layer(env)?)
            .overlay(flag_layer(global, log, args));
        layer.resolve()
    }

    /// The configuration as a TOML file that loads back to the same configuration.
    pub fn to_toml(&self) -> anyhow::Result<String> {
        let layer = Layer {
            listen: Some(self.listen),
            state_dir: Some(self.state_dir.clone()),
            agent: Some(self.agent.clone()),
            pool_size: Some(Size(self.pool_size)),
            cgroup_parent: Some(self.cgroup_parent.clone()),
            log: Some(self.log.clone()),
            default_timeout: Some(Human(self.default_timeout)),
            max_timeout: Some(Human(self.max_timeout)),
            reaper_interval: Some(Human(self.reaper_interval)),
            history_retention: Some(Human(self.history_retention)),
            max_import: Some(Size(self.max_import)),
            egress: Some(self.egress.clone()),
            http: Some(self.http.clone()),
            audit: Some(self.audit.clone()),
            e2b: Some(self.e2b.clone()),
            ports: Some(self.ports.clone()),
            default_limits: LimitsLayer::from(&self.default_limits),
            max_limits: LimitsLayer::from(&self.max_limits),
            quotas: Some(QuotasLayer::from(&self.quotas)),
            templates: self
                .templates
                .iter()
                .map(|(name, t)| {
                    let layer = TemplateLayer {
                        rootfs: Some(Rootfs(t.rootfs.clone())),
                        warm_pool: Some(t.warm_pool),
                    };
                    (name.clone(), layer)
                })
                .collect(),
        };
        toml::to_string_pretty(&layer).context("failed to render the configuration as TOML")
    }

    /// What the sandbox service is configured with.
    pub fn service_config(&self) -> ServiceConfig {
        ServiceConfig {
            default_limits: self.default_limits.clone(),
            max_limits: self.max_limits.clone(),
            quotas: self.quotas,
            default_timeout: self.default_timeout,
            max_timeout: self.max_timeout,
            templates: self
                .templates
                .iter()
                .map(|(name, t)| {
                    let config = TemplateConfig {
                        rootfs: t.rootfs.clone(),
                        warm_pool_size: t.warm_pool,
                    };
                    (name.clone(), config)
                })
                .collect(),
            reaper_interval: self.reaper_interval,
            history_retention: self.history_retention,
            max_import_bytes: self.max_import.as_u64(),
            network: None,
            collect_budget_bytes: self.http.collected_output_budget.as_u64(),
            network_audit: self.audit.network_audit(),
            ports: self.ports.ports_config(),
        }
    }

    /// Bounds what a sandbox may ask for by the host: every maximum the configuration leaves unset is
    /// derived from `host` ([`HostFacts::max_limits`]), built-in default limits above a maximum are
    /// lowered to it, and a configured default above one is refused (naming both keys).
    pub fn bound_limits(&mut self, host: &HostFacts) -> anyhow::Result<()> {
        let derived = host.max_limits();
        let max = Limits {
            memory: self.max_limits.memory.or(derived.memory),
            cpus: self.max_limits.cpus.or(derived.cpus),
            pids: self.max_limits.pids.or(derived.pids),
            disk: self.max_limits.disk.or(derived.disk),
        };
        // Configured defaults stay as they are (checked below); built-in ones are lowered to fit.
        let builtin = paddock_types::clamp_limits(&self.default_limits, &max);
        let defaults = self.configured_defaults.clone().into_limits(builtin);
        paddock_types::check_limits(&defaults, &max, host.millicpus()).map_err(|e| {
            let configured = match e.field {
                "memory" => self.max_limits.memory.is_some(),
                "cpus" => self.max_limits.cpus.is_some(),
                "pids" => self.max_limits.pids.is_some(),
                _ => self.max_limits.disk.is_some(),
            };
            let from = if configured {
                ""
            } else {
                " (the maximum is derived from this host; set max_limits to change it)"
            };
            anyhow::anyhow!("default_limits.{}: {}{from}", e.field, e.reason)
        })?;
        if max.pids.is_some_and(|p| p > paddock_types::PID_MAX_LIMIT) {
            anyhow::bail!(
                "max_limits.pids: {} is above the kernel's limit of {}",
                max.pids.unwrap_or_default(),
                paddock_types::PID_MAX_LIMIT
            );
        }
        self.default_limits = defaults;
        self.max_limits = max;
        // Final now: shown (`paddock config show`) and loaded back, they are configured values.
        self.configured_defaults = LimitsLayer::from(&self.default_limits);
        Ok(())
    }

    /// The egress proxy's configuration (`None` when sandbox networks are disabled). Reads the
    /// upstream CA files and the host's own addresses (which the deny list covers).
    pub fn network_config(&self) -> anyhow::Result<Option<paddock_control::NetworkConfig>> {
        let e = &self.egress;
        if !e.enabled {
            return Ok(None);
        }
        let mut upstream_ca_pems = Vec::new();
        for path in &e.upstream_ca_files {
            upstream_ca_pems.push(
                std::fs::read_to_string(path)
                    .with_context(|| format!("egress.upstream_ca_files: cannot read {}", path.display()))?,
            );
        }
        let mut deny = paddock_egress::policy::OperatorPolicy::default_deny();
        deny.extend(e.deny.iter().cloned());
        let operator = paddock_egress::policy::OperatorPolicy {
            deny,
            host_addresses: paddock_egress::host_addresses()
                .context("cannot list the host's addresses (for the egress deny list)")?,
            allow: e.allow.clone(),
            hosts: e.hosts.clone(),
        };
        Ok(Some(paddock_control::NetworkConfig {
            ports: paddock_types::EgressPorts::default(),
            egress: paddock_egress::EgressConfig {
                operator,
                system_resolver: e.system_resolver,
                upstream_ca_pems,
                limits: e.limits.egress(),
                ..Default::default()
            },
            conntrack: e.limits.conntrack(),
        }))
    }

    /// The backend's part (state directory, agent, pool, cgroups).
    pub fn runtime_config(&self) -> Config {
        Config {
            state_dir: self.state_dir.clone(),
            agent: self.agent.clone(),
            pool_size: self.pool_size,
            cgroup_parent: self.cgroup_parent.clone(),
            network_subnet: self.egress.subnet,
        }
    }

    /// The server's database.
    pub fn database_path(&self) -> PathBuf {
        self.state_dir.join("paddock.db")
    }

    /// Where the first admin key is written.
    pub fn admin_key_path(&self) -> PathBuf {
        self.state_dir.join("admin.key")
    }

    /// The key the E2B front-end derives sandbox access tokens from (made on the first start).
    pub fn e2b_key_path(&self) -> PathBuf {
        self.state_dir.join("e2b.key")
    }
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
    ports: Option<PortsSettings>,
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
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsLayer {
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

    fn into_limits(self, base: Limits) -> Limits {
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
            ports: top.ports.or(self.ports),
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
            let template = Template {
                rootfs: t.rootfs.map_or(RootfsSpec::Host, |r| r.0),
                warm_pool: t.warm_pool.unwrap_or(0),
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
        let ports = self.ports.unwrap_or_default();
        ports.validate()?;
        templates.entry(DEFAULT_TEMPLATE.to_owned()).or_insert(Template {
            rootfs: RootfsSpec::Host,
            warm_pool: 0,
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
            ports,
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
                rootfs: None,
                warm_pool: Some(n),
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
                rootfs: None,
                warm_pool: Some(n),
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
        ports: None,
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

/// A size written as `512M` in the file (a number of bytes is accepted too).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Size(ByteSize);

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        ByteSize::deserialize(d).map(Size)
    }
}

/// A duration written as humantime does (`5m`, `24h`, `7days`); a number means seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Human(Duration);

impl Serialize for Human {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

impl<'de> Deserialize<'de> for Human {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Human;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as \"30s\", \"5m\" or \"24h\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Human, E> {
                crate::cli::parse_human_duration(v).map(Human).map_err(E::custom)
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Human, E> {
                match u64::try_from(v) {
                    Ok(secs) if secs > 0 => Ok(Human(Duration::from_secs(secs))),
                    _ => Err(E::custom(format!("invalid duration {v}: must be positive"))),
                }
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Human, E> {
                self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Serde of a `Duration` field written as [`Human`] (`#[serde(with = "super::human_duration")]`).
mod human_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Human;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        Human(*d).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Human::deserialize(d).map(|h| h.0)
    }
}

/// A template's root file system: `"host"` or an absolute directory.
#[derive(Debug, Clone, PartialEq)]
struct Rootfs(RootfsSpec);

impl Serialize for Rootfs {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            RootfsSpec::Host => s.serialize_str("host"),
            RootfsSpec::Dir { path } => s.serialize_str(&path.to_string_lossy()),
        }
    }
}

impl<'de> Deserialize<'de> for Rootfs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "host" {
            return Ok(Rootfs(RootfsSpec::Host));
        }
        let path = PathBuf::from(&text);
        if !path.is_absolute() {
            return Err(serde::de::Error::custom(format!(
                "invalid rootfs {text:?}: use \"host\" or an absolute directory"
            )));
        }
        Ok(Rootfs(RootfsSpec::Dir { path }))
    }
}

mod egress_limits;
pub use egress_limits::EgressLimitSettings;

#[cfg(test)]
mod tests;
