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

mod code;
mod audit;
pub mod endpoint;
mod files;
pub mod stdio;
mod progress;
mod sessions;
mod network;
mod ports;
mod processes;
mod snapshots;
mod steps;
mod tools;

use paddock_control::{Principal, SandboxService, ToolCallOutcome, ToolCallRecord};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorData, Implementation, ServerCapabilities, ServerConfig,
};
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
read, write, list and edit its files with file_read, file_write, file_list and file_edit (and \
file_stat, file_mkdir, file_move, file_remove), run servers and other long-running commands in \
the background with process_start (then process_read, process_write, process_signal, \
process_list), see a sandbox's state and limits with sandbox_info, save \
its files with checkpoint and return to them with rollback (commit keeps a step and drops its \
checkpoint; snapshot_create saves a named state, sandbox_fork copies a sandbox to try \
alternatives), run notebook-style cells with run_code, read or change its egress policy with \
network_get and network_set, get the URL of a server it runs with port_url, and remove it with \
sandbox_kill when the task is done. Nothing you do in a sandbox reaches the host or other \
sandboxes; its network is what the sandbox's policy allows.";

/// What the operator configures of the MCP front-end beyond the service.
#[derive(Debug, Clone, Default)]
pub struct McpSettings {
    /// The server's own URL as agents reach it (`http://127.0.0.1:8080`): the base of the URLs
    /// tools hand out (a port's `/v1/sandboxes/{id}/ports/{port}/http/`). `None`: tools that need
    /// it say so.
    pub public_url: Option<String>,
    /// The domain of per-sandbox hosts `<port>-<id>.<domain>` (the E2B front-end's), when set.
    pub port_domain: Option<String>,
}

/// The MCP server: of one principal, or of each request's (see [`PaddockMcp::per_request`]).
#[derive(Clone)]
pub struct PaddockMcp {
    service: SandboxService,
    /// `None`: each request's, from its HTTP request's extensions.
    principal: Option<Principal>,
    settings: std::sync::Arc<McpSettings>,
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
    pub fn new(service: SandboxService, principal: Principal, settings: McpSettings) -> Self {
        Self {
            service,
            principal: Some(principal),
            settings: settings.into(),
            tool_router: Self::all_tools(),
        }
    }

    /// The tools of whoever each HTTP request authenticated as: the [`Principal`] the endpoint's
    /// authentication put in the request's extensions. A request without one is refused, so a
    /// session (of the protocol's older generation) never lends one key's rights to another.
    pub fn per_request(service: SandboxService, settings: std::sync::Arc<McpSettings>) -> Self {
        Self {
            service,
            principal: None,
            settings,
            tool_router: Self::all_tools(),
        }
    }

    /// Every tool, from each module's router.
    fn all_tools() -> ToolRouter<Self> {
        Self::tool_router()
            + Self::steps_router()
            + Self::snapshots_router()
            + Self::network_router()
            + Self::code_router()
            + Self::ports_router()
            + Self::files_router()
            + Self::processes_router()
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
    /// Runs the tool, stopped when the client cancels the call (dropping what it was doing: a
    /// command's process tree is killed), and records the call as one `mcp.call` audit row.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let principal = self.principal(&context).ok();
        let tool = request.name.to_string();
        let arguments = serde_json::Value::Object(request.arguments.clone().unwrap_or_default());
        let cancelled = context.ct.clone();
        let call = ToolCallContext::new(self, request, context);
        let (response, outcome) = tokio::select! {
            response = self.tool_router.call(call) => {
                let outcome = audit::outcome(&response);
                (response, outcome)
            }
            () = cancelled.cancelled() => (
                Err(ErrorData::invalid_request("the call was cancelled", None)),
                ToolCallOutcome::Cancelled,
            ),
        };
        if let Some(p) = principal {
            let sandbox = audit::sandbox_named(&arguments);
            let record = ToolCallRecord {
                tool: &tool,
                sandbox: sandbox.as_deref(),
                arguments: &arguments,
                outcome,
            };
            // A call whose row cannot be written answers with that failure, not its own result:
            // nothing an agent did goes unrecorded.
            self.service
                .record_tool_call(&p, record)
                .await
                .map_err(|e| ErrorData::internal_error(tools::failure(e), None))?;
        }
        response
    }

    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("paddock", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
