//! A [`PolicySpec`] checked and compiled into a [`Policy`]: every pattern of one field across all
//! rules becomes one set matched in a single pass (so deciding over a thousand rules costs a few
//! set scans, not a thousand matches), and each rule keeps the index of its pattern in each set.
//!
//! A policy is compiled whole or not at all: the first fault (a pattern that does not parse or is
//! too large, a rule with no matcher or two, too many rules) refuses it, naming the rule and field.
//!
//! What it does not do: decide (`decide.rs`), or store or apply a policy.

use regex::bytes::{RegexBuilder, RegexSet, RegexSetBuilder};

use crate::spec::{ExecMatch, FileOp, Pattern, PolicySpec, RuleSpec, Verdict};

/// The most rules a policy may have.
pub const MAX_RULES: usize = 4096;
/// The longest pattern (bytes of its source).
pub const MAX_PATTERN_LEN: usize = 4096;
/// The longest reason.
pub const MAX_REASON_LEN: usize = 1024;
/// The most memory one compiled pattern may take (the `regex` crate's size limit).
const PATTERN_SIZE_LIMIT: usize = 1 << 20;
/// The most memory one field's set may take, and its lazy DFA's cache.
const SET_SIZE_LIMIT: usize = 64 << 20;

/// Why a policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyError {
    /// Where (`rules[3].exec.args`, `rules`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn fault(field: impl Into<String>, message: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.into(),
        message: message.into(),
    }
}

/// The fields a pattern can constrain, each with its own set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    /// `exec.program` with a `/`: matched against the path as given.
    ProgramPath,
    /// `exec.program` without a `/`: matched against the path's last component.
    ProgramName,
    ExecArgs,
    ExecCommand,
    ExecCwd,
    FilePath,
    NetworkHost,
}

pub(crate) const FIELDS: usize = 7;

impl Field {
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What kind of action a rule matches, with its fields that are not patterns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    Exec { user: Option<String>, pty: Option<bool> },
    File { ops: Vec<FileOp> },
    Network { ports: Vec<u16> },
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub(crate) verdict: Verdict,
    pub(crate) reason: Option<String>,
    pub(crate) kind: Kind,
    /// For each field, the index of this rule's pattern in that field's set (`None`: any).
    pub(crate) patterns: [Option<usize>; FIELDS],
}

/// A compiled policy: what [`crate::decide`] reads.
#[derive(Debug, Clone)]
pub struct Policy {
    pub(crate) default: Verdict,
    pub(crate) rules: Vec<Rule>,
    /// One set per field (`None` when no rule constrains it).
    pub(crate) sets: [Option<RegexSet>; FIELDS],
    /// The rules of each kind, in order: exec, file, network.
    pub(crate) by_kind: [Vec<usize>; 3],
    spec: PolicySpec,
}

impl Policy {
    /// The policy as it was given.
    pub fn spec(&self) -> &PolicySpec {
        &self.spec
    }

    /// Its default verdict.
    pub fn default_verdict(&self) -> Verdict {
        self.default
    }

    /// How many rules it has.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether it has no rules (everything gets the default).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// A pattern's source as a regular expression: a glob's translation (anchored, `*` not crossing
/// `/`), or the regular expression as given.
fn regex_source(pattern: &Pattern, field: &str) -> Result<String, PolicyError> {
    let text = match pattern {
        Pattern::Glob(g) | Pattern::Regex(g) => g,
    };
    if text.is_empty() {
        return Err(fault(field, "an empty pattern"));
    }
    if text.len() > MAX_PATTERN_LEN {
        return Err(fault(
            field,
            format!("a pattern is at most {MAX_PATTERN_LEN} bytes"),
        ));
    }
    let source = match pattern {
        Pattern::Glob(glob) => globset::GlobBuilder::new(glob)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| fault(field, format!("not a glob: {e}")))?
            .regex()
            .to_owned(),
        Pattern::Regex(regex) => regex.clone(),
    };
    RegexBuilder::new(&source)
        .size_limit(PATTERN_SIZE_LIMIT)
        .build()
        .map_err(|e| fault(field, format!("not a usable pattern: {e}")))?;
    Ok(source)
}

/// Collects each field's pattern sources as the rules are read.
#[derive(Default)]
struct Sources([Vec<String>; FIELDS]);

impl Sources {
    fn add(&mut self, field: Field, source: String) -> usize {
        let list = &mut self.0[field.index()];
        list.push(source);
        list.len() - 1
    }
}

fn exec_patterns(
    m: &ExecMatch,
    at: &str,
    sources: &mut Sources,
    patterns: &mut [Option<usize>; FIELDS],
) -> Result<(), PolicyError> {
    if let Some(program) = &m.program {
        let text = match program {
            Pattern::Glob(t) | Pattern::Regex(t) => t,
        };
        let field = if text.contains('/') {
            Field::ProgramPath
        } else {
            Field::ProgramName
        };
        let source = regex_source(program, &format!("{at}.exec.program"))?;
        patterns[field.index()] = Some(sources.add(field, source));
    }
    for (pattern, field, name) in [
        (&m.args, Field::ExecArgs, "args"),
        (&m.command, Field::ExecCommand, "command"),
        (&m.cwd, Field::ExecCwd, "cwd"),
    ] {
        if let Some(pattern) = pattern {
            let source = regex_source(pattern, &format!("{at}.exec.{name}"))?;
            patterns[field.index()] = Some(sources.add(field, source));
        }
    }
    Ok(())
}

fn compile_rule(i: usize, spec: &RuleSpec, sources: &mut Sources) -> Result<Rule, PolicyError> {
    let at = format!("rules[{i}]");
    if spec.reason.as_ref().is_some_and(|r| r.len() > MAX_REASON_LEN) {
        return Err(fault(
            format!("{at}.reason"),
            format!("at most {MAX_REASON_LEN} bytes"),
        ));
    }
    let mut patterns = [None; FIELDS];
    let kind = match (&spec.exec, &spec.file, &spec.network) {
        (Some(m), None, None) => {
            exec_patterns(m, &at, sources, &mut patterns)?;
            if m.user.as_ref().is_some_and(String::is_empty) {
                return Err(fault(format!("{at}.exec.user"), "an empty user name"));
            }
            Kind::Exec {
                user: m.user.clone(),
                pty: m.pty,
            }
        }
        (None, Some(m), None) => {
            if let Some(path) = &m.path {
                let source = regex_source(path, &format!("{at}.file.path"))?;
                patterns[Field::FilePath.index()] = Some(sources.add(Field::FilePath, source));
            }
            Kind::File { ops: m.ops.clone() }
        }
        (None, None, Some(m)) => {
            if let Some(host) = &m.host {
                let source = regex_source(host, &format!("{at}.network.host"))?;
                patterns[Field::NetworkHost.index()] = Some(sources.add(Field::NetworkHost, source));
            }
            if m.ports.contains(&0) {
                return Err(fault(format!("{at}.network.ports"), "port 0 is no port"));
            }
            Kind::Network {
                ports: m.ports.clone(),
            }
        }
        (None, None, None) => return Err(fault(at, "a rule needs one of exec, file or network")),
        _ => return Err(fault(at, "a rule has one of exec, file or network, not several")),
    };
    Ok(Rule {
        verdict: spec.verdict,
        reason: spec.reason.clone(),
        kind,
        patterns,
    })
}

/// Checks and compiles `spec`; the first fault refuses it whole.
pub fn compile(spec: PolicySpec) -> Result<Policy, PolicyError> {
    if spec.rules.len() > MAX_RULES {
        return Err(fault("rules", format!("at most {MAX_RULES} rules")));
    }
    let mut sources = Sources::default();
    let mut rules = Vec::with_capacity(spec.rules.len());
    let mut by_kind: [Vec<usize>; 3] = Default::default();
    for (i, rule) in spec.rules.iter().enumerate() {
        let rule = compile_rule(i, rule, &mut sources)?;
        let kind = match rule.kind {
            Kind::Exec { .. } => 0,
            Kind::File { .. } => 1,
            Kind::Network { .. } => 2,
        };
        by_kind[kind].push(i);
        rules.push(rule);
    }
    let mut sets: [Option<RegexSet>; FIELDS] = Default::default();
    for (set, sources) in sets.iter_mut().zip(sources.0) {
        if sources.is_empty() {
            continue;
        }
        let built = RegexSetBuilder::new(&sources)
            .size_limit(SET_SIZE_LIMIT)
            .dfa_size_limit(SET_SIZE_LIMIT)
            .build()
            .map_err(|e| fault("rules", format!("the patterns together are too large: {e}")))?;
        *set = Some(built);
    }
    Ok(Policy {
        default: spec.default,
        rules,
        sets,
        by_kind,
        spec,
    })
}
