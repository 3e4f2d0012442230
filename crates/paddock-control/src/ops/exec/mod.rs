//! Processes: exec, re-attach, stdin, signals, PTY size.
//!
//! Every process started through the API is followed by a monitor task on the sandbox's shared
//! agent connection: it forwards events to the API caller (foreground), counts bytes, and writes the
//! `process.exit` audit row whether or not anybody is still listening. A foreground caller that goes
//! away (its stream dropped) gets its process tree killed.
//!
//! The `process.start` row is committed before the agent is asked to spawn (crash point
//! `exec.spawned` right after), so no process runs without it; its `exec_id` ties it to the exit
//! row. After a restart, `exec_restart.rs` follows or records the exits of the processes the previous
//! server started.

pub(crate) mod signals;

use std::time::Instant;

use bytes::Bytes;
use paddock_protocol::{CommandSpec, PtySize, SpawnRequest};
use paddock_runtime::agent_client::{AgentClient, ProcessEvent, ProcessEvents};
use paddock_types::api::{
    AttachQuery, ExecRequest, KillRequest, ProcessCommand, ProcessInfo, ProcessList, PtySizeBody,
    SignalRequest,
};
use tokio::sync::mpsc;

use paddock_policy::{Action, ExecAction};
use paddock_types::api::ApprovalKind;

use crate::core::approvals::{Asked, Gated};
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::error::process_error;
use crate::core::output::events::{exit_info, ExecOutput};
use crate::core::time::rfc3339;
use crate::lifecycle::processes::{command_audit, Followed};
use crate::ops::exec::signals::parse_signal;
use crate::{ExecStream, Principal, SandboxService, ServiceError};
use paddock_types::SandboxId;

/// Events buffered between a process's monitor and its API stream.
const STREAM_QUEUE: usize = 64;
const MAX_ARGV: usize = 4096;
const MAX_TAG_LEN: usize = 256;

fn pty_size(size: PtySizeBody) -> Result<PtySize, ServiceError> {
    if size.rows == 0 || size.cols == 0 {
        return Err(ServiceError::invalid("pty", "rows and cols must be at least 1"));
    }
    Ok(PtySize {
        rows: size.rows,
        cols: size.cols,
    })
}

fn command_of(req: &ExecRequest) -> Result<CommandSpec, ServiceError> {
    match (&req.argv, &req.shell) {
        (Some(argv), None) => {
            if argv.is_empty() || argv[0].is_empty() {
                return Err(ServiceError::invalid("argv", "argv must name a program"));
            }
            if argv.len() > MAX_ARGV {
                return Err(ServiceError::invalid(
                    "argv",
                    format!("at most {MAX_ARGV} arguments"),
                ));
            }
            if argv.iter().any(|a| a.contains('\0')) {
                return Err(ServiceError::invalid(
                    "argv",
                    "arguments cannot contain NUL bytes",
                ));
            }
            Ok(CommandSpec::Argv { argv: argv.clone() })
        }
        (None, Some(script)) => {
            if script.contains('\0') {
                return Err(ServiceError::invalid(
                    "shell",
                    "the command cannot contain NUL bytes",
                ));
            }
            Ok(CommandSpec::Shell {
                script: script.clone(),
            })
        }
        (Some(_), Some(_)) => Err(ServiceError::invalid(
            "argv",
            "give either argv or shell, not both",
        )),
        (None, None) => Err(ServiceError::invalid("argv", "give argv or shell")),
    }
}

fn command_body(c: &CommandSpec) -> ProcessCommand {
    match c {
        CommandSpec::Argv { argv } => ProcessCommand::Argv { argv: argv.clone() },
        CommandSpec::Shell { script } => ProcessCommand::Shell {
            script: script.clone(),
        },
    }
}

/// What an exec request is, as an approval policy sees it and a person approves it.
fn exec_action<'a>(
    command: &'a CommandSpec,
    joined: &'a (String, String),
    cwd: &'a str,
    user: &'a str,
    pty: bool,
) -> Action<'a> {
    let (program, args, command) = match command {
        CommandSpec::Argv { argv } => (argv[0].as_str(), joined.0.as_str(), joined.1.as_str()),
        CommandSpec::Shell { script } => ("/bin/sh", joined.0.as_str(), script.as_str()),
    };
    Action::Exec(ExecAction {
        program,
        args,
        command,
        cwd,
        user,
        pty,
    })
}

/// The arguments after the program, and the whole command line, each joined by single spaces (a
/// shell request's arguments: `-c` and its script).
fn joined(command: &CommandSpec) -> (String, String) {
    match command {
        CommandSpec::Argv { argv } => (argv[1..].join(" "), argv.join(" ")),
        CommandSpec::Shell { script } => (format!("-c {script}"), script.clone()),
    }
}

impl SandboxService {
    /// The approval policy's check of an exec request (see `core/approvals/gate.rs`): what it
    /// runs as, where, and under a terminal or not, all as requested (the sandbox's defaults where
    /// the request leaves them out).
    async fn gate_exec(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: &ExecRequest,
        command: &CommandSpec,
        spec: &crate::core::live::StoredSpec,
    ) -> Result<Gated, ServiceError> {
        let joined = joined(command);
        let user = req.user.clone().unwrap_or_else(|| spec.user.clone());
        let cwd = req
            .cwd
            .clone()
            .or(spec.workdir.clone())
            .unwrap_or_else(|| "/".to_owned());
        let action = exec_action(command, &joined, &cwd, &user, req.pty.is_some());
        let asked = || {
            let mut request = serde_json::to_value(ExecRequest {
                approval_id: None,
                approval_wait_ms: None,
                ..req.clone()
            })
            .unwrap_or_default();
            // A terminal's size is not what a person approves: a retry from another window runs.
            if request["pty"].is_object() {
                request["pty"] = serde_json::Value::Bool(true);
            }
            Asked {
                kind: ApprovalKind::Exec,
                summary: joined.1.clone(),
                request,
            }
        };
        self.gate(
            p,
            Some(id.as_str()),
            &[action],
            asked,
            req.approval_id.as_deref(),
            req.approval_wait_ms.map(std::time::Duration::from_millis),
        )
        .await
    }

    /// Starts a process. Foreground: the stream carries its output and exit. Background: it keeps
    /// running on its own; read it later with [`SandboxService::attach_process`].
    #[tracing::instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn exec(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: ExecRequest,
    ) -> Result<ExecStream, ServiceError> {
        self.exec_gated(p, id, req, None).await
    }

    /// [`SandboxService::exec`] of a request a person already approved elsewhere (an approved
    /// execution's command): no policy check, and `approval_id` in its start row.
    pub(crate) async fn exec_approved(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: ExecRequest,
        approval_id: String,
    ) -> Result<ExecStream, ServiceError> {
        self.exec_gated(
            p,
            id,
            req,
            Some(Gated {
                approval_id: Some(approval_id),
            }),
        )
        .await
    }

    /// Starts a process: checked against the approval policy unless `approved` says how it was.
    async fn exec_gated(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: ExecRequest,
        approved: Option<Gated>,
    ) -> Result<ExecStream, ServiceError> {
        let started = Instant::now();
        let command = command_of(&req)?;
        crate::plan::create::check_env("env", &req.env)?;
        crate::plan::create::check_cwd(req.cwd.as_deref())?;
        if req.tag.as_ref().is_some_and(|t| t.len() > MAX_TAG_LEN) {
            return Err(ServiceError::invalid(
                "tag",
                format!("at most {MAX_TAG_LEN} bytes"),
            ));
        }
        let pty = req.pty.map(pty_size).transpose()?;
        let spec = self.owned_live(p, id).await?.spec();
        let gated = match approved {
            Some(gated) => gated,
            None => self.gate_exec(p, id, &req, &command, &spec).await?,
        };
        // Looked up again: a request held for a person does not hold the sandbox meanwhile.
        let sb = self.owned_live(p, id).await?;
        // The request's own variables override the sandbox's.
        let mut env = self.process_env(&sb);
        env.extend(req.env.clone());
        let user = req.user.clone().unwrap_or_else(|| spec.user.clone());
        let cwd = req.cwd.clone().or(spec.workdir.clone());
        let wants_stdin = req.stdin.is_some() || req.stdin_open;
        let spawn = SpawnRequest {
            command: command.clone(),
            env,
            cwd: cwd.clone(),
            user: Some(user.clone()),
            stdin: wants_stdin,
            pty,
            timeout_ms: req.timeout_ms,
            tag: req.tag.clone(),
            detached: false,
        };
        let diff_base = self.exec_diff_base(&sb).await?;
        // The start row is written before the process runs, so a crash right after the spawn
        // cannot leave a process that ran with no record of what it was. The exec id ties it to
        // the exit row, which carries the pid (unknown until the agent has spawned it).
        let exec_id = crate::lifecycle::processes::new_exec_id();
        let detail = audit::ProcessStarted {
            command: command_audit(&command),
            exec_id: exec_id.clone(),
            cwd: cwd.clone(),
            user,
            background: req.background,
            pty: pty.is_some(),
            tag: req.tag.clone(),
            approval_id: gated.approval_id,
        };
        if let Err(e) = self
            .audit(AuditEntry::ok(p, AuditAction::ProcessStart, Some(id)).detail(detail))
            .await
        {
            if let Some(base) = &diff_base {
                self.drop_exec_diff_base(base).await;
            }
            return Err(e);
        }
        let spawned = sb.client.spawn(spawn).await;
        paddock_runtime::fault::point("exec.spawned");
        let (pid, events) = match spawned {
            Ok(spawned) => spawned,
            Err(e) => {
                if let Some(base) = &diff_base {
                    self.drop_exec_diff_base(base).await;
                }
                let error = process_error("start a process", 0, e);
                // The start row said "about to run": this row says it never did.
                let detail = audit::ProcessNotSpawned {
                    exec_id: exec_id.clone(),
                    spawned: false,
                    message: error.message.clone(),
                };
                self.audit(
                    AuditEntry::ok(p, AuditAction::ProcessExit, Some(id))
                        .outcome(error.code.as_str())
                        .detail(detail),
                )
                .await?;
                return Err(error);
            }
        };
        self.inner.metrics.observe_exec_start(started.elapsed());
        let (tx, rx) = if req.background {
            (None, None)
        } else {
            let (tx, rx) = mpsc::channel(STREAM_QUEUE);
            (Some(tx), Some(rx))
        };
        tokio::spawn(self.clone().monitor(
            sb.clone(),
            p.clone(),
            Followed {
                pid,
                exec_id: Some(exec_id),
                command: None,
            },
            events,
            tx,
            !req.background,
            started,
            diff_base,
        ));
        if let Some(data) = req.stdin {
            sb.add_bytes_in(pid, data.len() as u64);
            sb.client
                .write_stdin(pid, data.as_bytes(), !req.stdin_open)
                .await
                .map_err(|e| process_error("write stdin", pid, e))?;
        }
        Ok(ExecStream {
            pid,
            rx,
            started_sent: false,
            budget: (self.inner.collect_budget.clone(), p.tenant.clone()),
        })
    }

    /// Re-attaches to a process (running or finished): replays its output from the offsets, then
    /// follows it (unless `follow` is false: then the stream ends with what is buffered now).
    pub async fn attach_process(
        &self,
        p: &Principal,
        id: &SandboxId,
        pid: u32,
        q: AttachQuery,
    ) -> Result<ExecStream, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        // A connection of its own: replaying a large buffer must not stall the sandbox's shared one.
        let client = sb.own_connection().await?;
        let (_, mut events) = client
            .attach(pid, q.stdout_from, q.stderr_from)
            .await
            .map_err(|e| process_error("attach to a process", pid, e))?;
        let (tx, rx) = mpsc::channel(STREAM_QUEUE);
        let follow = q.follow.unwrap_or(true);
        self.audit(
            AuditEntry::ok(p, AuditAction::ProcessAttach, Some(id))
                .detail(audit::ProcessAttached { pid, follow }),
        )
        .await?;
        tokio::spawn(async move {
            if !follow {
                forward_buffered(&client, pid, &mut events, &tx).await;
                let _ = client.detach(pid).await;
                return;
            }
            loop {
                tokio::select! {
                    event = events.recv() => if !forward(event, &tx).await {
                        break;
                    },
                    () = tx.closed() => break,
                }
            }
        });
        Ok(ExecStream {
            pid,
            rx: Some(rx),
            started_sent: false,
            budget: (self.inner.collect_budget.clone(), p.tenant.clone()),
        })
    }

    /// Writes to a process's stdin (which must have been kept open); `close` closes it afterwards.
    pub async fn write_stdin(
        &self,
        p: &Principal,
        id: &SandboxId,
        pid: u32,
        data: Bytes,
        close: bool,
    ) -> Result<(), ServiceError> {
        let sb = self.owned_live(p, id).await?;
        sb.add_bytes_in(pid, data.len() as u64);
        sb.client
            .write_stdin(pid, &data, close)
            .await
            .map_err(|e| process_error("write stdin", pid, e))
    }

    /// Sends a signal to one process.
    pub async fn signal_process(
        &self,
        p: &Principal,
        id: &SandboxId,
        pid: u32,
        req: SignalRequest,
    ) -> Result<(), ServiceError> {
        let signal = parse_signal("signal", &req.signal)?;
        let sb = self.owned_live(p, id).await?;
        sb.client
            .signal(pid, signal)
            .await
            .map_err(|e| process_error("signal a process", pid, e))?;
        self.audit(
            AuditEntry::ok(p, AuditAction::ProcessSignal, Some(id))
                .detail(audit::ProcessSignalled { pid, signal }),
        )
        .await
    }

    /// Signals a process and all its descendants (default SIGKILL).
    pub async fn kill_process(
        &self,
        p: &Principal,
        id: &SandboxId,
        pid: u32,
        req: KillRequest,
    ) -> Result<(), ServiceError> {
        let signal = req
            .signal
            .as_ref()
            .map(|s| parse_signal("signal", s))
            .transpose()?;
        let sb = self.owned_live(p, id).await?;
        sb.client
            .kill_tree(pid, signal)
            .await
            .map_err(|e| process_error("kill a process tree", pid, e))?;
        self.audit(
            AuditEntry::ok(p, AuditAction::ProcessKill, Some(id)).detail(audit::ProcessSignalled {
                pid,
                signal: signal.unwrap_or(9),
            }),
        )
        .await
    }

    /// Resizes a PTY process's terminal.
    pub async fn resize_pty(
        &self,
        p: &Principal,
        id: &SandboxId,
        pid: u32,
        size: PtySizeBody,
    ) -> Result<(), ServiceError> {
        let size = pty_size(size)?;
        let sb = self.owned_live(p, id).await?;
        sb.client
            .resize(pid, size)
            .await
            .map_err(|e| process_error("resize a terminal", pid, e))
    }

    /// The sandbox's processes started through the API (running, and finished ones still remembered).
    pub async fn list_processes(&self, p: &Principal, id: &SandboxId) -> Result<ProcessList, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let processes = sb
            .client
            .list_processes()
            .await
            .map_err(|e| process_error("list processes", 0, e))?;
        Ok(ProcessList {
            processes: processes
                .into_iter()
                .map(|proc| ProcessInfo {
                    pid: proc.pid,
                    tag: proc.tag,
                    command: command_body(&proc.command),
                    pty: proc.pty,
                    started_at: rfc3339(proc.started_at_ms as i64),
                    running: proc.exit.is_none(),
                    exit: proc.exit.as_ref().map(exit_info),
                })
                .collect(),
        })
    }
}

/// Passes one event of a followed process on; false when the stream is over (the process or the
/// sandbox ended, or the receiver left).
async fn forward(event: Option<ProcessEvent>, tx: &mpsc::Sender<ExecOutput>) -> bool {
    match event {
        Some(ProcessEvent::Output { stream, offset, data }) => {
            tx.send(ExecOutput::output(stream, offset, data)).await.is_ok()
        }
        Some(ProcessEvent::Exited(status)) => {
            let _ = tx.send(ExecOutput::Exit(exit_info(&status))).await;
            false
        }
        None => {
            let _ = tx.send(ExecOutput::sandbox_ended()).await;
            false
        }
    }
}

/// Forwards what the agent replays for an attach, and nothing after: a `list_processes` sent after
/// the attach is answered after every replayed frame (one ordered connection), so once its reply is
/// in, the replay is complete.
async fn forward_buffered(
    client: &AgentClient,
    pid: u32,
    events: &mut ProcessEvents,
    tx: &mpsc::Sender<ExecOutput>,
) {
    let marker = client.list_processes();
    tokio::pin!(marker);
    let mut marker_done = false;
    loop {
        tokio::select! {
            biased;
            event = events.recv() => if !forward(event, tx).await {
                return;
            },
            _ = &mut marker, if !marker_done => {
                marker_done = true;
            }
            () = std::future::ready(()), if marker_done => {
                // The marker's reply is in and every earlier event has been taken (biased order).
                let _ = pid;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exactly_one_of_argv_and_shell() {
        let both = ExecRequest {
            argv: Some(vec!["true".into()]),
            shell: Some("true".into()),
            ..Default::default()
        };
        assert_eq!(
            command_of(&both).expect_err("both").field.as_deref(),
            Some("argv")
        );
        assert!(command_of(&ExecRequest::default()).is_err());
        let empty = ExecRequest {
            argv: Some(vec![]),
            ..Default::default()
        };
        assert!(command_of(&empty).is_err());
        let nul = ExecRequest {
            shell: Some("a\0b".into()),
            ..Default::default()
        };
        assert_eq!(command_of(&nul).expect_err("nul").field.as_deref(), Some("shell"));
    }
}
