//! The sandboxes themselves as tools: create (template, limits, network allowlist, a lifetime
//! that always ends), info, list and kill. Each a thin translation onto the service.
//!
//! What it does not do: decide what a tenant may create (the service's quotas, the operator's
//! limits and network rules refuse what is beyond them, and the refusal is the tool's error).

use std::collections::BTreeMap;

use paddock_types::api::{CreateSandboxRequest, LimitsRequest, ListSandboxesQuery, SandboxInfo};
use paddock_types::{ByteSize, Cidr, CpuQuota, DomainPattern, EgressRule, EgressTarget, NetworkPolicy};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tools::{failure, sandbox_id, wire_name};
use crate::PaddockMcp;

/// A sandbox's lifetime when `sandbox_create` names none: it ends by itself after this.
pub const DEFAULT_SANDBOX_TIMEOUT_SECS: u64 = 600;
/// `sandbox_create`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxCreateArgs {
    /// The template to start from (e.g. `code-interpreter`); the server's default when absent.
    #[serde(default)]
    pub template: Option<String>,
    /// Seconds until the sandbox ends by itself (default 600). Kill it sooner when done.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Environment variables of every process in the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Memory limit, e.g. `512M` or `2G` (the server's default when absent; at most its maximum).
    #[serde(default)]
    pub memory: Option<String>,
    /// CPUs it may use, fractions allowed, e.g. `0.5` or `2` (the server's default when absent).
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Hosts it may reach over the network, on every port: domain names (`pypi.org`), `*.`
    /// patterns (`*.github.com`), addresses or CIDRs (`203.0.113.0/24`). Absent: no network
    /// (loopback only); `[]`: a network on which every attempt is refused. The server may offer no
    /// network, or forbid some hosts whatever this says.
    #[serde(default)]
    pub network_allow: Option<Vec<String>>,
}

/// A sandbox, as the tools report it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxSummary {
    /// Its id: pass it to the other tools.
    pub sandbox_id: String,
    /// The template it started from.
    pub template: String,
    /// `running`, `stopped`, ...
    pub state: String,
    /// When it ends by itself (RFC 3339), if it does.
    pub expires_at: Option<String>,
}

/// A sandbox's resource limits (`null`: none of that kind).
#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxLimits {
    /// Memory, e.g. `1G`.
    pub memory: Option<String>,
    /// CPUs.
    pub cpus: Option<f64>,
    /// Processes and threads alive at once.
    pub pids: Option<u32>,
    /// Disk space it may write, e.g. `10G`.
    pub disk: Option<String>,
}

/// `sandbox_info`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxDetails {
    /// Its id.
    pub sandbox_id: String,
    /// The template it started from.
    pub template: String,
    /// `running`, `stopped`, `killed`, `expired` or `failed`.
    pub state: String,
    /// Whether every process is frozen.
    pub paused: bool,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// When it ends by itself (RFC 3339), if it does.
    pub expires_at: Option<String>,
    /// When it ended, if it has.
    pub ended_at: Option<String>,
    /// Why it ended (`killed`, `expired`, ...), if it has.
    pub end_reason: Option<String>,
    /// Its resource limits.
    pub limits: SandboxLimits,
    /// The user processes run as by default.
    pub user: String,
    /// The default working directory, when set.
    pub workdir: Option<String>,
    /// Names of its environment variables (never their values).
    pub env_keys: Vec<String>,
}

/// `sandbox_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SandboxList {
    /// The running sandboxes of this key's tenant, oldest first.
    pub sandboxes: Vec<SandboxSummary>,
}

/// Arguments naming one sandbox.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArgs {
    /// The sandbox (from `sandbox_create` or `sandbox_list`).
    pub sandbox_id: String,
}

/// `sandbox_kill`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Killed {
    /// The sandbox removed.
    pub sandbox_id: String,
}

/// A policy allowing `hosts` (domain patterns or CIDRs) on every port.
fn network_policy(hosts: Vec<String>) -> Result<NetworkPolicy, String> {
    let allow = hosts
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let target = match host.parse::<Cidr>() {
                Ok(cidr) => EgressTarget::Cidr(cidr),
                Err(_) => EgressTarget::Domain(
                    host.parse::<DomainPattern>()
                        .map_err(|e| format!("invalid_request: network_allow.{i}: {e}"))?,
                ),
            };
            Ok(EgressRule::new(target, Vec::new()))
        })
        .collect::<Result<Vec<_>, String>>()?;
    NetworkPolicy::new(allow, Vec::new()).map_err(|e| format!("invalid_request: network_allow: {e}"))
}

pub(crate) fn summary(info: SandboxInfo) -> SandboxSummary {
    SandboxSummary {
        sandbox_id: info.id,
        template: info.template,
        state: wire_name(info.state),
        expires_at: info.expires_at,
    }
}

#[tool_router(router = sandboxes_router, vis = "pub(crate)")]
impl PaddockMcp {
    #[tool(
        name = "sandbox_create",
        description = "Create a new isolated Linux sandbox and return its sandbox_id. It ends by itself after timeout_secs (default 600); call sandbox_kill when done.",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn sandbox_create(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxCreateArgs>,
    ) -> Result<Json<SandboxSummary>, String> {
        let p = self.principal(&ctx)?;
        let limits = LimitsRequest {
            memory: args
                .memory
                .as_deref()
                .map(str::parse::<ByteSize>)
                .transpose()
                .map_err(|e| format!("invalid_request: memory: {e}"))?,
            cpus: args
                .cpus
                .map(CpuQuota::try_from)
                .transpose()
                .map_err(|e| format!("invalid_request: cpus: {e}"))?,
            ..LimitsRequest::default()
        };
        let request = CreateSandboxRequest {
            template: args.template,
            timeout_secs: Some(args.timeout_secs.unwrap_or(DEFAULT_SANDBOX_TIMEOUT_SECS)),
            env: args.env,
            limits,
            network: args.network_allow.map(network_policy).transpose()?,
            ..CreateSandboxRequest::default()
        };
        let info = self.service.create_sandbox(&p, request).await.map_err(failure)?;
        Ok(Json(summary(info)))
    }

    #[tool(
        name = "sandbox_info",
        description = "Show one sandbox's details: its state, template, when it expires or why it ended, its resource limits, user and working directory.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn sandbox_info(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<Json<SandboxDetails>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let info = self.service.get_sandbox(&p, &id).await.map_err(failure)?;
        Ok(Json(SandboxDetails {
            state: wire_name(info.state),
            paused: info.paused,
            created_at: info.created_at,
            expires_at: info.expires_at,
            ended_at: info.ended_at,
            end_reason: info.end_reason,
            limits: SandboxLimits {
                memory: info.limits.memory.map(|m| m.to_string()),
                cpus: info.limits.cpus.map(f64::from),
                pids: info.limits.pids,
                disk: info.limits.disk.map(|d| d.to_string()),
            },
            user: info.user,
            workdir: info.workdir,
            env_keys: info.env_keys,
            template: info.template,
            sandbox_id: info.id,
        }))
    }

    #[tool(
        name = "sandbox_list",
        description = "List your running sandboxes.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn sandbox_list(&self, ctx: RequestContext<RoleServer>) -> Result<Json<SandboxList>, String> {
        let p = self.principal(&ctx)?;
        let list = self
            .service
            .list_sandboxes(&p, ListSandboxesQuery::default())
            .await
            .map_err(failure)?;
        Ok(Json(SandboxList {
            sandboxes: list.sandboxes.into_iter().map(summary).collect(),
        }))
    }

    #[tool(
        name = "sandbox_kill",
        description = "Remove a sandbox and everything in it, at once.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn sandbox_kill(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<Json<Killed>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        self.service.kill_sandbox(&p, &id).await.map_err(failure)?;
        Ok(Json(Killed {
            sandbox_id: args.sandbox_id,
        }))
    }
}
