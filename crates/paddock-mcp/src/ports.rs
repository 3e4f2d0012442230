//! `port_url`: where a server listening on a port of a sandbox answers from outside it, built from
//! the operator's settings ([`McpSettings`](crate::McpSettings)): the API's proxy route
//! `{public_url}/v1/sandboxes/{id}/ports/{port}/http/` (it needs the same API key, as a bearer
//! token) and, when a port domain is set, the sandbox's own host `https://{port}-{id}.{domain}`
//! (E2B's shape, which needs no credentials when the sandbox's ports are public).
//!
//! What it does not do: check that anything listens on the port (a request finds out:
//! `port_closed`), open the port or proxy anything itself, or hand out credentials.

use paddock_types::api::SandboxStateBody;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tools::{failure, sandbox_id, wire_name};
use crate::{McpSettings, PaddockMcp};

/// `port_url`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PortUrlArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// The TCP port a server in the sandbox listens on (1-65535; on 127.0.0.1 or 0.0.0.0).
    pub port: u16,
}

/// `port_url`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PortUrl {
    /// The sandbox.
    pub sandbox_id: String,
    /// The port.
    pub port: u16,
    /// The port's root through paddock's API (HTTP and WebSockets); requests need the header
    /// `Authorization: Bearer <the API key you use here>`. Absent when the server has no public
    /// URL configured.
    pub url: Option<String>,
    /// The sandbox's own host for the port, when the server has a port domain: it opens in a
    /// browser if `host_url_public`.
    pub host_url: Option<String>,
    /// Whether `host_url` answers without credentials (the sandbox was created with public
    /// ports); otherwise it needs the sandbox's E2B traffic access token, which this tool does
    /// not give.
    pub host_url_public: bool,
}

/// The URLs of port `port` of sandbox `id` under `settings`: the API route's and the host's.
fn port_urls(settings: &McpSettings, id: &str, port: u16) -> (Option<String>, Option<String>) {
    let url = settings.public_url.as_deref().map(|base| {
        format!(
            "{}/v1/sandboxes/{id}/ports/{port}/http/",
            base.trim_end_matches('/')
        )
    });
    let host = settings
        .port_domain
        .as_deref()
        .map(|domain| format!("https://{port}-{id}.{}", domain.trim_matches('.')));
    (url, host)
}

#[tool_router(router = ports_router, vis = "pub(crate)")]
impl PaddockMcp {
    #[tool(
        name = "port_url",
        description = "Get the URL where a server running in a sandbox on a port (e.g. a web app on 8000) answers from outside. Start the server first (listening on 0.0.0.0 or 127.0.0.1); this tool does not check that it listens.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn port_url(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<PortUrlArgs>,
    ) -> Result<Json<PortUrl>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        if args.port == 0 {
            return Err("invalid_request: port: between 1 and 65535".to_owned());
        }
        let info = self.service.get_sandbox(&p, &id).await.map_err(failure)?;
        if info.state != SandboxStateBody::Running {
            return Err(format!(
                "sandbox_not_running: sandbox {} is {}",
                info.id,
                wire_name(info.state)
            ));
        }
        if info.paused {
            return Err(format!(
                "sandbox_not_running: sandbox {} is paused; resume it first",
                info.id
            ));
        }
        let (url, host_url) = port_urls(&self.settings, id.as_str(), args.port);
        if url.is_none() && host_url.is_none() {
            return Err("unsupported: this server has no public URL configured for sandbox ports".to_owned());
        }
        Ok(Json(PortUrl {
            sandbox_id: info.id,
            port: args.port,
            url,
            host_url_public: host_url.is_some() && info.public_ports,
            host_url,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_follow_the_api_route_and_e2bs_host_shape() {
        let settings = McpSettings {
            public_url: Some("http://127.0.0.1:8080/".into()),
            port_domain: Some("sb.example.test".into()),
        };
        assert_eq!(
            port_urls(&settings, "sb-1", 8000),
            (
                Some("http://127.0.0.1:8080/v1/sandboxes/sb-1/ports/8000/http/".into()),
                Some("https://8000-sb-1.sb.example.test".into())
            )
        );
        assert_eq!(port_urls(&McpSettings::default(), "sb-1", 80), (None, None));
    }
}
