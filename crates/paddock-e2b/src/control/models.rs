//! E2B's control-plane bodies as the SDKs send and parse them (camelCase, except
//! `allow_internet_access`). Unknown fields are accepted and ignored, as E2B's server does for the
//! SDKs' telemetry-shaped extras; fields paddock cannot honour are refused where they are read.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `POST /sandboxes` (SDK 2.45: `NewSandbox`) and `POST /v2/sandboxes` (2.6x: `NewSandboxV2`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewSandbox {
    /// Template id or alias (`base`), or a snapshot id.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Seconds until the sandbox ends (E2B's default: 300).
    #[serde(default)]
    pub timeout: Option<u64>,
    /// Pause instead of kill when the timeout passes.
    #[serde(default)]
    pub auto_pause: Option<bool>,
    /// Older SDKs: secure envd traffic (paddock always does).
    #[serde(default)]
    pub secure: Option<bool>,
    /// E2B's "internet" switch (see `E2bConfig::internet_access`).
    #[serde(default, rename = "allow_internet_access")]
    pub allow_internet_access: Option<bool>,
    /// Egress lists and public-traffic switch.
    #[serde(default)]
    pub network: Option<NetworkConfig>,
    /// Free-form metadata (paddock's labels).
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Environment of every process.
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
    /// E2B's MCP gateway (not offered).
    #[serde(default)]
    pub mcp: Option<serde_json::Value>,
    /// Volume mounts (not offered through this door).
    #[serde(default)]
    pub volume_mounts: Option<Vec<serde_json::Value>>,
}

/// A sandbox's network settings (create and `PUT /sandboxes/{id}/network`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfig {
    /// Destinations allowed (addresses, CIDRs or domain names); E2B lets them through even when a
    /// `denyOut` entry covers them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_out: Option<Vec<String>>,
    /// Destinations refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny_out: Option<Vec<String>>,
    /// Whether the sandbox's ports answer without the traffic token (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_public_traffic: Option<bool>,
    /// The internet switch, inside the network body of `PUT .../network`.
    #[serde(
        default,
        rename = "allow_internet_access",
        skip_serializing_if = "Option::is_none"
    )]
    pub allow_internet_access: Option<bool>,
}

/// `POST /sandboxes/{id}/connect` and `/v2/...`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ConnectRequest {
    /// Seconds the sandbox should live from now at least (only ever extends).
    #[serde(default)]
    pub timeout: Option<u64>,
}

/// `POST /sandboxes/{id}/timeout`.
#[derive(Debug, Clone, Deserialize)]
pub struct TimeoutRequest {
    /// Seconds from now (may shorten).
    pub timeout: u64,
}

/// `POST /sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SnapshotRequest {
    /// The snapshot's name.
    #[serde(default)]
    pub name: Option<String>,
}

/// `POST /sandboxes/{id}/fork`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ForkRequest {
    /// Seconds each copy lives.
    #[serde(default)]
    pub timeout: Option<u64>,
    /// How many copies (1-20).
    #[serde(default)]
    pub count: Option<u32>,
}

/// What create, connect and fork answer (`Sandbox`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxBody {
    /// The template (or snapshot) it was made from.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Its id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Deprecated by E2B; always "paddock".
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    /// The template's alias.
    pub alias: String,
    /// The envd version paddock speaks.
    pub envd_version: &'static str,
    /// The envd access token.
    pub envd_access_token: String,
    /// The traffic token, when the sandbox's ports are private.
    pub traffic_access_token: Option<String>,
    /// The domain of per-sandbox hosts.
    pub domain: Option<String>,
}

/// `GET /sandboxes/{id}` (`SandboxDetail`) and one entry of `GET /v2/sandboxes` (`ListedSandbox`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDetail {
    /// Template.
    #[serde(rename = "templateID")]
    pub template_id: String,
    /// Alias.
    pub alias: String,
    /// Id.
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    /// Deprecated by E2B.
    #[serde(rename = "clientID")]
    pub client_id: &'static str,
    /// Creation time.
    pub started_at: String,
    /// When it ends (its expiry).
    pub end_at: String,
    /// CPUs it may use.
    pub cpu_count: u32,
    /// Memory limit in MiB.
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    /// Disk limit in MiB.
    #[serde(rename = "diskSizeMB")]
    pub disk_size_mb: u64,
    /// `running` or `paused`.
    pub state: &'static str,
    /// The envd version.
    pub envd_version: &'static str,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// The envd token (details only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub envd_access_token: Option<String>,
    /// The domain (details only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// What its timeout does (details only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
}

/// `SandboxLifecycle`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Lifecycle {
    /// Resumed on traffic (never, in paddock).
    pub auto_resume: bool,
    /// `kill` or `pause`.
    pub on_timeout: &'static str,
}

/// `SandboxMetric`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    /// Sample time.
    pub timestamp: String,
    /// Sample time in Unix seconds.
    pub timestamp_unix: i64,
    /// CPUs.
    pub cpu_count: u32,
    /// CPU use in percent of `cpu_count` CPUs, averaged since the sandbox started.
    pub cpu_used_pct: f64,
    /// Memory in use (bytes).
    pub mem_used: u64,
    /// Memory limit (bytes).
    pub mem_total: u64,
    /// Page cache (bytes; not measured separately: 0).
    pub mem_cache: u64,
    /// Disk written (bytes).
    pub disk_used: u64,
    /// Disk limit (bytes).
    pub disk_total: u64,
}

/// `SnapshotInfo`.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotBody {
    /// The snapshot's id (usable as a `templateID`).
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    /// Its names.
    pub names: Vec<String>,
}
