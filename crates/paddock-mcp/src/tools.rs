//! The tools: their arguments and results (with JSON schemas, descriptions written for a model to
//! choose well), and their translation onto the service.
//!
//! What it does not do: keep any state of its own (a sandbox is named by its id in every call, as
//! MCP's stateless protocol generation asks), or bound what the service bounds already (request
//! sizes, quotas, limits); it bounds only what it hands to the client (command output, file
//! contents), and says when it cut.

use std::collections::BTreeMap;

use bytes::Bytes;
use futures_util::StreamExt as _;
use paddock_control::{ExecOutput, OutputStream, Principal, ServiceError, WriteFileOptions};
use paddock_types::api::{CreateSandboxRequest, ExecRequest, ListSandboxesQuery, SandboxInfo};
use paddock_types::SandboxId;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::PaddockMcp;

/// A sandbox's lifetime when `sandbox_create` names none: it ends by itself after this.
pub const DEFAULT_SANDBOX_TIMEOUT_SECS: u64 = 600;
/// A command's time limit when `run_command` names none.
pub const DEFAULT_COMMAND_TIMEOUT_SECS: u64 = 60;
/// The longest time limit `run_command` accepts.
const MAX_COMMAND_TIMEOUT_SECS: u64 = 3600;
/// Bytes of each output stream `run_command` returns (the command runs to its end either way).
pub const MAX_OUTPUT: usize = 256 * 1024;
/// Bytes of a file `file_read` returns.
pub const MAX_FILE_READ: usize = 1024 * 1024;

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

/// `run_command`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// A shell command line (run by `/bin/sh -c`).
    pub command: String,
    /// Working directory (default: the sandbox's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Seconds before the command is killed (default 60, at most 3600).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// `run_command`'s result. A non-zero `exit_code` is the command's answer, not a tool failure.
#[derive(Debug, Serialize, JsonSchema)]
pub struct CommandResult {
    /// The exit code (128+N when signal N killed it).
    pub exit_code: i32,
    /// Standard output (UTF-8, invalid bytes replaced), at most 256 KiB.
    pub stdout: String,
    /// Standard error, likewise.
    pub stderr: String,
    /// Whether output beyond 256 KiB per stream was left out.
    pub truncated: bool,
    /// Whether the time limit killed it.
    pub timed_out: bool,
    /// Its run time in milliseconds.
    pub duration_ms: u64,
}

/// `file_read`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileReadArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path inside the sandbox.
    pub path: String,
}

/// `file_read`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileContent {
    /// The file's bytes: as text when they are UTF-8, else base64.
    pub content: String,
    /// `utf-8` or `base64`.
    pub encoding: String,
    /// The file's size in bytes, when known.
    pub size: Option<u64>,
    /// Whether the file is longer than the 1 MiB returned.
    pub truncated: bool,
}

/// `file_write`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileWriteArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// Absolute path inside the sandbox; missing parent directories are made.
    pub path: String,
    /// The new contents (replacing the file's).
    pub content: String,
}

/// `file_write`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileWritten {
    /// The path written.
    pub path: String,
    /// Bytes written.
    pub bytes: u64,
}

/// A service error as a tool failure: the stable code, then the message.
pub(crate) fn failure(e: ServiceError) -> String {
    format!("{}: {}", e.code.as_str(), e.message)
}

pub(crate) fn sandbox_id(text: &str) -> Result<SandboxId, String> {
    text.parse::<SandboxId>()
        .map_err(|e| format!("invalid_request: sandbox_id: {e}"))
}

pub(crate) fn summary(info: SandboxInfo) -> SandboxSummary {
    SandboxSummary {
        sandbox_id: info.id,
        template: info.template,
        state: wire_name(info.state),
        expires_at: info.expires_at,
    }
}

/// A unit enum's name as the API spells it (`running`, `file`).
pub(crate) fn wire_name(value: impl Serialize) -> String {
    // A unit enum: serializing it cannot fail.
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

impl PaddockMcp {
    /// The first [`MAX_FILE_READ`] bytes of a sandbox's file, its size when known, and whether it
    /// holds more (the rest is not read).
    pub(crate) async fn read_capped(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
    ) -> Result<(Vec<u8>, Option<u64>, bool), String> {
        let mut download = self.service.read_file(p, id, path).await.map_err(failure)?;
        let mut bytes = Vec::new();
        while let Some(chunk) = download.stream.next().await {
            let chunk = chunk.map_err(|e| format!("io: reading {path}: {e}"))?;
            let room = MAX_FILE_READ - bytes.len();
            if chunk.len() > room {
                bytes.extend_from_slice(&chunk[..room]);
                return Ok((bytes, download.size, true));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok((bytes, download.size, false))
    }

    /// Replaces a sandbox's file with `bytes` (making missing parents when asked); the bytes
    /// written.
    pub(crate) async fn write_bytes(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
        bytes: Vec<u8>,
        parents: bool,
    ) -> Result<u64, String> {
        let body = Bytes::from(bytes);
        let stream = futures_util::stream::once(async move { Ok::<_, std::io::Error>(body) });
        let options = WriteFileOptions {
            mode: None,
            user: None,
            parents,
        };
        let written = self
            .service
            .write_file(p, id, path, options, Box::pin(stream))
            .await
            .map_err(failure)?;
        Ok(written.bytes)
    }
}

/// Appends what fits of `data` under [`MAX_OUTPUT`]; true when some did not.
fn append_capped(buf: &mut Vec<u8>, data: &[u8]) -> bool {
    let room = MAX_OUTPUT.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
    data.len() > room
}

#[tool_router(vis = "pub(crate)")]
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
        let request = CreateSandboxRequest {
            template: args.template,
            timeout_secs: Some(args.timeout_secs.unwrap_or(DEFAULT_SANDBOX_TIMEOUT_SECS)),
            env: args.env,
            ..CreateSandboxRequest::default()
        };
        let info = self.service.create_sandbox(&p, request).await.map_err(failure)?;
        Ok(Json(summary(info)))
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

    #[tool(
        name = "run_command",
        description = "Run a shell command in a sandbox and wait for it to end. Returns its exit code, stdout and stderr (each at most 256 KiB; truncated says when more was written). A non-zero exit code is a normal result.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn run_command(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<RunCommandArgs>,
    ) -> Result<Json<CommandResult>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let timeout = args.timeout_secs.unwrap_or(DEFAULT_COMMAND_TIMEOUT_SECS);
        if timeout == 0 || timeout > MAX_COMMAND_TIMEOUT_SECS {
            return Err(format!(
                "invalid_request: timeout_secs: between 1 and {MAX_COMMAND_TIMEOUT_SECS}"
            ));
        }
        let request = ExecRequest {
            shell: Some(args.command),
            cwd: args.cwd,
            timeout_ms: Some(timeout * 1000),
            ..ExecRequest::default()
        };
        let mut stream = self.service.exec(&p, &id, request).await.map_err(failure)?;
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut truncated = false;
        while let Some(event) = stream.recv().await {
            match event {
                ExecOutput::Started { .. } => {}
                ExecOutput::Output { stream, data, .. } => {
                    let buf = match stream {
                        OutputStream::Stderr => &mut stderr,
                        OutputStream::Stdout | OutputStream::Pty => &mut stdout,
                    };
                    truncated |= append_capped(buf, &data);
                }
                ExecOutput::Exit(exit) => {
                    return Ok(Json(CommandResult {
                        exit_code: exit.exit_code,
                        stdout: String::from_utf8_lossy(&stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&stderr).into_owned(),
                        truncated,
                        timed_out: exit.timed_out,
                        duration_ms: exit.duration_ms,
                    }))
                }
                ExecOutput::Error { code, message } => return Err(format!("{}: {message}", code.as_str())),
            }
        }
        Err("sandbox_not_running: the command's output ended before its exit".to_owned())
    }

    #[tool(
        name = "file_read",
        description = "Read a file of a sandbox (at most 1 MiB): text when it is UTF-8, else base64.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn file_read(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<FileReadArgs>,
    ) -> Result<Json<FileContent>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let (bytes, size, truncated) = self.read_capped(&p, &id, &args.path).await?;
        let (content, encoding) = match String::from_utf8(bytes) {
            Ok(text) => (text, "utf-8"),
            Err(e) => {
                use base64::Engine as _;
                let raw = e.into_bytes();
                (base64::engine::general_purpose::STANDARD.encode(raw), "base64")
            }
        };
        Ok(Json(FileContent {
            content,
            encoding: encoding.to_owned(),
            size,
            truncated,
        }))
    }

    #[tool(
        name = "file_write",
        description = "Write a text file in a sandbox, replacing its contents; missing parent directories are made.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn file_write(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<FileWriteArgs>,
    ) -> Result<Json<FileWritten>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let bytes = self
            .write_bytes(&p, &id, &args.path, args.content.into_bytes(), true)
            .await?;
        Ok(Json(FileWritten {
            path: args.path,
            bytes,
        }))
    }
}
