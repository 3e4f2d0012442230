//! The tools of a sandbox's network: read its egress policy (with the secrets injected for it and
//! its newest connections) and replace the policy or the secret list. Each a thin translation onto
//! the service, as in `tools.rs`; the policy travels in the API's own shape, with a schema a
//! model can follow.
//!
//! What it does not do: give a sandbox created without a network one (the service refuses:
//! networks are made at creation), create secrets or show their values, or decide anything about
//! a policy (the service and the egress proxy do; the operator's deny list applies on top).

use paddock_types::api::{SandboxNetworkInfo, SetNetworkRequest};
use paddock_types::NetworkPolicy;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sandboxes::SandboxArgs;
use crate::tools::{failure, sandbox_id};
use crate::PaddockMcp;

/// An egress policy. Nothing is reachable unless an `allow` rule matches; a `deny` rule overrides
/// an `allow` rule; the operator's deny list (private ranges, the host) applies on top of both.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Destinations the sandbox may reach (at most 1024 rules).
    #[serde(default)]
    pub allow: Vec<Rule>,
    /// Destinations it may not reach even when an allow rule matches (at most 1024 rules).
    #[serde(default)]
    pub deny: Vec<Rule>,
}

/// One rule: exactly one of `domain` and `cidr`, and the ports it covers.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// `example.com` (that name only), `*.example.com` (names below it, not itself) or `*` (any
    /// name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// An address range such as `203.0.113.0/24`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    /// TCP ports: a number (`443`) or a range (`"8000-8100"`); every port when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
}

/// A TCP port or an inclusive range of them.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum Port {
    /// One port.
    Number(u16),
    /// `first-last`, or one port as text.
    Range(String),
}

/// `network_set`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkSetArgs {
    /// The sandbox (it must have been created with a network).
    pub sandbox_id: String,
    /// The new policy, replacing the whole current one (unchanged when absent).
    #[serde(default)]
    pub policy: Option<Policy>,
    /// Names of your secrets to inject from now on, replacing the current list (unchanged when
    /// absent).
    #[serde(default)]
    pub secrets: Option<Vec<String>>,
}

/// One recorded connection or DNS question.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NetworkEvent {
    /// `connection` or `dns`.
    pub kind: String,
    /// When (RFC 3339).
    pub at: String,
    /// Whether the policy let it through.
    pub allowed: bool,
    /// The proxy's record: name, ip, port, the rule that decided, bytes each way.
    pub detail: serde_json::Value,
}

/// A sandbox's network, as `network_get` and `network_set` report it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct NetworkView {
    /// The sandbox.
    pub sandbox_id: String,
    /// Its egress policy.
    pub policy: Policy,
    /// Names of the secrets injected for it: a process sends `paddock-secret:NAME` and the proxy
    /// puts the value in its place, only towards the hosts the secret is bound to.
    pub secrets: Vec<String>,
    /// `HTTP(S)_PROXY` inside the sandbox, while it runs.
    pub proxy_url: Option<String>,
    /// Its most recent connections and DNS questions, newest first (at most 50, as the server
    /// keeps them).
    pub recent: Vec<NetworkEvent>,
}

/// The API's policy in the tools' shape (the same JSON).
fn policy_view(policy: &NetworkPolicy) -> Result<Policy, String> {
    serde_json::to_value(policy)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("internal: encoding a network policy: {e}"))
}

/// The tools' policy as the API's, checked (a bad domain, range or port is the caller's mistake).
fn policy_request(policy: &Policy) -> Result<NetworkPolicy, String> {
    serde_json::to_value(policy)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("invalid_request: policy: {e}"))
}

fn network_view(info: SandboxNetworkInfo) -> Result<NetworkView, String> {
    Ok(NetworkView {
        policy: policy_view(&info.policy)?,
        sandbox_id: info.sandbox_id,
        secrets: info.secrets,
        proxy_url: info.proxy_url,
        recent: info
            .recent
            .into_iter()
            .map(|e| NetworkEvent {
                kind: e.kind,
                at: e.at,
                allowed: e.allowed,
                detail: e.detail,
            })
            .collect(),
    })
}

#[tool_router(router = network_router, vis = "pub(crate)")]
impl PaddockMcp {
    #[tool(
        name = "network_get",
        description = "Show a sandbox's network: its egress policy (what it may reach), the secrets injected for it and its newest connections with whether each was allowed. A sandbox created without a network has loopback only and fails with invalid_request.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn network_get(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<Json<NetworkView>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let info = self.service.get_network(&p, &id).await.map_err(failure)?;
        Ok(Json(network_view(info)?))
    }

    #[tool(
        name = "network_set",
        description = "Replace a networked sandbox's egress policy and/or its list of injected secrets; new connections follow at once (open ones are not cut). Give the whole policy: it replaces the current one. The server may refuse (its code says why).",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn network_set(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<NetworkSetArgs>,
    ) -> Result<Json<NetworkView>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        if args.policy.is_none() && args.secrets.is_none() {
            return Err("invalid_request: policy: give policy, secrets or both".to_owned());
        }
        let request = SetNetworkRequest {
            policy: args.policy.as_ref().map(policy_request).transpose()?,
            secrets: args.secrets,
        };
        let info = self
            .service
            .set_network(&p, &id, request)
            .await
            .map_err(failure)?;
        Ok(Json(network_view(info)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_policy_goes_through_the_apis_parser_both_ways() {
        let wire = json!({
            "allow": [{"domain": "*.example.com", "ports": [443, "8000-8100"]}],
            "deny": [{"cidr": "203.0.113.0/24"}],
        });
        let policy: Policy = serde_json::from_value(wire).expect("the tools' shape");
        let parsed = policy_request(&policy).expect("a valid policy");
        let back = serde_json::to_value(policy_view(&parsed).expect("viewed")).expect("json");
        assert_eq!(back["allow"][0]["domain"], "*.example.com", "{back}");
        assert_eq!(back["deny"][0]["cidr"], "203.0.113.0/24", "{back}");
        assert_eq!(
            back["allow"][0]["ports"].as_array().map(Vec::len),
            Some(2),
            "{back}"
        );

        let both = Policy {
            allow: vec![Rule {
                domain: Some("example.com".into()),
                cidr: Some("10.0.0.0/8".into()),
                ports: Vec::new(),
            }],
            deny: Vec::new(),
        };
        assert!(policy_request(&both).is_err_and(|e| e.starts_with("invalid_request: policy:")));
        let bad_port = Policy {
            allow: vec![Rule {
                domain: Some("example.com".into()),
                cidr: None,
                ports: vec![Port::Range("https".into())],
            }],
            deny: Vec::new(),
        };
        assert!(policy_request(&bad_port).is_err_and(|e| e.contains("port")));
    }
}
