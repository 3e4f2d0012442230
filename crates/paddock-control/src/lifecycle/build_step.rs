//! Running one command to its end in a live sandbox for the server's own purposes (a recipe's
//! `RUN`): audited like any process (its start row, by the caller who asked for the build),
//! its output handed to a callback as it comes, its exit returned.
//!
//! This module does not decide what runs or what a failure means; the recipe does.

use std::collections::BTreeMap;

use paddock_protocol::{CommandSpec, ExitStatus, SpawnRequest, Stream};
use paddock_runtime::agent_client::{AgentClientError, MkdirOptions, ProcessEvent};
use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::{Principal, SandboxService, ServiceError};

/// A command to run to its end.
#[derive(Debug, Clone)]
pub(crate) struct BuildCommand {
    pub(crate) argv: Vec<String>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) cwd: String,
    pub(crate) user: String,
    pub(crate) timeout_ms: u64,
    pub(crate) tag: &'static str,
}

impl SandboxService {
    /// Runs `command` in sandbox `id` for `p` and waits for its exit; `on_output` gets its output.
    pub(crate) async fn run_build_command(
        &self,
        p: &Principal,
        id: &SandboxId,
        command: BuildCommand,
        on_output: &mut (dyn FnMut(Stream, &[u8]) + Send),
    ) -> Result<ExitStatus, ServiceError> {
        let sb = self
            .live_sandbox(id.as_str())
            .ok_or_else(|| ServiceError::sandbox_ending(id))?;
        let spec = CommandSpec::Argv { argv: command.argv };
        let detail = audit::ProcessStarted {
            command: crate::lifecycle::processes::command_audit(&spec),
            exec_id: crate::lifecycle::processes::new_exec_id(),
            cwd: Some(command.cwd.clone()),
            user: command.user.clone(),
            background: false,
            pty: false,
            tag: Some(command.tag.to_owned()),
            approval_id: None,
        };
        self.audit(AuditEntry::ok(p, AuditAction::ProcessStart, Some(id.as_str())).detail(detail))
            .await?;
        // The working directory is made if missing, owned by the command's user (as docker's
        // builder makes a `WORKDIR`).
        let mkdir = MkdirOptions {
            parents: true,
            mode: None,
            user: Some(command.user.clone()),
        };
        sb.client.mkdir(&command.cwd, &mkdir).await.map_err(|e| {
            ServiceError::new(
                ErrorCode::BuildFailed,
                format!("working directory {}: {}", command.cwd, agent_reason(&e)),
            )
        })?;
        let request = SpawnRequest {
            command: spec,
            env: command.env,
            cwd: Some(command.cwd),
            user: Some(command.user),
            stdin: false,
            pty: None,
            timeout_ms: Some(command.timeout_ms),
            tag: Some(command.tag.to_owned()),
            detached: false,
        };
        let (_pid, mut events) = sb
            .client
            .spawn(request)
            .await
            .map_err(|e| ServiceError::new(ErrorCode::BuildFailed, agent_reason(&e)))?;
        while let Some(event) = events.recv().await {
            match event {
                ProcessEvent::Output { stream, data, .. } => on_output(stream, &data),
                ProcessEvent::Exited(status) => return Ok(status),
            }
        }
        Err(ServiceError::sandbox_ending(id))
    }
}

/// What the agent said, or what went wrong talking to it.
fn agent_reason(e: &AgentClientError) -> String {
    match e {
        AgentClientError::Agent(error) => error.message.clone(),
        other => other.to_string(),
    }
}
