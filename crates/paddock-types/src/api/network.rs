//! A sandbox's network: its egress policy, the secrets injected for it, and what it connected to; and
//! a tenant's secrets.
//!
//! A sandbox created without `network` has loopback only. With it, every connection and DNS question
//! goes through paddock's egress proxy, which allows what the policy allows (the operator's deny list
//! still applies on top), records every attempt in the audit log, and replaces `paddock-secret:NAME`
//! placeholders with secret values in requests to the hosts each secret is bound to, in the header
//! fields (and optionally the query string) the secret is bound to.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::NetworkPolicy;

/// `PUT /v1/sandboxes/{id}/network`: replaces the policy and/or the injected secrets of a networked
/// sandbox. New connections and DNS questions follow it at once; established ones are not cut.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetNetworkRequest {
    /// The new policy (unchanged when absent).
    #[serde(default)]
    pub policy: Option<NetworkPolicy>,
    /// Names of the tenant's secrets to inject from now on (unchanged when absent).
    #[serde(default)]
    pub secrets: Option<Vec<String>>,
}

/// One recorded connection or DNS question of a sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NetworkEvent {
    /// `connection` or `dns`.
    pub kind: String,
    /// When (RFC 3339; a connection's end, or its refusal).
    pub at: String,
    /// Whether it was let through.
    pub allowed: bool,
    /// The record as the egress proxy wrote it: name, ip, port, rule, bytes each way, duration, door,
    /// secrets injected (names only).
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

/// `GET /v1/sandboxes/{id}/network`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SandboxNetworkInfo {
    /// The sandbox.
    pub sandbox_id: String,
    /// Its policy.
    pub policy: NetworkPolicy,
    /// Names of the secrets injected for it.
    pub secrets: Vec<String>,
    /// `HTTP(S)_PROXY` inside the sandbox, while it runs.
    #[serde(default)]
    pub proxy_url: Option<String>,
    /// The sandbox's address on its link, while it runs.
    #[serde(default)]
    pub sandbox_ip: Option<String>,
    /// The most recent connections and DNS questions, newest first.
    pub recent: Vec<NetworkEvent>,
}

/// `POST /v1/secrets`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSecretRequest {
    /// Its name: 1-64 characters of `A-Z a-z 0-9 _`, not starting with a digit. Inside a sandbox it
    /// is the placeholder `paddock-secret:NAME` (and the environment variable `NAME` holds that).
    pub name: String,
    /// Its value (never returned, logged or sent into a sandbox).
    pub value: String,
    /// Hosts it may be sent to: names (`api.example.com`) or `*.suffix` patterns. The value replaces
    /// its placeholder only in requests to these hosts (a request whose `Host` or URL names another
    /// host is refused by the proxy); to any other host the placeholder goes out unchanged.
    pub hosts: Vec<String>,
    /// Request header fields the value may be substituted into (case-insensitive; at most 16; not
    /// `Host`, `Content-Length`, `Transfer-Encoding`, `Connection` or other framing fields). Absent:
    /// `["authorization"]`. A placeholder in any other field is forwarded unchanged. The upstream
    /// sees the value in these fields: an endpoint of a bound host that echoes them returns it.
    #[serde(default)]
    pub headers: Option<Vec<String>>,
    /// Also substitute the value (percent-encoded) into the query string of requests to the hosts.
    /// Bodies are never substituted.
    #[serde(default)]
    pub query: bool,
}

impl std::fmt::Debug for CreateSecretRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateSecretRequest")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .field("headers", &self.headers)
            .field("query", &self.query)
            .finish_non_exhaustive()
    }
}

/// A secret, without its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SecretInfo {
    /// Its name.
    pub name: String,
    /// Hosts it may be sent to.
    pub hosts: Vec<String>,
    /// Header fields (lowercase) the value may be substituted into.
    pub headers: Vec<String>,
    /// Whether the value may be substituted into query strings too.
    pub query: bool,
    /// When it was created (RFC 3339).
    pub created_at: String,
}

/// `GET /v1/secrets`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SecretList {
    /// The tenant's secrets, in name order.
    pub secrets: Vec<SecretInfo>,
}
