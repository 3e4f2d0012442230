//! The helpers every tool module shares (failures as tool errors, ids, capped reads and writes),
//! and the core tools beside the sandboxes' own (`sandboxes.rs`): running a command, reading and
//! writing a file. Arguments and results carry JSON schemas and descriptions written for a model
//! to choose well.
//!
//! What it does not do: keep any state of its own (a sandbox is named by its id in every call, as
//! MCP's stateless protocol generation asks), or bound what the service bounds already (request
//! sizes, quotas, limits); it bounds only what it hands to the client (command output, file
//! contents), and says when it cut.

use bytes::Bytes;
use futures_util::StreamExt as _;
use paddock_control::{ExecOutput, OutputStream, Principal, ServiceError, WriteFileOptions};
use paddock_types::api::ExecRequest;
use paddock_types::SandboxId;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::files::count_lines;
use crate::progress::Progress;
use crate::PaddockMcp;

/// A command's, cell's or transfer's time limit when the call names none.
pub const DEFAULT_COMMAND_TIMEOUT_SECS: u64 = 60;
/// The longest time limit those tools accept.
const MAX_COMMAND_TIMEOUT_SECS: u64 = 3600;
/// Bytes of each output stream `run_command` returns (the command runs to its end either way).
pub const MAX_OUTPUT: usize = 256 * 1024;
/// Bytes of a file `file_read` returns.
pub const MAX_FILE_READ: usize = 1024 * 1024;

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
    /// When a previous call failed with approval_pending: the approval id it named, once a person
    /// approved it; send the same command again with it.
    #[serde(default)]
    pub approval_id: Option<String>,
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
    /// Of a text file, the first line to return (1-based; default 1). With `start_line` or
    /// `end_line`, only those lines are returned.
    #[serde(default)]
    pub start_line: Option<u64>,
    /// Of a text file, the last line to return (inclusive; default the last).
    #[serde(default)]
    pub end_line: Option<u64>,
}

/// `file_read`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct FileContent {
    /// The file's bytes (or the lines asked for): as text when they are UTF-8, else base64.
    pub content: String,
    /// `utf-8` or `base64`.
    pub encoding: String,
    /// The file's size in bytes, when known.
    pub size: Option<u64>,
    /// Whether there is more than returned (1 MiB at most): of the file, or of the lines asked
    /// for (read on from `end_line + 1`).
    pub truncated: bool,
    /// The first line returned, when lines were asked for.
    pub start_line: Option<u64>,
    /// The last line returned, when lines were asked for (`start_line - 1`: the file ends before).
    pub end_line: Option<u64>,
    /// The file's number of lines, when it is text and was read to its end.
    pub total_lines: Option<u64>,
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

/// A service error as a tool failure: the stable code, then the message. An error about an
/// approval (`approval_pending`, ...) names its id, which the model needs to send the call again
/// once a person approved it.
pub(crate) fn failure(e: ServiceError) -> String {
    let mut text = match &e.field {
        Some(field) => format!("{}: {field}: {}", e.code.as_str(), e.message),
        None => format!("{}: {}", e.code.as_str(), e.message),
    };
    if let Some(id) = e.approval_id.as_deref().filter(|id| !e.message.contains(id)) {
        text.push_str(&format!(" (approval_id {id})"));
    }
    text
}

/// A call's `timeout_secs`: [`DEFAULT_COMMAND_TIMEOUT_SECS`] when absent, refused outside 1 to
/// [`MAX_COMMAND_TIMEOUT_SECS`].
pub(crate) fn time_limit(secs: Option<u64>) -> Result<u64, String> {
    let secs = secs.unwrap_or(DEFAULT_COMMAND_TIMEOUT_SECS);
    if secs == 0 || secs > MAX_COMMAND_TIMEOUT_SECS {
        return Err(format!(
            "invalid_request: timeout_secs: between 1 and {MAX_COMMAND_TIMEOUT_SECS}"
        ));
    }
    Ok(secs)
}

pub(crate) fn sandbox_id(text: &str) -> Result<SandboxId, String> {
    text.parse::<SandboxId>()
        .map_err(|e| format!("invalid_request: sandbox_id: {e}"))
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
    /// Runs `request` in the foreground and collects its result (each stream capped at
    /// [`MAX_OUTPUT`]), reporting progress to the client that asked for it; dropping the future
    /// (a cancelled call) kills the process tree.
    pub(crate) async fn run_collected(
        &self,
        ctx: &RequestContext<RoleServer>,
        p: &Principal,
        id: &SandboxId,
        request: ExecRequest,
        timeout: u64,
    ) -> Result<CommandResult, String> {
        let mut stream = self.service.exec(p, id, request).await.map_err(failure)?;
        let mut progress = Progress::new(ctx, timeout);
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let mut truncated = false;
        loop {
            let event = tokio::select! {
                event = stream.recv() => event,
                () = progress.tick() => {
                    progress.report(&stdout, &stderr).await;
                    continue;
                }
            };
            let Some(event) = event else { break };
            match event {
                ExecOutput::Started { .. } => {}
                ExecOutput::Output { stream, data, .. } => {
                    let buf = match stream {
                        OutputStream::Stderr => &mut stderr,
                        OutputStream::Stdout | OutputStream::Pty => &mut stdout,
                    };
                    truncated |= append_capped(buf, &data);
                    if progress.output() {
                        progress.report(&stdout, &stderr).await;
                    }
                }
                ExecOutput::Exit(exit) => {
                    return Ok(CommandResult {
                        exit_code: exit.exit_code,
                        stdout: String::from_utf8_lossy(&stdout).into_owned(),
                        stderr: String::from_utf8_lossy(&stderr).into_owned(),
                        truncated,
                        timed_out: exit.timed_out,
                        duration_ms: exit.duration_ms,
                    })
                }
                ExecOutput::Error { code, message } => return Err(format!("{}: {message}", code.as_str())),
            }
        }
        Err("sandbox_not_running: the command's output ended before its exit".to_owned())
    }

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
            approval_id: None,
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
pub(crate) fn append_capped(buf: &mut Vec<u8>, data: &[u8]) -> bool {
    let room = MAX_OUTPUT.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
    data.len() > room
}

/// The length of `bytes` without a UTF-8 character cut short at its end (by a size cap, or by a
/// writer still writing), so text handed out in pieces never splits one.
pub(crate) fn complete_utf8_len(bytes: &[u8]) -> usize {
    // The last character starts at most 3 bytes from the end.
    for back in 1..=bytes.len().min(4) {
        let at = bytes.len() - back;
        let width = match bytes[at] {
            0x00..=0x7f => 1,
            0x80..=0xbf => continue,
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            // Never in UTF-8: complete as it is (it will be replaced).
            _ => 1,
        };
        return if width > back { at } else { bytes.len() };
    }
    bytes.len()
}

/// The longest start of `text` of at most `max` bytes that ends between characters.
pub(crate) fn head(text: &str, max: usize) -> &str {
    let mut end = max.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The longest end of `text` of at most `max` bytes that starts between characters.
pub(crate) fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// A file's first bytes as a client gets them: text when they are UTF-8, else base64.
pub(crate) enum Decoded {
    /// UTF-8 text (when the read was cut inside a character, without that character's start).
    Text(String),
    /// Standard base64 of the bytes.
    Base64(String),
}

/// Decodes the first bytes of a file, `truncated` when they are not all of it (a cut that fell
/// inside a character leaves the text text).
pub(crate) fn decode(mut bytes: Vec<u8>, truncated: bool) -> Decoded {
    let text_len = if truncated {
        complete_utf8_len(&bytes)
    } else {
        bytes.len()
    };
    if std::str::from_utf8(&bytes[..text_len]).is_err() {
        use base64::Engine as _;
        return Decoded::Base64(base64::engine::general_purpose::STANDARD.encode(&bytes));
    }
    bytes.truncate(text_len);
    Decoded::Text(String::from_utf8_lossy(&bytes).into_owned())
}

#[tool_router(vis = "pub(crate)")]
impl PaddockMcp {
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
        let timeout = time_limit(args.timeout_secs)?;
        let request = ExecRequest {
            shell: Some(args.command),
            cwd: args.cwd,
            timeout_ms: Some(timeout * 1000),
            approval_id: args.approval_id,
            ..ExecRequest::default()
        };
        self.run_collected(&ctx, &p, &id, request, timeout)
            .await
            .map(Json)
    }

    #[tool(
        name = "file_read",
        description = "Read a file of a sandbox (at most 1 MiB returned): text when it is UTF-8, else base64. For a long text file, give start_line/end_line to read only those lines; total_lines says how many it has.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn file_read(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<FileReadArgs>,
    ) -> Result<Json<FileContent>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        if args.start_line.is_some() || args.end_line.is_some() {
            let lines = self
                .read_lines(&p, &id, &args.path, args.start_line, args.end_line)
                .await?;
            return Ok(Json(lines));
        }
        let (bytes, size, truncated) = self.read_capped(&p, &id, &args.path).await?;
        let (content, encoding, total_lines) = match decode(bytes, truncated) {
            Decoded::Text(text) => {
                let total = (!truncated).then(|| count_lines(text.as_bytes()));
                (text, "utf-8", total)
            }
            Decoded::Base64(encoded) => (encoded, "base64", None),
        };
        Ok(Json(FileContent {
            content,
            encoding: encoding.to_owned(),
            size,
            truncated,
            start_line: None,
            end_line: None,
            total_lines,
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

#[cfg(test)]
mod tests {
    use paddock_control::ServiceError;
    use paddock_types::api::ErrorCode;

    use super::{decode, failure, head, tail, Decoded};

    #[test]
    fn an_approval_failure_names_its_approval_once() {
        let named = ServiceError::approval(
            ErrorCode::ApprovalPending,
            "apr_1",
            "approval apr_1 is pending and nothing has run",
        );
        assert_eq!(
            failure(named),
            "approval_pending: approval apr_1 is pending and nothing has run"
        );
        let unnamed = ServiceError::approval(ErrorCode::ApprovalPending, "apr_2", "held");
        assert_eq!(failure(unnamed), "approval_pending: held (approval_id apr_2)");
        let plain = ServiceError::invalid("timeout_ms", "too long");
        assert_eq!(failure(plain), "invalid_request: timeout_ms: too long");
    }

    #[test]
    fn heads_and_tails_cut_between_characters() {
        assert_eq!(
            (head("héllo", 2), head("héllo", 3), head("ab", 9)),
            ("h", "hé", "ab")
        );
        assert_eq!((tail("hé", 1), tail("éa", 2), tail("ab", 9)), ("", "a", "ab"));
    }

    #[test]
    fn a_capped_read_is_text_even_cut_inside_a_character_else_base64() {
        let cut = "aé".as_bytes()[..2].to_vec();
        assert!(matches!(decode(cut.clone(), true), Decoded::Text(t) if t == "a"));
        assert!(matches!(decode(cut, false), Decoded::Base64(b) if b == "YcM="));
        assert!(matches!(decode(vec![0xff, b'a'], true), Decoded::Base64(_)));
    }
}
