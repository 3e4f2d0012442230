//! A template's start command: run at every boot of a sandbox made from the template (a create, a
//! fork's copy, a resume, a warm pool's boot), in the background with the tag `start`, as the
//! sandbox's user, in its working directory, with its environment; then its readiness check (a
//! port accepting a connection, or a command exiting 0), polled until it passes or its timeout.
//! A boot whose check does not pass fails with `timeout` (the caller removes the sandbox).
//!
//! This module does not restart a start command that exits, or watch it after readiness.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use paddock_protocol::{CommandSpec, SpawnRequest};
use paddock_runtime::agent_client::{AgentClient, ProcessEvent};
use paddock_runtime::SandboxHandle;
use paddock_types::api::{ErrorCode, ReadyCheck, TemplateStart};
use paddock_types::SandboxId;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::StoredSpec;
use crate::{SandboxService, ServiceError};

/// How often a readiness check is tried.
const READY_POLL: Duration = Duration::from_millis(20);
/// The most one try of a port check waits for its connection.
const PORT_TRY: Duration = Duration::from_secs(2);

impl SandboxService {
    /// Starts `spec`'s start command in the freshly booted sandbox `id` and waits for its
    /// readiness; `handle` is lent and given back (`None` only if a backend task panicked with
    /// it: the sandbox is then gc's).
    pub(crate) async fn run_start_command(
        &self,
        id: &SandboxId,
        spec: &StoredSpec,
        handle: SandboxHandle,
        client: &AgentClient,
    ) -> (Option<SandboxHandle>, Result<(), ServiceError>) {
        let Some(start) = &spec.start else {
            return (Some(handle), Ok(()));
        };
        match self.spawn_start(id, spec, start, client).await {
            Err(e) => (Some(handle), Err(e)),
            Ok(env) => match &start.ready {
                None => (Some(handle), Ok(())),
                Some(ready) => self.wait_ready(id, spec, ready, env, handle, client).await,
            },
        }
    }

    async fn spawn_start(
        &self,
        id: &SandboxId,
        spec: &StoredSpec,
        start: &TemplateStart,
        client: &AgentClient,
    ) -> Result<BTreeMap<String, String>, ServiceError> {
        let argv = start
            .command
            .clone()
            .ok_or_else(|| ServiceError::internal("start a template's command", &"no command recorded"))?;
        let mut env: BTreeMap<String, String> = self.network_env(id).into_iter().collect();
        env.extend(spec.env.clone());
        let command = CommandSpec::Argv { argv };
        let detail = audit::ProcessStarted {
            command: crate::lifecycle::processes::command_audit(&command),
            exec_id: crate::lifecycle::processes::new_exec_id(),
            cwd: spec.workdir.clone(),
            user: spec.user.clone(),
            background: true,
            pty: false,
            tag: Some("start".into()),
            approval_id: None,
        };
        // The row is the sandbox's tenant's (none for a warm sandbox, which no tenant has yet).
        let sid = id.to_string();
        let tenant = self
            .db("read a sandbox", move |s| s.get_sandbox(&sid))
            .await?
            .and_then(|r| r.tenant);
        self.audit(AuditEntry::by(None, tenant, AuditAction::ProcessStart, Some(id.as_str())).detail(detail))
            .await?;
        let request = SpawnRequest {
            command,
            env: env.clone(),
            cwd: spec.workdir.clone(),
            user: Some(spec.user.clone()),
            stdin: false,
            pty: None,
            timeout_ms: None,
            tag: Some("start".into()),
            detached: true,
        };
        client.spawn(request).await.map_err(|e| {
            ServiceError::new(
                ErrorCode::InvalidRequest,
                format!("the template's start command: {e}"),
            )
        })?;
        Ok(env)
    }

    async fn wait_ready(
        &self,
        id: &SandboxId,
        spec: &StoredSpec,
        ready: &ReadyCheck,
        env: BTreeMap<String, String>,
        mut handle: SandboxHandle,
        client: &AgentClient,
    ) -> (Option<SandboxHandle>, Result<(), ServiceError>) {
        let limit = Duration::from_secs(ready.timeout_secs);
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let passed = match (&ready.port, &ready.command) {
                (Some(port), _) => match self.port_accepts(handle, *port, left.min(PORT_TRY)).await {
                    Ok((back, passed)) => {
                        handle = back;
                        passed
                    }
                    Err(e) => return (None, Err(e)),
                },
                (None, Some(argv)) => command_passes(client, spec, argv, &env, left).await,
                (None, None) => true,
            };
            if passed {
                return (Some(handle), Ok(()));
            }
            if Instant::now() >= deadline {
                let what = match ready.port {
                    Some(port) => format!("port {port} accepted no connection"),
                    None => "its readiness command did not exit 0".to_owned(),
                };
                return (
                    Some(handle),
                    Err(ServiceError::new(
                        ErrorCode::Timeout,
                        format!(
                            "sandbox {id} was not ready within {}s: {what} (the template's start check)",
                            limit.as_secs()
                        ),
                    )),
                );
            }
            tokio::time::sleep(READY_POLL.min(left)).await;
        }
    }

    /// Whether `port` in the sandbox accepts a connection within `limit`.
    async fn port_accepts(
        &self,
        handle: SandboxHandle,
        port: u16,
        limit: Duration,
    ) -> Result<(SandboxHandle, bool), ServiceError> {
        let (handle, socket) = self
            .on_backend("open a sandbox port", move |b| {
                let socket = b.open_port(&handle, port);
                (handle, socket)
            })
            .await?;
        let passed = match socket {
            Ok(socket) => matches!(tokio::time::timeout(limit, socket.connect()).await, Ok(Ok(_))),
            Err(_) => false,
        };
        Ok((handle, passed))
    }
}

/// Whether `argv` exits 0 within `limit`.
async fn command_passes(
    client: &AgentClient,
    spec: &StoredSpec,
    argv: &[String],
    env: &BTreeMap<String, String>,
    limit: Duration,
) -> bool {
    let request = SpawnRequest {
        command: CommandSpec::Argv { argv: argv.to_vec() },
        env: env.clone(),
        cwd: spec.workdir.clone(),
        user: Some(spec.user.clone()),
        stdin: false,
        pty: None,
        timeout_ms: Some(limit.as_millis().max(1) as u64),
        tag: Some("start-check".into()),
        detached: false,
    };
    let Ok((_, mut events)) = client.spawn(request).await else {
        return false;
    };
    while let Some(event) = events.recv().await {
        if let ProcessEvent::Exited(exit) = event {
            return exit.code == Some(0) && !exit.timed_out;
        }
    }
    false
}
