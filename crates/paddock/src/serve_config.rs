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
//! max_templates = 50          # built and being built
//! max_memory = "64G"          # unset: unlimited (as max_cpus and max_storage)
//! max_storage = "500G"        # sandbox disks (+ what they started from), snapshots, volume sizes,
//!                             # templates (what each holds; while built, the most it may write)
//!
//! [templates.default]
//! rootfs = "host"
//! warm_pool = 2
//!
//! [templates.debian]
//! rootfs = "/srv/rootfs/debian"
//!
//! [templates.base]            # a Debian base made by mmdebstrap from the host's apt sources
//! debian = { suite = "bookworm", packages = ["python3"] }   # (or `mirrors = ["http://..."]`)
//!
//! [templates.python]          # built by the server from an image (or `recipe = "/abs/file"`),
//! image = "python:3.12-slim"  # for every tenant
//! warm_pool = 4
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
//!
//! # E2B's API and sandbox traffic on the same listener (see `serve_config/e2b.rs`).
//! [e2b]
//! enabled = true
//! domain = "sandbox.example"      # per-sandbox hosts <port>-<id>.<domain>
//! internet_access = false
//!
//! # The MCP endpoint /mcp (see `serve_config/mcp.rs`).
//! [mcp]
//! public_url = "https://paddock.example"
//! allowed_hosts = ["paddock.example"]
//! max_sessions = 1024
//!
//! # The approvals queue and its signed webhook (see `serve_config/approvals.rs`).
//! [approvals]
//! ttl = "1h"
//! wait = "60s"
//! webhook_url = "https://ops.example/paddock"
//! webhook_secret_file = "/etc/paddock/webhook.key"
//!
//! # Approved executions (see `serve_config/executions.rs`); PADDOCK_EXECUTION_BACKEND sets backend.
//! [executions]
//! backend = "sandbox"
//! log_limit = "1M"
//!
//! # Image registries templates are pulled from (see `serve_config/registry.rs`).
//! [registry]
//! ca_file = "/etc/paddock/registry-ca.pem"
//! insecure = ["127.0.0.1:5000"]
//!
//! # Connections to sandboxes' own ports (see `serve_config/ports.rs`).
//! [ports]
//! per_sandbox = 256
//! per_tenant = 1024
//! connect_timeout = "5s"
//! ```
//!
//! Layers and their resolution are `serve_config/layers.rs`; sizes, durations and root file
//! systems as the file writes them, `serve_config/values.rs`.

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

mod approvals;
mod audit;
mod e2b;
mod executions;
mod http;
mod layers;
mod mcp;
mod ports;
mod registry;
mod values;

pub use approvals::ApprovalsSettings;
pub use audit::AuditSettings;
pub use e2b::E2bSettings;
pub use executions::{ExecutionBackend, ExecutionsSettings};
pub use http::{HttpSettings, API_FD_OVERHEAD};
use layers::LimitsLayer;
pub use mcp::McpEndpointSettings;
pub use ports::PortsSettings;
pub use registry::RegistrySettings;
pub(crate) use values::{human_duration, Human, Rootfs, Size};

/// Reads a recipe file named by the configuration (at most 1 MiB, a regular file).
fn read_recipe_file(path: &Path) -> anyhow::Result<String> {
    let text = crate::client::read_recipe(path)?;
    paddock_types::recipe::parse_recipe(&text, &BTreeMap::new())
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(text)
}

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
    max_templates: Some(50),
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
    /// The MCP endpoint.
    pub mcp: McpEndpointSettings,
    /// The approvals queue and its webhook.
    pub approvals: ApprovalsSettings,
    /// Approved executions: where they run, their bounds.
    pub executions: ExecutionsSettings,
    /// Connections to sandboxes' own ports.
    pub ports: PortsSettings,
    /// How templates are pulled from image registries.
    pub registry: RegistrySettings,
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
    /// A registry image the server builds it from (for every tenant).
    pub image: Option<String>,
    /// A recipe file the server builds it from (read at startup).
    pub recipe: Option<PathBuf>,
    /// A Debian base the server makes with `mmdebstrap`.
    pub debian: Option<paddock_control::DebianBase>,
    /// Code contexts (languages) its warm pool's sandboxes start ahead.
    pub kernels: Vec<String>,
    /// The recipe's build arguments (`build_args = { BASE = "..." }`).
    pub build_args: std::collections::BTreeMap<String, String>,
    /// The network of the recipe's `RUN` steps, a network policy as the API takes it
    /// (`build_network = { allow = [{ domain = "pypi.org" }] }`); absent: loopback only.
    pub build_network: Option<paddock_types::NetworkPolicy>,
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
        layers::load(global, log, args, env)
    }

    /// The configuration as a TOML file that loads back to the same configuration.
    pub fn to_toml(&self) -> anyhow::Result<String> {
        layers::to_toml(self)
    }

    /// What the sandbox service is configured with (recipe files are read here).
    pub fn service_config(&self) -> anyhow::Result<ServiceConfig> {
        let mut recipes = BTreeMap::new();
        for (name, t) in &self.templates {
            if let Some(path) = &t.recipe {
                let text = read_recipe_file(path).with_context(|| format!("templates.{name}.recipe"))?;
                recipes.insert(name.clone(), text);
            }
        }
        Ok(ServiceConfig {
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
                        image: t.image.clone(),
                        recipe: recipes.get(name).cloned(),
                        debian: t.debian.clone(),
                        kernels: t.kernels.clone(),
                        build: paddock_control::RecipeBuild {
                            args: t.build_args.clone(),
                            network: t.build_network.clone(),
                        },
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
            approvals: self.approvals.approvals_config()?,
            executions: self.executions.executions_config(),
            images: paddock_control::ImagesConfig {
                pull_dir: Some(self.state_dir.join("pulls")),
                pull: self.registry.pull_options(),
                limits: paddock_runtime::TemplateLimits::default(),
            },
        })
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

mod egress_limits;
pub use egress_limits::EgressLimitSettings;

#[cfg(test)]
mod tests;
