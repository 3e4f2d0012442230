//! The MCP front-end: a tenant's sandboxes as Model Context Protocol tools, served with `rmcp`.
//!
//! Each tool is a thin translation onto [`SandboxService`] for one [`Principal`] (the key the
//! client authenticated with): the same tenancy, quotas, limits, network policy and audit rows as
//! `/v1`. Tool failures (an unknown sandbox, a refused request) are tool results with `isError`
//! and the service's stable code in the text, so a model can read and recover; a command's
//! non-zero exit is data, not an error. Structured results come with their output schema.
//!
//! What it does not do (yet): the stdio transport, long-running processes, code cells, resources
//! or prompts. `endpoint` is the Streamable HTTP service `paddock serve` mounts at `/mcp`.

pub mod endpoint;
mod steps;
mod tools;

use paddock_control::{Principal, SandboxService};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool_handler, RoleServer, ServerHandler};

pub use tools::{
    CommandResult, FileContent, FileReadArgs, FileWriteArgs, FileWritten, Killed, RunCommandArgs,
    SandboxArgs, SandboxCreateArgs, SandboxList, SandboxSummary, DEFAULT_COMMAND_TIMEOUT_SECS,
    DEFAULT_SANDBOX_TIMEOUT_SECS, MAX_FILE_READ, MAX_OUTPUT,
};

/// What the server tells a model about itself when a client connects.
const INSTRUCTIONS: &str = "paddock runs each sandbox as a disposable Linux machine. Create one \
with sandbox_create (it ends by itself after timeout_secs), run commands in it with run_command, \
read, write, list and edit its files with file_read, file_write, file_list and file_edit, save \
its files with checkpoint and return to them with rollback, and remove it with sandbox_kill when \
the task is done. Nothing you do in a sandbox reaches the host or other sandboxes; its network is \
what the sandbox's policy allows.";

/// The MCP server: of one principal, or of each request's (see [`PaddockMcp::per_request`]).
#[derive(Clone)]
pub struct PaddockMcp {
    service: SandboxService,
    /// `None`: each request's, from its HTTP request's extensions.
    principal: Option<Principal>,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for PaddockMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaddockMcp")
            .field("tenant", &self.principal.as_ref().map(|p| &p.tenant))
            .finish_non_exhaustive()
    }
}

impl PaddockMcp {
    /// The tools of `principal`'s sandboxes (stdio: one client, one key).
    pub fn new(service: SandboxService, principal: Principal) -> Self {
        Self {
            service,
            principal: Some(principal),
            tool_router: Self::tool_router() + Self::steps_router(),
        }
    }

    /// The tools of whoever each HTTP request authenticated as: the [`Principal`] the endpoint's
    /// authentication put in the request's extensions. A request without one is refused, so a
    /// session (of the protocol's older generation) never lends one key's rights to another.
    pub fn per_request(service: SandboxService) -> Self {
        Self {
            service,
            principal: None,
            tool_router: Self::tool_router() + Self::steps_router(),
        }
    }

    /// The principal a tool call acts for.
    fn principal(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, String> {
        if let Some(p) = &self.principal {
            return Ok(p.clone());
        }
        ctx.extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<Principal>())
            .cloned()
            .ok_or_else(|| "unauthorized: this request carries no API key".to_owned())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for PaddockMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("paddock", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
