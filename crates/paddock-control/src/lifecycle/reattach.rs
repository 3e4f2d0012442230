//! Processes after a restart: the exits of the processes a sandbox ran while no server watched.
//!
//! The agent outlives the server and remembers its processes. On adoption the new server follows
//! the ones still running and writes the `process.exit` row of the ones that ended meanwhile (unless
//! the previous server wrote it before it died), each naming the command the agent reports and the
//! exec id of its `process.start` row when the log has one. It does not start, kill or re-audit
//! any process.

use std::sync::Arc;
use std::time::Instant;

use paddock_protocol::ExitStatus;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::LiveSandbox;
use crate::core::output::events::exit_info;
use crate::lifecycle::processes::{command_audit, Followed};
use crate::{Principal, SandboxService, ServiceError};

/// How many of a sandbox's newest `process.` audit rows a restart reads to match the processes
/// the agent reports with their start and exit rows.
const PROCESS_ROWS_READ: u32 = 10_000;

/// Whether the previous server wrote the exit row of `proc` before it died (pids can be reused,
/// so only a row written after this process started counts). `rows` are `process.` rows.
fn already_exited(rows: &[paddock_store::AuditRecord], proc: &paddock_protocol::ProcessInfo) -> bool {
    rows.iter().any(|r| {
        AuditAction::ProcessExit.is(&r.action)
            && r.ts_ms >= proc.started_at_ms as i64
            && r.detail["pid"] == proc.pid
    })
}

/// The exec id of the `process.start` row of a process the agent reports (started at
/// `started_at_ms`, running `command`): the newest start row written no later than it started, with
/// the same command, that no exit row and no other process (`claimed`) accounts for. `rows` are
/// `process.` rows, newest first. `None` for a start from before exec ids, or one out of reach.
fn start_of(
    rows: &[paddock_store::AuditRecord],
    command: &serde_json::Value,
    started_at_ms: u64,
    claimed: &[String],
) -> Option<String> {
    let ended: std::collections::HashSet<&str> = rows
        .iter()
        .filter(|r| AuditAction::ProcessExit.is(&r.action))
        .filter_map(|r| r.detail["exec_id"].as_str())
        .collect();
    let same_command = |d: &serde_json::Value| match command {
        serde_json::Value::Object(c) => c.iter().all(|(k, v)| &d[k.as_str()] == v),
        _ => false,
    };
    rows.iter()
        .filter(|r| AuditAction::ProcessStart.is(&r.action) && r.ts_ms <= started_at_ms as i64)
        .filter(|r| same_command(&r.detail))
        .filter_map(|r| r.detail["exec_id"].as_str())
        .find(|e| !ended.contains(e) && !claimed.iter().any(|c| c == e))
        .map(str::to_owned)
}

impl SandboxService {
    /// After a restart: follow the processes that kept running, so their exits are recorded, and
    /// record the exits of those that ended while no server was watching. Each exit row names the
    /// command the agent reports and, when the log has it, the exec id of its start row.
    pub(crate) async fn follow_running_processes(&self, sb: &Arc<LiveSandbox>) {
        let Some(tenant) = sb.tenant() else {
            return;
        };
        let Ok(processes) = sb.client.list_processes().await else {
            return;
        };
        // Recorded by paddock itself: no API key acted.
        let p = Principal {
            tenant,
            key_id: String::new(),
            admin: false,
            change_network: true,
            approver: false,
        };
        let rows = match self.process_rows(&sb.id).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(sandbox_id = %sb.id, error = %e, "cannot read the audit log; process exits not followed");
                return;
            }
        };
        let mut claimed = Vec::new();
        for proc in processes {
            if proc.exit.is_some() && already_exited(&rows, &proc) {
                continue;
            }
            let command = command_audit(&proc.command);
            let as_row = serde_json::to_value(&command).unwrap_or_default();
            let exec_id = start_of(&rows, &as_row, proc.started_at_ms, &claimed);
            claimed.extend(exec_id.clone());
            let followed = Followed {
                pid: proc.pid,
                exec_id,
                command: Some(command),
            };
            match &proc.exit {
                None => {
                    if let Ok((_, events)) = sb.client.attach(proc.pid, u64::MAX, u64::MAX).await {
                        tokio::spawn(self.clone().monitor(
                            sb.clone(),
                            p.clone(),
                            followed,
                            events,
                            None,
                            false,
                            Instant::now(),
                            // The snapshot taken before it started (if any) was the previous
                            // server's; gc deleted it.
                            None,
                        ));
                    }
                }
                Some(status) => {
                    if let Err(e) = self.record_missed_exit(&p, &sb.id, followed, status).await {
                        tracing::warn!(sandbox_id = %sb.id, pid = proc.pid, error = %e, "cannot record a process exit");
                    }
                }
            }
        }
    }

    /// The newest `process.` rows of one sandbox (at most [`PROCESS_ROWS_READ`]), newest first.
    async fn process_rows(&self, id: &str) -> Result<Vec<paddock_store::AuditRecord>, ServiceError> {
        let filter = paddock_store::AuditFilter {
            sandbox_id: Some(id.to_owned()),
            action: Some(AuditAction::ProcessStart.area().into()),
            limit: PROCESS_ROWS_READ,
            newest_first: true,
            ..Default::default()
        };
        self.db("read the audit log", move |s| s.query_audit(&filter))
            .await
    }

    /// Writes the `process.exit` row of a process that ended while the server was down.
    async fn record_missed_exit(
        &self,
        p: &Principal,
        id: &str,
        followed: Followed,
        status: &ExitStatus,
    ) -> Result<(), ServiceError> {
        let detail = audit::ProcessExitedWhileDown {
            pid: followed.pid,
            exit: exit_info(status).into(),
            recorded_after_restart: true,
            process: followed.annotate(),
        };
        self.audit(AuditEntry::ok(p, AuditAction::ProcessExit, Some(id)).detail(detail))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_protocol::CommandSpec;

    fn row(seq: u64, ts_ms: i64, action: &str, detail: serde_json::Value) -> paddock_store::AuditRecord {
        paddock_store::AuditRecord {
            seq,
            ts_ms,
            tenant: None,
            key_id: None,
            action: action.into(),
            sandbox_id: None,
            outcome: "ok".into(),
            detail,
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    #[test]
    fn a_restarted_process_is_matched_with_its_own_start_row() {
        use serde_json::json;
        let sleep = json!({"argv": ["sleep", "9"]});
        // Newest first, as read.
        let rows = vec![
            row(
                5,
                500,
                "process.start",
                json!({"argv": ["sleep", "9"], "exec_id": "e5"}),
            ),
            row(4, 400, "process.exit", json!({"pid": 7, "exec_id": "e2"})),
            row(
                3,
                300,
                "process.start",
                json!({"shell": "sleep 9", "exec_id": "e3"}),
            ),
            row(
                2,
                200,
                "process.start",
                json!({"argv": ["sleep", "9"], "exec_id": "e2"}),
            ),
            row(
                1,
                100,
                "process.start",
                json!({"argv": ["sleep", "9"], "exec_id": "e1"}),
            ),
        ];
        // Started before e5's row was written: not e5; e3 is another command; e2 has exited.
        assert_eq!(start_of(&rows, &sleep, 450, &[]).as_deref(), Some("e1"));
        assert_eq!(start_of(&rows, &sleep, 550, &[]).as_deref(), Some("e5"));
        assert_eq!(
            start_of(&rows, &sleep, 550, &["e5".into()]).as_deref(),
            Some("e1")
        );
        assert_eq!(start_of(&rows, &sleep, 50, &[]), None);
        assert_eq!(
            start_of(&rows, &json!({"shell": "sleep 9"}), 450, &[]).as_deref(),
            Some("e3")
        );
        // A start row from before exec ids matches nothing.
        let old = vec![row(
            1,
            100,
            "process.start",
            json!({"argv": ["sleep", "9"], "pid": 3}),
        )];
        assert_eq!(start_of(&old, &sleep, 450, &[]), None);
    }

    #[test]
    fn an_exit_row_written_before_the_crash_is_not_written_again() {
        use serde_json::json;
        let proc = |pid, started_at_ms| paddock_protocol::ProcessInfo {
            pid,
            tag: None,
            command: CommandSpec::Argv {
                argv: vec!["true".into()],
            },
            pty: false,
            started_at_ms,
            exit: None,
        };
        let rows = vec![row(2, 300, "process.exit", json!({"pid": 7}))];
        assert!(already_exited(&rows, &proc(7, 200)));
        // The same pid, reused by a later process.
        assert!(!already_exited(&rows, &proc(7, 400)));
        assert!(!already_exited(&rows, &proc(8, 200)));
    }
}
