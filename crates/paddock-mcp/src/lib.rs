//! The MCP front-end: a tenant's sandboxes as Model Context Protocol tools, served with `rmcp`.
//!
//! Each tool is a thin translation onto [`SandboxService`] for one [`Principal`] (the key the
//! client authenticated with): the same tenancy, quotas, limits, network policy and audit rows as
//! `/v1`. Tool failures (an unknown sandbox, a refused request) are tool results with `isError`
//! and the service's stable code in the text, so a model can read and recover; a command's
//! non-zero exit is data, not an error. Structured results come with their output schema.
//!
//! Every call is one `mcp.call` audit row beside the rows of what it did; a cancelled call stops
//! what it was doing (a command's process tree is killed); long commands report progress.
//! `endpoint` is the Streamable HTTP service `paddock serve` mounts at `/mcp`, `stdio` serves or
//! relays MCP on stdin/stdout (`paddock mcp`).
//!
//! What it does not do: keep state between calls (every call names its sandbox), or check
//! anything the service checks (quotas, limits, network policy, ownership).

mod audit;
mod code;
pub mod endpoint;
mod files;
mod network;
mod ports;
mod processes;
mod progress;
mod prompt;
pub mod resources;
mod sandboxes;
mod sessions;
mod snapshots;
pub mod stdio;
mod steps;
mod tools;
mod transfer;

use paddock_control::{Principal, SandboxService, ToolCallOutcome, ToolCallRecord};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ErrorData, GetPromptRequestParams, GetPromptResponse,
    Implementation, ListPromptsResult, ListResourceTemplatesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ServerCapabilities, ServerConfig,
    SubscribeRequestParams, SubscriptionFilter, UnsubscribeRequestParams,
};
use rmcp::service::{RequestContext, SubscriptionContext};
use rmcp::{tool_handler, RoleServer, ServerHandler};

pub use sandboxes::{
    Killed, SandboxArgs, SandboxCreateArgs, SandboxList, SandboxSummary, DEFAULT_SANDBOX_TIMEOUT_SECS,
};
pub use tools::{
    CommandResult, FileContent, FileReadArgs, FileWriteArgs, FileWritten, RunCommandArgs,
    DEFAULT_COMMAND_TIMEOUT_SECS, MAX_FILE_READ, MAX_OUTPUT,
};

/// What the server tells a model about itself when a client connects.
const INSTRUCTIONS: &str = "paddock runs each sandbox as a disposable Linux machine. Create one \
with sandbox_create (it ends by itself after timeout_secs), run commands in it with run_command, \
read, write, list and edit its files with file_read, file_write, file_list and file_edit (and \
file_stat, file_mkdir, file_move, file_remove; file_download_url and file_upload_url move files \
to and from URLs its network allows), run servers and other long-running commands in the \
background with process_start (then process_read, process_write, process_signal, process_list), \
see a sandbox's state and limits with sandbox_info, save its files with checkpoint and return to \
them with rollback (commit keeps a step and drops its checkpoint; snapshot_create, snapshot_list \
and snapshot_delete keep named states; sandbox_fork copies a sandbox to try alternatives), run \
notebook-style cells with run_code, read or change its egress policy with network_get and \
network_set, get the URL of a server it runs with port_url, and remove it with sandbox_kill when \
the task is done. Its files are also resources (paddock://sandbox/{id}/file/{path}) you can \
subscribe to, and the prompt sandbox_rules explains the rules. Nothing you do in a sandbox \
reaches the host or other sandboxes; its network is what the sandbox's policy allows.";

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
    /// The file watches of this session (see `resources.rs`).
    subscriptions: resources::Subscriptions,
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
            subscriptions: resources::Subscriptions::default(),
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
            subscriptions: resources::Subscriptions::default(),
            tool_router: Self::all_tools(),
        }
    }

    /// Every tool, from each module's router.
    fn all_tools() -> ToolRouter<Self> {
        Self::tool_router()
            + Self::sandboxes_router()
            + Self::steps_router()
            + Self::snapshots_router()
            + Self::network_router()
            + Self::code_router()
            + Self::ports_router()
            + Self::files_router()
            + Self::processes_router()
            + Self::transfer_router()
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

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            resources::template(),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let p = self
            .principal(&context)
            .map_err(|e| ErrorData::invalid_request(e, None))?;
        Ok(self.read_file_resource(&p, &request.uri).await?.into())
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let p = self
            .principal(&context)
            .map_err(|e| ErrorData::invalid_request(e, None))?;
        self.subscribe_file(&p, &request.uri, context.peer.clone()).await
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.subscriptions.remove(&request.uri);
        Ok(())
    }

    fn accepted_subscription_filter(&self, requested: &SubscriptionFilter) -> Option<SubscriptionFilter> {
        let uris: Vec<String> = requested
            .resource_subscriptions
            .iter()
            .flatten()
            .filter(|uri| resources::parse_file_uri(uri).is_ok())
            .take(resources::MAX_SUBSCRIPTIONS)
            .cloned()
            .collect();
        let mut accepted = SubscriptionFilter::new();
        accepted.resource_subscriptions = Some(uris);
        Some(accepted)
    }

    /// `subscriptions/listen` (2026-07-28): a watch per accepted file, for as long as the
    /// subscription lasts. rmcp acknowledges the subscription before this runs, so a change made
    /// between the acknowledgement and the watch would go unheard: once every watch is in place,
    /// each file gets one `resources/updated` ("read it now"), after which every change is heard.
    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let p = self
            .principal(context.request_context())
            .map_err(|e| ErrorData::invalid_request(e, None))?;
        let uris = context
            .accepted()
            .resource_subscriptions
            .clone()
            .unwrap_or_default();
        let mut watches = Vec::new();
        for uri in &uris {
            let sink = context.sink().clone();
            let watch = self
                .watch_file(&p, uri, move |uri| {
                    let sink = sink.clone();
                    async move { sink.notify_resource_updated(uri).await.is_ok() }
                })
                .await;
            match watch {
                Ok(task) => watches.push(task),
                Err(e) => {
                    watches.iter().for_each(tokio::task::JoinHandle::abort);
                    return Err(e);
                }
            }
        }
        for uri in uris {
            if context.sink().notify_resource_updated(uri).await.is_err() {
                break;
            }
        }
        context.cancelled().await;
        watches.iter().for_each(tokio::task::JoinHandle::abort);
        Ok(())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(vec![prompt::rules_prompt()]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        if request.name != prompt::RULES_PROMPT {
            return Err(ErrorData::invalid_params(
                format!("no prompt named {:?}", request.name),
                None,
            ));
        }
        let p = self
            .principal(&context)
            .map_err(|e| ErrorData::invalid_request(e, None))?;
        let sandbox = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("sandbox_id"))
            .and_then(serde_json::Value::as_str);
        Ok(self.rules(&p, sandbox).await?.into())
    }

    fn get_info(&self) -> ServerConfig {
        let capabilities = ServerCapabilities::builder()
            .enable_prompts()
            .enable_resources()
            .enable_resources_subscribe()
            .enable_tools()
            .build();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new("paddock", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}
