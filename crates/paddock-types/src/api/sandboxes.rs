//! Sandbox lifecycle bodies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::{ByteSize, CpuQuota};

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Template (root file system profile) to start from; `default` (the host's curated /usr and /etc)
    /// when absent. Templates are configured on the server; `GET /v1/templates` lists them.
    #[serde(default)]
    pub template: Option<String>,
    /// Resource limits; absent fields take the server's defaults.
    #[serde(default)]
    pub limits: LimitsRequest,
    /// Environment added to every process of the sandbox.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Default working directory of processes (absolute path inside the sandbox).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Default user of processes (`user` when absent).
    #[serde(default)]
    pub user: Option<String>,
    /// Free-form labels to find the sandbox again (`GET /v1/sandboxes?label=k=v`).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Seconds until the sandbox is killed (the server's default when absent; at most the server's
    /// maximum). Extend with `POST /v1/sandboxes/{id}/timeout`.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Start from this snapshot's file system (copy-on-write) instead of the template's.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// What happens when the timeout passes: `kill` (default), `pause` (every process frozen, memory
    /// kept) or `stop` (processes end, files kept; survives a server restart). A paused or stopped
    /// sandbox does not expire again until `POST .../resume`, which restarts its timeout.
    #[serde(default)]
    pub on_timeout: Option<OnTimeout>,
    /// Record the file changes of every process (a diff summary since its start: added, modified and
    /// deleted paths with sizes) in the audit log as `process.diff`. Costs a snapshot per process
    /// start (a few milliseconds); concurrent processes' changes appear in each other's diffs.
    #[serde(default)]
    pub audit_exec_diff: bool,
    /// Named volumes to mount (`POST /v1/volumes`), shared with every other sandbox mounting them.
    /// They are not part of the sandbox's own file system: its snapshots and diffs leave them out,
    /// and its forks mount the same volumes.
    #[serde(default)]
    pub volumes: Vec<super::VolumeMountRequest>,
    /// Network access through paddock's egress proxy, allowed by this policy (loopback only when
    /// absent; an empty policy gives a network on which every attempt is refused and recorded).
    /// Change it live with `PUT /v1/sandboxes/{id}/network`.
    #[serde(default)]
    pub network: Option<crate::NetworkPolicy>,
    /// Names of the tenant's secrets (`POST /v1/secrets`) to inject: each appears inside the sandbox
    /// only as the placeholder `paddock-secret:NAME`, in the environment variable `NAME`. Implies a
    /// network (with an empty policy when `network` is absent: allow the secrets' hosts there).
    #[serde(default)]
    pub secrets: Vec<String>,
    /// Serve the sandbox's own ports to anyone who knows its id on the E2B sandbox door
    /// (`<port>-<id>.<domain>`), as E2B's `allowPublicTraffic` does. When false (the default) that
    /// door asks for the sandbox's traffic access token. Proxying through
    /// `/v1/sandboxes/{id}/ports/{port}/...` always needs an API key of the sandbox's tenant.
    #[serde(default)]
    pub public_ports: bool,
}

/// What a sandbox's timeout does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// Kill it (the default): processes and files are gone.
    #[default]
    Kill,
    /// Pause it: every process frozen, memory kept.
    Pause,
    /// Stop it: processes end, files kept.
    Stop,
}

impl OnTimeout {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            OnTimeout::Kill => "kill",
            OnTimeout::Pause => "pause",
            OnTimeout::Stop => "stop",
        }
    }
}

/// Requested limits; every field optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    /// Memory limit: bytes as a number, or a string such as `512M`, `2G`.
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "512M")]
    pub memory: Option<ByteSize>,
    /// CPUs (fractions allowed), e.g. `1.5`.
    #[serde(default)]
    #[schema(value_type = Option<f64>, example = 1.5)]
    pub cpus: Option<CpuQuota>,
    /// Processes and threads alive at once.
    #[serde(default)]
    pub pids: Option<u32>,
    /// Disk space the sandbox may write.
    #[serde(default)]
    #[schema(value_type = Option<String>, example = "10G")]
    pub disk: Option<ByteSize>,
}

/// Lifecycle state of a sandbox as the API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxStateBody {
    /// Being created.
    Creating,
    /// Running; processes and files are available.
    Running,
    /// Stopped (`POST .../stop`, or its timeout with `on_timeout: stop`): no processes, files kept,
    /// also across server restarts; `POST .../resume` starts it again with the same id.
    Stopped,
    /// Killed on request.
    Killed,
    /// Killed by the reaper when its timeout passed.
    Expired,
    /// Its creation failed, or it died on its own (see `end_reason`).
    Failed,
}

/// A sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxInfo {
    /// Its id (also its hostname).
    pub id: String,
    /// The tenant that owns it.
    pub tenant: String,
    /// Lifecycle state.
    pub state: SandboxStateBody,
    /// The template it was created from.
    pub template: String,
    /// Effective limits (`null` = unlimited).
    #[schema(value_type = LimitsRequest)]
    pub limits: crate::Limits,
    /// Names of the environment variables set on the sandbox (values are never echoed).
    pub env_keys: Vec<String>,
    /// Default working directory.
    #[serde(default)]
    pub workdir: Option<String>,
    /// Default user.
    pub user: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Creation time (RFC 3339).
    pub created_at: String,
    /// When the reaper kills it (RFC 3339); `null` = never.
    #[serde(default)]
    pub expires_at: Option<String>,
    /// When it ended (RFC 3339).
    #[serde(default)]
    pub ended_at: Option<String>,
    /// Why it ended (`killed`, `expired`, `agent_lost`, `create_failed: ...`).
    #[serde(default)]
    pub end_reason: Option<String>,
    /// Every process is frozen (`POST .../pause`); `POST .../resume` thaws them.
    #[serde(default)]
    pub paused: bool,
    /// What its timeout does.
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// Every process's file changes are recorded in the audit log.
    #[serde(default)]
    pub audit_exec_diff: bool,
    /// Its ports are served without credentials on the E2B sandbox door (`public_ports` of the
    /// request).
    #[serde(default)]
    pub public_ports: bool,
    /// The named volumes it mounts.
    #[serde(default)]
    pub volumes: Vec<super::VolumeMountInfo>,
}

/// `GET /v1/sandboxes` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListSandboxesQuery {
    /// Only sandboxes in this state (`running`, `creating`, `stopped`, `killed`, `expired`, `failed`);
    /// `all` for every state. Default: `running`.
    #[serde(default)]
    pub state: Option<String>,
    /// Only sandboxes carrying this label, as `key=value` (repeatable as comma-separated list).
    #[serde(default)]
    pub label: Option<String>,
    /// Page size (1-1000, default 100).
    #[serde(default)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[serde(default, deserialize_with = "super::cursor::deserialize_cursor")]
    pub cursor: Option<String>,
}

/// A page of sandboxes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxList {
    /// The sandboxes, oldest first.
    pub sandboxes: Vec<SandboxInfo>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `POST /v1/sandboxes/{id}/timeout`: the sandbox now expires `timeout_secs` from now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetTimeoutRequest {
    /// Seconds from now (at most the server's maximum).
    pub timeout_secs: u64,
}

/// `GET /v1/sandboxes/{id}/usage`: what the sandbox uses right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SandboxUsageBody {
    /// CPU time consumed by all its processes so far, in microseconds.
    pub cpu_time_us: u64,
    /// Memory in use (bytes).
    pub memory_bytes: u64,
    /// Highest memory use seen (bytes).
    pub memory_peak_bytes: u64,
    /// Memory limit (bytes), if any.
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// Processes and threads alive.
    pub pids: u64,
    /// Bytes written to its storage.
    pub disk_bytes: u64,
    /// Disk limit (bytes), if any.
    #[serde(default)]
    pub disk_limit_bytes: Option<u64>,
}
