//! Following a process to its end: forwarding its output to whoever streams it, then writing its
//! `process.exit` row (and its exec diff). Used by exec and by recovery, which re-attaches to
//! processes that outlived a restart.
//!
//! It does not start processes (`ops::exec`).

use std::sync::Arc;
use std::time::Instant;

use paddock_protocol::CommandSpec;
use paddock_runtime::agent_client::{ProcessEvent, ProcessEvents};
use tokio::sync::mpsc;

use crate::core::audit::{self, AuditAction, AuditEntry, CommandDetail};
use crate::core::live::LiveSandbox;
use crate::core::output::events::{exit_info, ExecOutput};
use crate::core::principal::Principal;
use crate::core::service::SandboxService;

/// A fresh exec id: ties a `process.start` row (written before the pid exists) to its exit row.
pub(crate) fn new_exec_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

pub(crate) fn command_audit(c: &CommandSpec) -> CommandDetail {
    match c {
        CommandSpec::Argv { argv } => CommandDetail::Argv(argv.clone()),
        CommandSpec::Shell { script } => CommandDetail::Shell(script.clone()),
    }
}

/// The process a monitor follows, and what its exit row says about it besides the exit.
pub(crate) struct Followed {
    pub(crate) pid: u32,
    /// The exec id of its `process.start` row, when known.
    pub(crate) exec_id: Option<String>,
    /// Its command as the agent reports it (`{"argv": ...}` or `{"shell": ...}`), for exits
    /// recorded after a restart: the start row may be missing from older logs.
    pub(crate) command: Option<CommandDetail>,
}

impl Followed {
    /// What its exit row repeats of it (flattened into the row's details).
    pub(crate) fn annotate(&self) -> audit::ProcessRef {
        audit::ProcessRef {
            exec_id: self.exec_id.clone(),
            command: self.command.clone(),
        }
    }
}

impl SandboxService {
    /// Follows one process to its end: forwards its events, then records its exit.
    #[expect(clippy::too_many_arguments, reason = "one task's whole context, passed once")]
    pub(crate) async fn monitor(
        self,
        sb: Arc<LiveSandbox>,
        p: Principal,
        followed: Followed,
        mut events: ProcessEvents,
        mut tx: Option<mpsc::Sender<ExecOutput>>,
        foreground: bool,
        started: Instant,
        diff_base: Option<paddock_types::SnapshotId>,
    ) {
        let pid = followed.pid;
        let mut bytes_out = 0u64;
        let exit = loop {
            let event = match &tx {
                Some(sender) => tokio::select! {
                    event = events.recv() => event,
                    () = sender.closed() => {
                        tx = None;
                        if foreground {
                            let _ = sb.client.kill_tree(pid, None).await;
                        }
                        continue;
                    }
                },
                None => events.recv().await,
            };
            match event {
                Some(ProcessEvent::Output { stream, offset, data }) => {
                    bytes_out += data.len() as u64;
                    if let Some(sender) = &tx {
                        let item = ExecOutput::output(stream, offset, data);
                        if sender.send(item).await.is_err() {
                            tx = None;
                            if foreground {
                                let _ = sb.client.kill_tree(pid, None).await;
                            }
                        }
                    }
                }
                Some(ProcessEvent::Exited(status)) => break Some(status),
                None => break None,
            }
        };
        let counters = sb.take_counters(pid);
        let entry = AuditEntry::ok(&p, AuditAction::ProcessExit, Some(&sb.id));
        let entry = match &exit {
            Some(status) => {
                let info = exit_info(status);
                if let Some(sender) = &tx {
                    let _ = sender.send(ExecOutput::Exit(info)).await;
                }
                self.inner.metrics.observe_exec(started.elapsed());
                entry.detail(audit::ProcessExited {
                    pid,
                    exit: info.into(),
                    bytes_in: counters.bytes_in,
                    bytes_out,
                    process: followed.annotate(),
                })
            }
            None => {
                if let Some(sender) = &tx {
                    let _ = sender.send(ExecOutput::sandbox_ended()).await;
                }
                entry.outcome("lost").detail(audit::ProcessLost {
                    pid,
                    duration_ms: started.elapsed().as_millis() as u64,
                    bytes_in: counters.bytes_in,
                    bytes_out,
                    process: followed.annotate(),
                })
            }
        };
        if let Err(e) = self.audit(entry).await {
            tracing::error!(sandbox_id = %sb.id, pid, error = %e, "cannot record a process exit");
        }
        if let Some(base) = diff_base {
            self.record_exec_diff(&sb, &p, pid, base).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_row_names_its_start_and_the_reported_command() {
        use serde_json::json;
        /// A detail with a pid and what an exit row repeats of its process.
        #[derive(serde::Serialize)]
        struct Pid {
            pid: u32,
            #[serde(flatten)]
            process: audit::ProcessRef,
        }
        let followed = Followed {
            pid: 3,
            exec_id: Some("e1".into()),
            command: Some(CommandDetail::Argv(vec!["ls".into()])),
        };
        let annotated = Pid {
            pid: 3,
            process: followed.annotate(),
        };
        assert_eq!(
            serde_json::to_value(annotated).expect("serializes"),
            json!({"pid": 3, "exec_id": "e1", "argv": ["ls"]})
        );
        let unknown = Followed {
            pid: 3,
            exec_id: None,
            command: None,
        };
        let annotated = Pid {
            pid: 3,
            process: unknown.annotate(),
        };
        assert_eq!(
            serde_json::to_value(annotated).expect("serializes"),
            json!({"pid": 3})
        );
    }
}
