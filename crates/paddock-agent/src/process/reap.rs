//! Reaping: on every `SIGCHLD`, collect every terminated child with `wait4(-1)` (the agent is PID 1
//! or a child subreaper, so orphaned grandchildren arrive here too) and record the exits of the
//! processes the agent started. Unknown pids are orphans and are only reaped.

use std::rc::Rc;

use paddock_protocol::ExitStatus;
use paddock_sys::reap::{reap_one, ChildExit, Reaped};
use tokio::signal::unix::Signal;

use crate::agent::Agent;

/// Reaps children until `sigchld` ends (never, in practice). `sigchld` must have been created before
/// the first child was started, so no exit can be missed.
pub(crate) async fn reap_children(agent: Rc<Agent>, mut sigchld: Signal) {
    loop {
        loop {
            match reap_one() {
                Ok(Some(reaped)) => record_exit(&agent, reaped),
                Ok(None) => break,
                Err(err) => {
                    tracing::warn!(error = %err, "wait4 failed");
                    break;
                }
            }
        }
        if sigchld.recv().await.is_none() {
            return;
        }
    }
}

fn record_exit(agent: &Agent, reaped: Reaped) {
    let process = agent.processes.borrow().get(reaped.pid);
    let Some(process) = process.filter(|p| p.exit_status().is_none()) else {
        tracing::debug!(pid = reaped.pid, "reaped an orphan");
        return;
    };
    let (code, signal) = match reaped.exit {
        ChildExit::Code(code) => (Some(code), None),
        ChildExit::Signal(signal) => (None, Some(signal)),
    };
    let status = ExitStatus {
        code,
        signal,
        timed_out: process.timed_out(),
        cpu_time_us: reaped.cpu_time_us,
        max_rss_kib: reaped.max_rss_kib,
        duration_ms: process.runtime_ms(),
    };
    tracing::info!(
        pid = reaped.pid,
        ?code,
        ?signal,
        timed_out = status.timed_out,
        "process exited"
    );
    process.set_exit(status);
    agent.check_finished(&process);
}
