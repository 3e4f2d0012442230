//! What the service is configured with (built by the binary from its one typed config).

use std::collections::BTreeMap;
use std::time::Duration;

use paddock_egress::EgressConfig;
use paddock_store::TenantQuota;
use paddock_types::{ConntrackLimits, EgressPorts, Limits, RootfsSpec};

/// The default of [`ServiceConfig::collect_budget_bytes`].
pub const DEFAULT_COLLECT_BUDGET: u64 = 256 << 20;

/// The service's configuration.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Limits a sandbox gets for every limit its request leaves out.
    pub default_limits: Limits,
    /// The most a single sandbox may ask for (`None` fields: no cap beyond the absolute bounds every
    /// limit has, see [`paddock_types::check_limits`]).
    pub max_limits: Limits,
    /// The quota of every tenant whose own quota leaves a field unset (`None` fields: unlimited).
    pub quotas: TenantQuota,
    /// Timeout of a sandbox whose request names none.
    pub default_timeout: Duration,
    /// The longest timeout a request (or an extension) may set.
    pub max_timeout: Duration,
    /// Templates by name; `default` must exist.
    pub templates: BTreeMap<String, TemplateConfig>,
    /// How often the reaper looks for expired and dead sandboxes.
    pub reaper_interval: Duration,
    /// How long ended sandboxes stay listed (`state=all`) before their rows are purged.
    pub history_retention: Duration,
    /// The largest snapshot archive an import accepts, in bytes (413 `payload_too_large` past it).
    pub max_import_bytes: u64,
    /// The egress proxy that gives sandboxes a network; `None`: sandboxes have loopback only and a
    /// request for a network is refused (`unsupported`).
    pub network: Option<crate::NetworkConfig>,
    /// Bytes of process output all requests answered with one collected JSON document may hold
    /// together (JSON-encoded); past it, answers are truncated and say so.
    pub collect_budget_bytes: u64,
    /// How the egress proxy's events become audit rows, and how long those rows are kept.
    pub network_audit: NetworkAuditConfig,
    /// Connections to sandboxes' own ports (`connect_port`): caps and audit rows.
    pub ports: PortsConfig,
    /// How templates are built from images: where pulls land, how registries are reached, bounds.
    pub images: ImagesConfig,
    /// The approvals queue: how long a request waits for a person, and its bounds.
    pub approvals: ApprovalsConfig,
    /// Approved executions: their timeouts, logs and bounds.
    pub executions: ExecutionsConfig,
}

/// Approved executions' configuration (the executor itself is given to the running service with
/// `SandboxService::set_executor`; the built-in `sandbox` one otherwise).
#[derive(Debug, Clone)]
pub struct ExecutionsConfig {
    /// The timeout of an execution whose request names none.
    pub default_timeout: Duration,
    /// The longest timeout a request may name.
    pub max_timeout: Duration,
    /// The most output kept per execution (stdout and stderr together).
    pub log_limit: u64,
    /// How often a running execution's executor is asked where it stands.
    pub poll_interval: Duration,
    /// Ended executions kept per tenant (the oldest go first; the audit log keeps every step).
    pub keep_ended_per_tenant: u32,
}

impl Default for ExecutionsConfig {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(600),
            max_timeout: Duration::from_secs(6 * 3600),
            log_limit: 1 << 20,
            poll_interval: Duration::from_millis(250),
            keep_ended_per_tenant: 1000,
        }
    }
}

/// The approvals queue's configuration.
#[derive(Debug, Clone)]
pub struct ApprovalsConfig {
    /// How long a pending approval waits for a person before it expires (and how long an approved
    /// one may be used).
    pub ttl: Duration,
    /// How long a held request waits for a decision before it is answered `approval_pending` (the
    /// default, and the most a request's `approval_wait_ms` may ask).
    pub wait: Duration,
    /// Approvals a tenant may have pending at once (`quota_exceeded` past it).
    pub max_pending_per_tenant: u64,
    /// Decided approvals kept per tenant (the oldest go first); the audit log keeps every decision.
    pub keep_decided_per_tenant: u32,
    /// The key signed webhook callbacks (`POST /v1/approvals/{id}/callback`) are checked with (the
    /// webhook's key); `None`: callbacks are refused.
    pub callback_key: Option<CallbackKey>,
}

/// An HMAC key, never shown in logs.
#[derive(Clone)]
pub struct CallbackKey(pub Vec<u8>);

impl std::fmt::Debug for CallbackKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallbackKey(<redacted>)")
    }
}

impl Default for ApprovalsConfig {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(3600),
            wait: Duration::from_secs(60),
            max_pending_per_tenant: 256,
            keep_decided_per_tenant: 1000,
            callback_key: None,
        }
    }
}

/// Building templates from images.
#[derive(Debug, Clone, Default)]
pub struct ImagesConfig {
    /// A directory (the server's own) where each build pulls its image, removed after the build;
    /// `None`: builds are refused.
    pub pull_dir: Option<std::path::PathBuf>,
    /// How registries are reached (credentials, extra CA, plain-HTTP loopback registries) and how
    /// much a pull may fetch.
    pub pull: paddock_registry::PullOptions,
    /// Bounds of unpacking.
    pub limits: paddock_runtime::TemplateLimits,
}

/// Connections from the host to sandboxes' own ports: every one counts against its sandbox's, its
/// tenant's and the server's cap while it is open (a caller over a cap is refused with
/// `quota_exceeded`), and its audit rows are bounded (see `lifecycle/port_audit.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct PortsConfig {
    /// Open connections to one sandbox's ports.
    pub per_sandbox: u32,
    /// Open connections to the ports of one tenant's sandboxes together.
    pub per_tenant: u32,
    /// Open connections to every sandbox's ports together (each holds a descriptor).
    pub server: u32,
    /// How long a connect may take (a listener whose backlog is full never answers).
    pub connect_timeout: Duration,
    /// Repeats of a connection (same sandbox, port, door and key) within this of its row fold into
    /// one more row with a count.
    pub audit_window: Duration,
    /// First rows per second one sandbox may add, sustained (beyond: counted on a suppressed row).
    pub sandbox_rows_per_second: f64,
    /// First rows one sandbox may add at once.
    pub sandbox_burst: u32,
    /// First rows per second one tenant's sandboxes may add together, sustained.
    pub tenant_rows_per_second: f64,
    /// First rows one tenant's sandboxes may add at once.
    pub tenant_burst: u32,
}

impl Default for PortsConfig {
    fn default() -> Self {
        Self {
            per_sandbox: 256,
            per_tenant: 1024,
            server: 2048,
            connect_timeout: Duration::from_secs(5),
            audit_window: Duration::from_secs(60),
            sandbox_rows_per_second: 1.0,
            sandbox_burst: 20,
            tenant_rows_per_second: 10.0,
            tenant_burst: 200,
        }
    }
}

/// The network audit: aggregation window, row rates and retention (see `network_audit/`).
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkAuditConfig {
    /// Repeats of an event within this of its row fold into one more row with a count.
    pub window: Duration,
    /// Rows per second one sandbox may add, sustained.
    pub sandbox_rows_per_second: f64,
    /// Rows one sandbox may add at once.
    pub sandbox_burst: u32,
    /// Rows per second one tenant's sandboxes may add together, sustained.
    pub tenant_rows_per_second: f64,
    /// Rows one tenant's sandboxes may add at once.
    pub tenant_burst: u32,
    /// Network rows older than this are removed.
    pub retention: Duration,
    /// Each tenant keeps at most this many network rows (its oldest go first).
    pub max_rows_per_tenant: u64,
    /// How often retention runs.
    pub retention_interval: Duration,
}

impl Default for NetworkAuditConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(10),
            sandbox_rows_per_second: 10.0,
            sandbox_burst: 100,
            tenant_rows_per_second: 50.0,
            tenant_burst: 500,
            retention: Duration::from_secs(30 * 24 * 3600),
            max_rows_per_tenant: 250_000,
            retention_interval: Duration::from_secs(60),
        }
    }
}

/// A template: a root file system and how many sandboxes of it to keep warm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateConfig {
    /// Its root file system (ignored when `image` or `recipe` is given).
    pub rootfs: RootfsSpec,
    /// Sandboxes kept pre-started, so creation is a claim.
    pub warm_pool_size: u32,
    /// Built from this registry image (a reference), owned by the operator, for every tenant.
    pub image: Option<String>,
    /// Built from this recipe (its text), owned by the operator, for every tenant.
    pub recipe: Option<String>,
    /// Built as a Debian base by `mmdebstrap`, owned by the operator, for every tenant.
    pub debian: Option<DebianBase>,
    /// Code contexts (languages: `python`, `javascript`, `bash`) the warm pool's sandboxes start
    /// ahead, so a claimed sandbox's first cell does not wait for its kernel.
    pub kernels: Vec<String>,
    /// How a `recipe` is built: its build arguments and its `RUN` steps' network.
    pub build: RecipeBuild,
}

/// The build arguments of a configured recipe and the network its `RUN` steps get (none: loopback
/// only, as for a build through the API without `network`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecipeBuild {
    pub args: std::collections::BTreeMap<String, String>,
    pub network: Option<paddock_types::NetworkPolicy>,
}

impl RecipeBuild {
    /// What a configured template's recorded source adds for them (nothing when unset, so a
    /// template configured before they existed is not rebuilt): a change rebuilds the template.
    pub fn source_suffix(&self) -> String {
        if self.args.is_empty() && self.network.is_none() {
            return String::new();
        }
        use sha2::Digest as _;
        // Maps and a policy of strings: serializing them cannot fail.
        let text = serde_json::to_string(&(&self.args, &self.network)).unwrap_or_default();
        format!(
            ", build sha256:{}",
            &hex::encode(sha2::Sha256::digest(text.as_bytes()))[..16]
        )
    }
}

impl TemplateConfig {
    /// Whether the server builds it (from an image, a recipe or a Debian base) rather than using
    /// `rootfs`.
    pub fn is_built(&self) -> bool {
        self.image.is_some() || self.recipe.is_some() || self.debian.is_some()
    }
}

/// A Debian base the server makes with `mmdebstrap` (`[templates.NAME] debian = { suite = ... }`):
/// from the host's configured apt sources, or from the mirrors named (a local mirror serves an
/// air-gapped host).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebianBase {
    /// The suite (`bookworm`, `stable`).
    pub suite: String,
    /// `mmdebstrap`'s variant (default `minbase`: essential packages and apt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Packages added (`--include`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// Mirrors (URLs or `deb ...` lines); none: the host's apt sources.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<String>,
}

/// `mmdebstrap`'s variants.
const DEBIAN_VARIANTS: &[&str] = &[
    "extract",
    "custom",
    "essential",
    "apt",
    "required",
    "minbase",
    "buildd",
    "important",
    "debootstrap",
    "standard",
];

impl DebianBase {
    /// Refuses what `mmdebstrap` would misread: names outside Debian's characters, an unknown
    /// variant, a mirror on several lines.
    pub fn validate(&self) -> Result<(), String> {
        let word = |w: &str| {
            !w.is_empty()
                && !w.starts_with('-')
                && w.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-' | b'_' | b':' | b'=')
                })
        };
        if !word(&self.suite) {
            return Err(format!("suite {:?} is not a suite name", self.suite));
        }
        if let Some(v) = &self.variant {
            if !DEBIAN_VARIANTS.contains(&v.as_str()) {
                return Err(format!("variant {v:?}: one of {}", DEBIAN_VARIANTS.join(", ")));
            }
        }
        if let Some(p) = self.packages.iter().find(|p| !word(p)) {
            return Err(format!("package {p:?} is not a package name"));
        }
        if let Some(m) = self
            .mirrors
            .iter()
            .find(|m| m.is_empty() || m.contains(['\n', '\r', '\0']))
        {
            return Err(format!("mirror {m:?}: one URL or `deb` line"));
        }
        Ok(())
    }

    /// What a template made of it records as its source (what a restart compares).
    pub fn source(&self) -> String {
        let mut text = format!(
            "debian: {} ({})",
            self.suite,
            self.variant.as_deref().unwrap_or("minbase")
        );
        if !self.packages.is_empty() {
            text.push_str(&format!(" + {}", self.packages.join(",")));
        }
        for m in &self.mirrors {
            text.push_str(&format!(" from {m}"));
        }
        text
    }
}

impl Default for ServiceConfig {
    fn default() -> Self {
        let mut templates = BTreeMap::new();
        templates.insert(
            "default".to_owned(),
            TemplateConfig {
                rootfs: RootfsSpec::Host,
                warm_pool_size: 0,
                image: None,
                recipe: None,
                debian: None,
                kernels: Vec::new(),
                build: Default::default(),
            },
        );
        Self {
            default_limits: Limits::default(),
            max_limits: Limits {
                memory: None,
                cpus: None,
                pids: None,
                disk: None,
            },
            quotas: TenantQuota::default(),
            default_timeout: Duration::from_secs(300),
            max_timeout: Duration::from_secs(24 * 3600),
            templates,
            reaper_interval: Duration::from_secs(1),
            history_retention: Duration::from_secs(7 * 24 * 3600),
            max_import_bytes: 10 << 30,
            network: None,
            collect_budget_bytes: DEFAULT_COLLECT_BUDGET,
            network_audit: NetworkAuditConfig::default(),
            ports: PortsConfig::default(),
            images: ImagesConfig::default(),
            approvals: ApprovalsConfig::default(),
            executions: ExecutionsConfig::default(),
        }
    }
}

/// The egress proxy's configuration, in the service's.
#[derive(Debug, Clone)]
pub struct NetworkConfig {
    /// The ports the proxy listens on, on the host side of every sandbox's link.
    pub ports: EgressPorts,
    /// The proxy itself: the operator's deny list and exceptions, host map, resolver, upstream
    /// trust, and the bounds on what sandboxes can make it hold.
    pub egress: EgressConfig,
    /// Each networked sandbox's share of the host's connection tracking table (its link's firewall).
    pub conntrack: ConntrackLimits,
}
