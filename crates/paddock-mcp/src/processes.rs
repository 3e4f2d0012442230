//! Long-running processes: start one in the background (a server, a watcher, a long build), read
//! its output from offsets as it goes, write to its stdin, signal it, and list a sandbox's
//! processes. Each a thin translation onto the service, as in `tools.rs`.
//!
//! What it does not do: wait for output (`process_read` returns what the sandbox holds now; call
//! it again from the offsets it returns), keep more than the sandbox does (the last 1 MiB of each
//! stream; `skipped_bytes` counts what was lost before a read), or run under a terminal.

use std::collections::BTreeMap;

use bytes::Bytes;
use paddock_control::{ExecOutput, OutputStream};
use paddock_types::api::{AttachQuery, ExecRequest, KillRequest, ProcessCommand, SignalRequest};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sandboxes::SandboxArgs;
use crate::tools::{append_capped, complete_utf8_len, failure, head, sandbox_id};
use crate::PaddockMcp;

/// The most processes `process_list` returns (the newest).
pub const MAX_LISTED_PROCESSES: usize = 256;
/// Bytes of a command `process_list` shows.
const MAX_LISTED_COMMAND: usize = 256;

/// `process_start`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessStartArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// A shell command line (run by `/bin/sh -c`).
    pub command: String,
    /// Working directory (default: the sandbox's).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Environment variables added to the sandbox's for this process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Keep its stdin open, to write to it with `process_write` (default false: it reads nothing).
    #[serde(default)]
    pub stdin_open: bool,
    /// Seconds before it is killed (default: none; it runs until it ends, is signalled, or the
    /// sandbox ends).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// When a previous call failed with approval_pending: the approval id it named, once a person
    /// approved it; send the same command again with it.
    #[serde(default)]
    pub approval_id: Option<String>,
}

/// `process_start`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProcessStarted {
    /// Its pid: pass it to `process_read`, `process_write` and `process_signal`.
    pub pid: u32,
}

/// `process_read`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessReadArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// The process (from `process_start` or `process_list`).
    pub pid: u32,
    /// The first byte of stdout to return (default 0): the `next_stdout_from` of the previous read.
    #[serde(default)]
    pub stdout_from: u64,
    /// The first byte of stderr to return (default 0): the `next_stderr_from` of the previous read.
    #[serde(default)]
    pub stderr_from: u64,
}

/// `process_read`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProcessOutput {
    /// Standard output from `stdout_from` on, as far as written now (UTF-8, invalid bytes
    /// replaced), at most 256 KiB.
    pub stdout: String,
    /// Standard error from `stderr_from` on, likewise.
    pub stderr: String,
    /// Pass as `stdout_from` to read on.
    pub next_stdout_from: u64,
    /// Pass as `stderr_from` to read on.
    pub next_stderr_from: u64,
    /// Whether more output is waiting beyond the 256 KiB returned per stream: read on at once.
    pub truncated: bool,
    /// Bytes between the offsets given and the oldest the sandbox still keeps (the last 1 MiB
    /// of each stream): lost.
    pub skipped_bytes: u64,
    /// False once the process has ended (then `exit_code` is set).
    pub running: bool,
    /// Its exit code once it has ended (128+N when signal N killed it).
    pub exit_code: Option<i32>,
    /// Whether its time limit killed it.
    pub timed_out: bool,
}

/// `process_write`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessWriteArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// The process (started with `stdin_open`).
    pub pid: u32,
    /// Text to write to its stdin (add `\n` to end a line).
    pub data: String,
    /// Close its stdin afterwards (end of input), default false.
    #[serde(default)]
    pub close: bool,
}

/// `process_write`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct StdinWritten {
    /// The process.
    pub pid: u32,
    /// Bytes written.
    pub bytes: u64,
    /// Whether its stdin is now closed.
    pub closed: bool,
}

/// `process_signal`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessSignalArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// The process.
    pub pid: u32,
    /// The signal: `TERM` (ask it to end), `INT` (as Ctrl-C), `KILL` (end it at once), `HUP`,
    /// `USR1`, ... or a number.
    pub signal: String,
    /// Send it to the process and everything it started (a shell's children), not the process
    /// alone (default false).
    #[serde(default)]
    pub tree: bool,
}

/// `process_signal`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Signalled {
    /// The process.
    pub pid: u32,
    /// The signal sent.
    pub signal: String,
}

/// One process of `process_list`.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ListedProcess {
    /// Its pid.
    pub pid: u32,
    /// What it runs (at most 256 bytes, `…` marking a cut).
    pub command: String,
    /// Its tag, when it has one.
    pub tag: Option<String>,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// Whether it is still running.
    pub running: bool,
    /// Its exit code once it has ended.
    pub exit_code: Option<i32>,
}

/// `process_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct ProcessListing {
    /// The processes started in the sandbox through paddock (by any tool), running and recently
    /// ended, oldest first: at most the newest 256.
    pub processes: Vec<ListedProcess>,
    /// Whether older ones were left out.
    pub truncated: bool,
}

/// One stream's output of a read, from the offset asked for.
#[derive(Debug)]
struct StreamRead {
    from: u64,
    /// The offset of the first byte received.
    start: Option<u64>,
    bytes: Vec<u8>,
    cut: bool,
}

impl StreamRead {
    fn new(from: u64) -> Self {
        Self {
            from,
            start: None,
            bytes: Vec::new(),
            cut: false,
        }
    }

    fn push(&mut self, offset: u64, data: &[u8]) {
        self.start.get_or_insert(offset);
        self.cut |= append_capped(&mut self.bytes, data);
    }

    /// The text, the offset after it, and the bytes skipped before it. While more may follow, a
    /// character cut short at the end waits for the next read.
    fn finish(mut self, ended: bool) -> (String, u64, u64) {
        if self.cut || !ended {
            self.bytes.truncate(complete_utf8_len(&self.bytes));
        }
        let start = self.start.unwrap_or(self.from);
        let next = start + self.bytes.len() as u64;
        (
            String::from_utf8_lossy(&self.bytes).into_owned(),
            next,
            start.saturating_sub(self.from),
        )
    }
}

/// A process's command as one line, cut to [`MAX_LISTED_COMMAND`] bytes.
fn command_text(command: ProcessCommand) -> String {
    let mut text = match command {
        ProcessCommand::Shell { script } => script,
        ProcessCommand::Argv { argv } => argv.join(" "),
    };
    if text.len() > MAX_LISTED_COMMAND {
        let at = head(&text, MAX_LISTED_COMMAND).len();
        text.truncate(at);
        text.push('…');
    }
    text
}

#[tool_router(router = processes_router, vis = "pub(crate)")]
impl PaddockMcp {
    #[tool(
        name = "process_start",
        description = "Start a shell command in the background in a sandbox (a server, a watcher, a long build) and return its pid at once. Read its output with process_read, write to its stdin with process_write (start it with stdin_open), stop it with process_signal. For a command you want to wait for, use run_command.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn process_start(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ProcessStartArgs>,
    ) -> Result<Json<ProcessStarted>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let timeout_ms = match args.timeout_secs {
            Some(0) => return Err("invalid_request: timeout_secs: at least 1".to_owned()),
            Some(secs) => Some(secs.saturating_mul(1000)),
            None => None,
        };
        let request = ExecRequest {
            shell: Some(args.command),
            cwd: args.cwd,
            env: args.env,
            stdin_open: args.stdin_open,
            timeout_ms,
            background: true,
            approval_id: args.approval_id,
            ..ExecRequest::default()
        };
        let started = self.service.exec(&p, &id, request).await.map_err(failure)?;
        Ok(Json(ProcessStarted { pid: started.pid() }))
    }

    #[tool(
        name = "process_read",
        description = "Read a background process's output written since the offsets given (0 for the start), without waiting: returns stdout and stderr (each at most 256 KiB), the offsets to pass next time, whether it is still running and its exit code once ended. Call again to follow it.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn process_read(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ProcessReadArgs>,
    ) -> Result<Json<ProcessOutput>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let query = AttachQuery {
            stdout_from: args.stdout_from,
            stderr_from: args.stderr_from,
            follow: Some(false),
        };
        let mut stream = self
            .service
            .attach_process(&p, &id, args.pid, query)
            .await
            .map_err(failure)?;
        let mut stdout = StreamRead::new(args.stdout_from);
        let mut stderr = StreamRead::new(args.stderr_from);
        let mut exit = None;
        // The replay is bounded (what the sandbox keeps); past the cap it is only drained, to see
        // an exit behind it.
        while let Some(event) = stream.recv().await {
            match event {
                ExecOutput::Started { .. } => {}
                ExecOutput::Output {
                    stream: OutputStream::Stderr,
                    offset,
                    data,
                } => stderr.push(offset, &data),
                ExecOutput::Output { offset, data, .. } => stdout.push(offset, &data),
                ExecOutput::Exit(info) => exit = Some(info),
                ExecOutput::Error { code, message } => return Err(format!("{}: {message}", code.as_str())),
            }
        }
        let truncated = stdout.cut || stderr.cut;
        let (stdout, next_stdout_from, skipped_out) = stdout.finish(exit.is_some());
        let (stderr, next_stderr_from, skipped_err) = stderr.finish(exit.is_some());
        Ok(Json(ProcessOutput {
            stdout,
            stderr,
            next_stdout_from,
            next_stderr_from,
            truncated,
            skipped_bytes: skipped_out + skipped_err,
            running: exit.is_none(),
            exit_code: exit.as_ref().map(|e| e.exit_code),
            timed_out: exit.is_some_and(|e| e.timed_out),
        }))
    }

    #[tool(
        name = "process_write",
        description = "Write text to the stdin of a background process started with stdin_open; close ends its input.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn process_write(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ProcessWriteArgs>,
    ) -> Result<Json<StdinWritten>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let data = Bytes::from(args.data.into_bytes());
        let bytes = data.len() as u64;
        self.service
            .write_stdin(&p, &id, args.pid, data, args.close)
            .await
            .map_err(failure)?;
        Ok(Json(StdinWritten {
            pid: args.pid,
            bytes,
            closed: args.close,
        }))
    }

    #[tool(
        name = "process_signal",
        description = "Send a signal to a process of a sandbox: TERM to ask it to end, INT as Ctrl-C, KILL to end it at once. process_read then shows its exit.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn process_signal(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<ProcessSignalArgs>,
    ) -> Result<Json<Signalled>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let signal = serde_json::Value::String(args.signal.clone());
        if args.tree {
            let request = KillRequest { signal: Some(signal) };
            self.service.kill_process(&p, &id, args.pid, request).await
        } else {
            let request = SignalRequest { signal };
            self.service.signal_process(&p, &id, args.pid, request).await
        }
        .map_err(failure)?;
        Ok(Json(Signalled {
            pid: args.pid,
            signal: args.signal,
        }))
    }

    #[tool(
        name = "process_list",
        description = "List a sandbox's processes started through paddock, running and recently ended: pid, command, whether running, exit code.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn process_list(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<Json<ProcessListing>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let list = self.service.list_processes(&p, &id).await.map_err(failure)?;
        let skip = list.processes.len().saturating_sub(MAX_LISTED_PROCESSES);
        let processes = list
            .processes
            .into_iter()
            .skip(skip)
            .map(|proc| ListedProcess {
                pid: proc.pid,
                command: command_text(proc.command),
                tag: proc.tag,
                started_at: proc.started_at,
                running: proc.running,
                exit_code: proc.exit.map(|e| e.exit_code),
            })
            .collect();
        Ok(Json(ProcessListing {
            processes,
            truncated: skip > 0,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{command_text, StreamRead, MAX_LISTED_COMMAND};
    use crate::tools::MAX_OUTPUT;
    use paddock_types::api::ProcessCommand;

    #[test]
    fn a_read_stops_at_the_cap_and_before_a_cut_character() {
        let mut read = StreamRead::new(10);
        read.push(10, &[b'x'; MAX_OUTPUT - 1]);
        read.push((MAX_OUTPUT + 9) as u64, "é!".as_bytes());
        let (text, next, skipped) = read.finish(true);
        assert_eq!(
            (text.len(), next, skipped),
            (MAX_OUTPUT - 1, (MAX_OUTPUT + 9) as u64, 0)
        );
        // Still running: a character not whole yet waits; ended, it is what it is.
        let mut read = StreamRead::new(0);
        read.push(5, &"é".as_bytes()[..1]);
        assert_eq!(read.finish(false), (String::new(), 5, 5));
        let mut read = StreamRead::new(0);
        read.push(0, &"é".as_bytes()[..1]);
        assert_eq!(read.finish(true), ("\u{fffd}".to_owned(), 1, 0));
        assert_eq!(StreamRead::new(7).finish(false), (String::new(), 7, 0));
    }

    #[test]
    fn a_long_command_is_cut_between_characters() {
        let argv = ProcessCommand::Argv {
            argv: vec!["echo".into(), "hi".into()],
        };
        assert_eq!(command_text(argv), "echo hi");
        let script = "é".repeat(MAX_LISTED_COMMAND);
        let cut = command_text(ProcessCommand::Shell { script });
        assert_eq!(cut, format!("{}…", "é".repeat(MAX_LISTED_COMMAND / 2)));
    }
}
