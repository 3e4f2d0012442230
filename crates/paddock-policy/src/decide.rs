//! The decision: what a compiled [`Policy`] says of one action.
//!
//! Of the rules that match the action, the most restrictive verdict wins (deny over ask over
//! allow), so no allow rule, wherever it stands, can open what a deny rule closes; the rule
//! reported is the first in order with that verdict. No matching rule: the policy's default.
//!
//! What it does not do: any I/O, allocation per rule, or anything with the verdict.

use regex::bytes::SetMatches;

use crate::compile::{Field, Kind, Policy, Rule, FIELDS};
use crate::spec::{FileOp, Verdict};

/// An exec request as a policy sees it.
#[derive(Debug, Clone, Copy)]
pub struct ExecAction<'a> {
    /// The program as requested (a shell request's: the shell).
    pub program: &'a str,
    /// The arguments after the program, joined by single spaces.
    pub args: &'a str,
    /// The whole command line (program and arguments joined by single spaces, or a shell
    /// request's script).
    pub command: &'a str,
    /// The working directory.
    pub cwd: &'a str,
    /// The user it runs as.
    pub user: &'a str,
    /// Whether it runs under a terminal.
    pub pty: bool,
}

/// Something a sandbox's caller or workload wants to do.
#[derive(Debug, Clone, Copy)]
pub enum Action<'a> {
    /// Start a process.
    Exec(ExecAction<'a>),
    /// Write or delete a file through the file API.
    File {
        /// Which.
        op: FileOp,
        /// The absolute path inside the sandbox.
        path: &'a str,
    },
    /// Connect to a destination the network allowlist does not cover.
    Network {
        /// The host name or address, lowercase.
        host: &'a str,
        /// The port.
        port: u16,
    },
}

/// What the policy said, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision<'p> {
    /// The verdict.
    pub verdict: Verdict,
    /// The rule that decided it (its index in the policy), `None` for the default.
    pub rule: Option<usize>,
    /// That rule's reason.
    pub reason: Option<&'p str>,
}

/// Each field's matches for one action (`None`: the field does not apply, or no rule constrains
/// it).
struct Matched([Option<SetMatches>; FIELDS]);

impl Matched {
    fn of(policy: &Policy, texts: &[(Field, &str)]) -> Self {
        let mut matched: [Option<SetMatches>; FIELDS] = Default::default();
        for (field, text) in texts {
            if let Some(set) = &policy.sets[field.index()] {
                matched[field.index()] = Some(set.matches(text.as_bytes()));
            }
        }
        Self(matched)
    }

    /// Whether every pattern `rule` has matched.
    fn all(&self, rule: &Rule) -> bool {
        rule.patterns
            .iter()
            .enumerate()
            .all(|(field, pattern)| match pattern {
                None => true,
                Some(k) => self.0[field].as_ref().is_some_and(|m| m.matched(*k)),
            })
    }
}

/// The last component of a path.
fn name_of(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

/// What `policy` says of `action`.
pub fn decide<'p>(policy: &'p Policy, action: &Action<'_>) -> Decision<'p> {
    let (kind, matched) = match action {
        Action::Exec(e) => (
            0,
            Matched::of(
                policy,
                &[
                    (Field::ProgramPath, e.program),
                    (Field::ProgramName, name_of(e.program)),
                    (Field::ExecArgs, e.args),
                    (Field::ExecCommand, e.command),
                    (Field::ExecCwd, e.cwd),
                ],
            ),
        ),
        Action::File { path, .. } => (1, Matched::of(policy, &[(Field::FilePath, path)])),
        Action::Network { host, .. } => (2, Matched::of(policy, &[(Field::NetworkHost, host)])),
    };
    let mut best: Option<usize> = None;
    for &i in &policy.by_kind[kind] {
        let rule = &policy.rules[i];
        if best.is_some_and(|b| policy.rules[b].verdict >= rule.verdict) {
            continue;
        }
        if rule_fits(rule, action) && matched.all(rule) {
            best = Some(i);
            if rule.verdict == Verdict::Deny {
                break;
            }
        }
    }
    match best {
        Some(i) => Decision {
            verdict: policy.rules[i].verdict,
            rule: Some(i),
            reason: policy.rules[i].reason.as_deref(),
        },
        None => Decision {
            verdict: policy.default,
            rule: None,
            reason: None,
        },
    }
}

/// Whether the fields of `rule` that are not patterns fit `action`.
fn rule_fits(rule: &Rule, action: &Action<'_>) -> bool {
    match (&rule.kind, action) {
        (Kind::Exec { user, pty }, Action::Exec(e)) => {
            user.as_deref().is_none_or(|u| u == e.user) && pty.is_none_or(|p| p == e.pty)
        }
        (Kind::File { ops }, Action::File { op, .. }) => ops.is_empty() || ops.contains(op),
        (Kind::Network { ports }, Action::Network { port, .. }) => ports.is_empty() || ports.contains(port),
        _ => false,
    }
}
