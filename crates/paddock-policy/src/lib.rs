//! Approval policies as data: a default verdict and ordered `allow` / `ask` / `deny` rules over
//! exec requests (program, arguments, command line, working directory, user, terminal), file-API
//! writes and deletes (by path), and network destinations the allowlist does not cover (by host
//! and port), with glob or regular-expression patterns.
//!
//! A policy is a [`PolicySpec`] (JSON, `spec.rs`), checked and compiled whole by [`compile`] (an
//! unparsable policy is refused, never half-applied), and read by the pure [`decide`]: the most
//! restrictive matching verdict wins, its first rule is reported, no match gives the default.
//!
//! What it does not do: any I/O; store, change or audit a policy; hold an `ask` for a person (the
//! control plane's approvals queue does); or see anything from inside a sandbox (the caller
//! describes the action from what the API was asked, which the workload cannot change).

mod compile;
mod decide;
pub mod spec;

pub use compile::{compile, Policy, PolicyError, MAX_PATTERN_LEN, MAX_REASON_LEN, MAX_RULES};
pub use decide::{decide, Action, Decision, ExecAction};
pub use spec::{ExecMatch, FileMatch, FileOp, NetworkMatch, Pattern, PolicySpec, RuleSpec, Verdict};

#[cfg(test)]
mod tests;
