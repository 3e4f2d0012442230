//! A policy as the API takes it (JSON), before it is compiled: a default verdict and ordered
//! rules, each a verdict and one matcher (an exec request, a file write or delete, a network
//! destination). Every field of a matcher that is absent matches anything.
//!
//! ```json
//! {"default": "allow", "rules": [
//!   {"verdict": "ask",  "exec": {"command": {"regex": "^git push( |$)"}}},
//!   {"verdict": "deny", "file": {"ops": ["write", "delete"], "path": {"glob": "/etc/**"}}},
//!   {"verdict": "ask",  "network": {"host": {"glob": "*.stripe.com"}, "ports": [443]}}
//! ]}
//! ```
//!
//! What it does not do: check anything (`compile` does, and refuses the whole policy on the first
//! fault), or know what the verdicts lead to (a caller holds an `ask` for a person).

use serde::{Deserialize, Serialize};

/// What a rule (or the default) says of an action, ordered from the least restrictive to the
/// most (`decide` and the control plane's gate both pick the greatest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// It goes ahead.
    Allow,
    /// It waits for a person's approval.
    Ask,
    /// It is refused.
    Deny,
}

/// A whole policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    /// The verdict when no rule matches.
    pub default: Verdict,
    /// The rules, in order.
    #[serde(default)]
    pub rules: Vec<RuleSpec>,
    /// Whether the key that asked may approve its own request. Read only from the tenant's policy
    /// (a sandbox's cannot grant it); off unless set.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub self_approval: bool,
}

/// One rule: a verdict and what it matches (exactly one of `exec`, `file`, `network`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// What it says of a matching action.
    pub verdict: Verdict,
    /// Why (shown to the person asked, and in the audit log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Matches exec requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecMatch>,
    /// Matches file-API writes and deletes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<FileMatch>,
    /// Matches network destinations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkMatch>,
}

/// A text pattern: a glob (`*` stops at `/`, `**` does not, `?`, `[a-z]`, `{a,b}`) or a regular
/// expression (Rust's syntax, unanchored unless it anchors itself). Both match the whole text for
/// a glob, anywhere in it for a regular expression.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Pattern {
    /// A glob.
    Glob(String),
    /// A regular expression.
    Regex(String),
}

/// An exec request's matcher.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecMatch {
    /// The program: matched against the path as given and, for a pattern without `/`, its last
    /// component (`git` matches `/usr/bin/git`). A shell request's program is the shell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<Pattern>,
    /// The arguments after the program, joined by single spaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Pattern>,
    /// The whole command line: the program and arguments joined by single spaces, or a shell
    /// request's script as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Pattern>,
    /// The working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<Pattern>,
    /// The user it runs as, exactly.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Whether it runs under a terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<bool>,
}

/// A file operation a rule can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileOp {
    /// Written (made, replaced, uploaded, moved to).
    Write,
    /// Removed (or moved away from).
    Delete,
}

/// A file-API matcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileMatch {
    /// The operations (both when absent).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<FileOp>,
    /// The absolute path inside the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<Pattern>,
}

/// A network destination's matcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkMatch {
    /// The host name or address as the connection names it (lowercase).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Pattern>,
    /// The ports (any when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}
