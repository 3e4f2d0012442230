//! The one seam between approved executions and where they run: the [`Executor`] trait, its three
//! operations (execute, status, cancel), and what they take and give.
//!
//! Two executors implement it: `sandbox` (a fresh paddock sandbox of the execution's template, in
//! this crate's `lifecycle/executions.rs`) and `kubernetes-job` (a Job through `kube`, in the
//! `paddock-kube` crate). The control plane drives whichever the server is configured with: it
//! calls `execute` once an execution is approved, `status` until it is finished, and `cancel` when
//! asked or when the deadline passes.
//!
//! What it does not do: hold executions, approvals or audit rows (`ops/executions.rs` does), or
//! decide when to call what (`lifecycle/executions.rs` does).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// A boxed future, so the trait stays object-safe (`Arc<dyn Executor>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What an approved execution runs, as approved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionSpec {
    /// Paddock's id of the execution (`ex-...`), unique on this server; executors name their
    /// objects from it.
    pub id: String,
    /// The tenant it runs for.
    pub tenant: String,
    /// The template to run it in (the `sandbox` executor; `default` when absent).
    pub template: Option<String>,
    /// The container image to run it in (the `kubernetes-job` executor).
    pub image: Option<String>,
    /// The program and its leading arguments (a container's `command`).
    pub command: Vec<String>,
    /// Further arguments (a container's `args`).
    pub args: Vec<String>,
    /// Environment variables.
    pub env: BTreeMap<String, String>,
    /// The longest it may run; past it the executor ends it and it is `timed_out`.
    pub timeout: Duration,
    /// The most output (stdout and stderr together) kept; past it, logs are cut and say so.
    pub log_limit: u64,
    /// The caller's own ids (`session_id`, `task_id`), as labels an executor may put on its
    /// objects.
    pub labels: BTreeMap<String, String>,
}

/// How an execution ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Exit code 0.
    Succeeded,
    /// A non-zero exit, or it could not be run.
    Failed,
    /// It ran past its timeout and was ended.
    TimedOut,
    /// It was cancelled.
    Cancelled,
}

/// An execution that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub outcome: Outcome,
    /// The exit code, when the program ran to an exit.
    pub exit_code: Option<i32>,
    /// Its output, at most the spec's `log_limit` bytes.
    pub logs: Vec<u8>,
    /// Whether output past the limit was cut.
    pub truncated: bool,
    /// Why, in words, when it did not succeed (`DeadlineExceeded`, `image pull failed`, ...).
    pub message: Option<String>,
}

/// Where an execution stands, as its executor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecutorStatus {
    /// Starting or running.
    Running,
    /// Ended.
    Finished(Finished),
}

/// An executor's failure to do what it was asked (not the program's failure: that is a
/// [`Finished`] with [`Outcome::Failed`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExecutorError {
    /// What went wrong, safe to show the execution's owner.
    pub message: String,
    /// The object is gone (deleted behind the executor's back, or lost at a restart).
    pub gone: bool,
}

impl ExecutorError {
    /// A failure described by `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            gone: false,
        }
    }

    /// The object is gone.
    pub fn gone(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            gone: true,
        }
    }
}

/// Where approved executions run.
pub trait Executor: Send + Sync + 'static {
    /// Its name in configuration and in execution records (`sandbox`, `kubernetes-job`).
    fn backend(&self) -> &'static str;

    /// Starts `spec`; the name of the object it runs in (a sandbox id, a Job's name), which
    /// `status` and `cancel` take. Called once per execution.
    fn execute<'a>(&'a self, spec: &'a ExecutionSpec) -> BoxFuture<'a, Result<String, ExecutorError>>;

    /// Where the execution in `object` stands, with its logs once finished.
    fn status<'a>(
        &'a self,
        object: &'a str,
        spec: &'a ExecutionSpec,
    ) -> BoxFuture<'a, Result<ExecutorStatus, ExecutorError>>;

    /// Ends the execution in `object` and removes what it made; done when it returns (a second
    /// call, or one for an object already gone, succeeds).
    fn cancel<'a>(&'a self, object: &'a str) -> BoxFuture<'a, Result<(), ExecutorError>>;
}

/// Output kept under a byte limit: the first `limit` bytes, and whether more came.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CappedLogs {
    limit: u64,
    bytes: Vec<u8>,
    truncated: bool,
}

impl CappedLogs {
    /// Empty, keeping at most `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            limit,
            bytes: Vec::new(),
            truncated: false,
        }
    }

    /// Appends what fits of `data`.
    pub fn push(&mut self, data: &[u8]) {
        let room = usize::try_from(self.limit)
            .unwrap_or(usize::MAX)
            .saturating_sub(self.bytes.len());
        if data.len() > room {
            self.truncated = true;
        }
        self.bytes.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// The bytes kept, and whether any were cut.
    pub fn into_parts(self) -> (Vec<u8>, bool) {
        (self.bytes, self.truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_logs_keep_the_first_bytes_and_say_they_were_cut() {
        let mut logs = CappedLogs::new(5);
        logs.push(b"abc");
        assert_eq!(logs.clone().into_parts(), (b"abc".to_vec(), false));
        logs.push(b"defg");
        logs.push(b"h");
        assert_eq!(logs.into_parts(), (b"abcde".to_vec(), true));
        let mut exact = CappedLogs::new(3);
        exact.push(b"abc");
        assert_eq!(exact.into_parts(), (b"abc".to_vec(), false));
    }
}
