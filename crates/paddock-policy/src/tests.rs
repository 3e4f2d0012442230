//! `compile` and `decide`: examples, refusals that name the rule and field, and properties against
//! a reference that matches rule by rule with a regular expression of its own (the compiled sets
//! must agree with it), built from small fixed alphabets so that failures shrink to a few rules.

use proptest::prelude::*;
use regex::bytes::Regex;
use serde_json::json;

use crate::spec::{ExecMatch, FileMatch, NetworkMatch};
use crate::*;

fn policy(value: serde_json::Value) -> Policy {
    compile(serde_json::from_value(value).expect("a policy")).expect("compiles")
}

fn exec<'a>(program: &'a str, args: &'a str, command: &'a str) -> Action<'a> {
    Action::Exec(ExecAction {
        program,
        args,
        command,
        cwd: "/home/user",
        user: "user",
        pty: false,
    })
}

#[test]
fn the_most_restrictive_match_wins_and_its_first_rule_is_reported() {
    let p = policy(json!({"default": "allow", "rules": [
        {"verdict": "allow", "exec": {"program": {"glob": "git"}}},
        {"verdict": "ask", "reason": "pushes leave the sandbox", "exec": {"command": {"regex": "^git push( |$)"}}},
        {"verdict": "deny", "exec": {"command": {"regex": "--force"}}},
        {"verdict": "ask", "exec": {"program": {"glob": "/usr/bin/*"}, "args": {"glob": "push*"}}},
        {"verdict": "deny", "file": {"ops": ["delete"], "path": {"glob": "/etc/**"}}},
        {"verdict": "ask", "network": {"host": {"glob": "*.stripe.com"}, "ports": [443]}},
    ]}));
    let d = decide(&p, &exec("git", "status", "git status"));
    assert_eq!((d.verdict, d.rule), (Verdict::Allow, Some(0)));
    let d = decide(
        &p,
        &exec("/usr/bin/git", "push origin", "/usr/bin/git push origin"),
    );
    assert_eq!(
        (d.verdict, d.rule),
        (Verdict::Ask, Some(3)),
        "the basename rule allows, the path rule asks"
    );
    let d = decide(&p, &exec("git", "push origin", "git push origin"));
    assert_eq!(
        (d.verdict, d.rule, d.reason),
        (Verdict::Ask, Some(1), Some("pushes leave the sandbox"))
    );
    let d = decide(&p, &exec("git", "push --force", "git push --force"));
    assert_eq!(
        (d.verdict, d.rule),
        (Verdict::Deny, Some(2)),
        "deny beats the earlier allow and ask"
    );
    let d = decide(
        &p,
        &Action::File {
            op: FileOp::Delete,
            path: "/etc/passwd",
        },
    );
    assert_eq!(d.verdict, Verdict::Deny);
    let d = decide(
        &p,
        &Action::File {
            op: FileOp::Write,
            path: "/etc/passwd",
        },
    );
    assert_eq!(
        (d.verdict, d.rule),
        (Verdict::Allow, None),
        "only deletes are named"
    );
    let d = decide(
        &p,
        &Action::File {
            op: FileOp::Delete,
            path: "/etcetera/x",
        },
    );
    assert_eq!(d.verdict, Verdict::Allow, "a glob matches the whole path");
    let d = decide(
        &p,
        &Action::Network {
            host: "api.stripe.com",
            port: 443,
        },
    );
    assert_eq!((d.verdict, d.rule), (Verdict::Ask, Some(5)));
    let d = decide(
        &p,
        &Action::Network {
            host: "api.stripe.com",
            port: 80,
        },
    );
    assert_eq!((d.verdict, d.rule), (Verdict::Allow, None));
    let d = decide(
        &p,
        &Action::Network {
            host: "a.b.stripe.com",
            port: 443,
        },
    );
    assert_eq!(
        d.verdict,
        Verdict::Ask,
        "a glob's * stops only at /, not at a dot"
    );
}

#[test]
fn users_terminals_and_an_empty_policy() {
    let p = policy(json!({"default": "deny", "rules": [
        {"verdict": "allow", "exec": {"user": "user", "pty": true}},
    ]}));
    let mut e = ExecAction {
        program: "sh",
        args: "",
        command: "sh",
        cwd: "/",
        user: "user",
        pty: true,
    };
    assert_eq!(decide(&p, &Action::Exec(e)).verdict, Verdict::Allow);
    e.pty = false;
    assert_eq!(decide(&p, &Action::Exec(e)).verdict, Verdict::Deny);
    e.pty = true;
    e.user = "root";
    assert_eq!(decide(&p, &Action::Exec(e)).verdict, Verdict::Deny);
    let empty = policy(json!({"default": "ask"}));
    assert!(empty.is_empty());
    assert_eq!(
        decide(&empty, &Action::Network { host: "x", port: 1 }).verdict,
        Verdict::Ask
    );
}

#[test]
fn a_faulty_policy_is_refused_whole_naming_the_rule_and_field() {
    let cases = [
        (
            json!({"default": "allow", "rules": [{"verdict": "ask"}]}),
            "rules[0]",
        ),
        (
            json!({"default": "allow", "rules": [{"verdict": "ask", "exec": {}, "file": {}}]}),
            "rules[0]",
        ),
        (
            json!({"default": "allow", "rules": [
                {"verdict": "ask", "exec": {"program": {"glob": "ok"}}},
                {"verdict": "deny", "exec": {"args": {"regex": "(unclosed"}}}]}),
            "rules[1].exec.args",
        ),
        (
            json!({"default": "allow", "rules": [{"verdict": "deny", "file": {"path": {"glob": "[z-a]"}}}]}),
            "rules[0].file.path",
        ),
        (
            json!({"default": "allow", "rules": [{"verdict": "deny", "network": {"host": {"glob": ""}}}]}),
            "rules[0].network.host",
        ),
        (
            json!({"default": "allow", "rules": [{"verdict": "deny", "network": {"ports": [0]}}]}),
            "rules[0].network.ports",
        ),
        (
            json!({"default": "allow", "rules": [{"verdict": "deny", "exec": {"command": {"regex": "a{1000}{1000}"}}}]}),
            "rules[0].exec.command",
        ),
    ];
    for (spec, field) in cases {
        let spec: PolicySpec = serde_json::from_value(spec.clone()).expect("parses");
        let e = compile(spec).expect_err("refused");
        assert_eq!(e.field, field, "{e}");
    }
    let too_many = PolicySpec {
        default: Verdict::Allow,
        rules: vec![
            RuleSpec {
                verdict: Verdict::Ask,
                reason: None,
                exec: Some(ExecMatch::default()),
                file: None,
                network: None,
            };
            MAX_RULES + 1
        ],
        self_approval: false,
    };
    assert_eq!(compile(too_many).expect_err("refused").field, "rules");
    for unknown in [
        json!({"default": "maybe"}),
        json!({"default": "allow", "rules": [{"verdict": "ask", "exec": {"progam": {"glob": "x"}}}]}),
        json!({"default": "allow", "extra": 1}),
    ] {
        assert!(serde_json::from_value::<PolicySpec>(unknown).is_err());
    }
}

// Properties, against a reference that matches each rule with regular expressions of its own.

const VERDICTS: [Verdict; 3] = [Verdict::Allow, Verdict::Ask, Verdict::Deny];
const PROGRAMS: [&str; 4] = ["git", "/usr/bin/git", "curl", "/bin/sh"];
const ARGS: [&str; 4] = ["", "push origin", "status", "-c echo hi"];
const PATHS: [&str; 4] = [
    "/etc/passwd",
    "/home/user/a.txt",
    "/home/user/sub/b.txt",
    "/tmp/x",
];
const HOSTS: [&str; 3] = ["api.stripe.com", "example.test", "10.0.0.1"];
const PORTS: [u16; 3] = [80, 443, 8080];
const PROGRAM_PATTERNS: [&str; 4] = ["git", "/usr/bin/*", "*", "c?rl"];
const TEXT_PATTERNS: [(&str, bool); 5] = [
    ("push*", true),
    ("^push", false),
    ("status", false),
    ("*", true),
    ("-c *", true),
];
const PATH_PATTERNS: [&str; 4] = ["/etc/**", "/home/user/*", "/home/**/*.txt", "/tmp/?"];
const HOST_PATTERNS: [&str; 3] = ["*.stripe.com", "example.*", "10.*"];

fn pattern((text, glob): (&str, bool)) -> Pattern {
    if glob {
        Pattern::Glob(text.to_owned())
    } else {
        Pattern::Regex(text.to_owned())
    }
}

/// A rule from small indices (shrinks toward the first entries).
fn rule(kind: usize, verdict: usize, a: usize, b: usize, c: Option<usize>) -> RuleSpec {
    let mut r = RuleSpec {
        verdict: VERDICTS[verdict % 3],
        reason: None,
        exec: None,
        file: None,
        network: None,
    };
    match kind % 3 {
        0 => {
            r.exec = Some(ExecMatch {
                program: c.map(|_| Pattern::Glob(PROGRAM_PATTERNS[a % 4].to_owned())),
                args: Some(pattern(TEXT_PATTERNS[b % 5])),
                ..ExecMatch::default()
            })
        }
        1 => {
            r.file = Some(FileMatch {
                ops: c
                    .map(|o| vec![[FileOp::Write, FileOp::Delete][o % 2]])
                    .unwrap_or_default(),
                path: Some(Pattern::Glob(PATH_PATTERNS[a % 4].to_owned())),
            })
        }
        _ => {
            r.network = Some(NetworkMatch {
                host: Some(Pattern::Glob(HOST_PATTERNS[a % 3].to_owned())),
                ports: c.map(|p| vec![PORTS[p % 3]]).unwrap_or_default(),
            })
        }
    }
    r
}

/// One pattern's own regular expression, as the reference matches it.
fn own(p: &Pattern) -> Regex {
    let source = match p {
        Pattern::Glob(g) => globset::GlobBuilder::new(g)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .expect("glob")
            .regex()
            .to_owned(),
        Pattern::Regex(r) => r.clone(),
    };
    Regex::new(&source).expect("regex")
}

fn reference_matches(r: &RuleSpec, action: &Action<'_>) -> bool {
    let m = |p: &Option<Pattern>, text: &str| p.as_ref().is_none_or(|p| own(p).is_match(text.as_bytes()));
    match (action, &r.exec, &r.file, &r.network) {
        (Action::Exec(e), Some(x), None, None) => {
            let program_ok = x.program.as_ref().is_none_or(|p| {
                let text = match p {
                    Pattern::Glob(t) | Pattern::Regex(t) => t,
                };
                let subject = if text.contains('/') {
                    e.program
                } else {
                    e.program.rsplit('/').next().unwrap_or("")
                };
                own(p).is_match(subject.as_bytes())
            });
            program_ok
                && m(&x.args, e.args)
                && m(&x.command, e.command)
                && m(&x.cwd, e.cwd)
                && x.user.as_deref().is_none_or(|u| u == e.user)
                && x.pty.is_none_or(|t| t == e.pty)
        }
        (Action::File { op, path }, None, Some(f), None) => {
            (f.ops.is_empty() || f.ops.contains(op)) && m(&f.path, path)
        }
        (Action::Network { host, port }, None, None, Some(n)) => {
            (n.ports.is_empty() || n.ports.contains(port)) && m(&n.host, host)
        }
        _ => false,
    }
}

/// The reference decision: the most restrictive matching verdict, its first rule; else default.
fn reference(spec: &PolicySpec, action: &Action<'_>) -> (Verdict, Option<usize>) {
    let mut best: Option<(Verdict, usize)> = None;
    for (i, r) in spec.rules.iter().enumerate() {
        if reference_matches(r, action) && best.is_none_or(|(v, _)| r.verdict > v) {
            best = Some((r.verdict, i));
        }
    }
    best.map_or((spec.default, None), |(v, i)| (v, Some(i)))
}

fn action(kind: usize, a: usize, b: usize, c: usize) -> Action<'static> {
    match kind % 3 {
        0 => Action::Exec(ExecAction {
            program: PROGRAMS[a % 4],
            args: ARGS[b % 4],
            command: ARGS[b % 4],
            cwd: "/home/user",
            user: "user",
            pty: false,
        }),
        1 => Action::File {
            op: [FileOp::Write, FileOp::Delete][c % 2],
            path: PATHS[a % 4],
        },
        _ => Action::Network {
            host: HOSTS[a % 3],
            port: PORTS[c % 3],
        },
    }
}

type RuleIndices = (usize, usize, usize, usize, Option<usize>);

fn rules_strategy() -> impl Strategy<Value = Vec<RuleIndices>> {
    proptest::collection::vec(
        (
            0..3usize,
            0..3usize,
            0..5usize,
            0..5usize,
            proptest::option::of(0..3usize),
        ),
        0..12,
    )
}

fn spec_of(default: usize, rules: &[RuleIndices]) -> PolicySpec {
    PolicySpec {
        default: VERDICTS[default % 3],
        rules: rules.iter().map(|&(k, v, a, b, c)| rule(k, v, a, b, c)).collect(),
        self_approval: false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The compiled sets decide as matching each rule on its own does.
    #[test]
    fn decide_agrees_with_the_rule_by_rule_reference(
        default in 0..3usize,
        rules in rules_strategy(),
        (kind, a, b, c) in (0..3usize, 0..5usize, 0..5usize, 0..3usize),
    ) {
        let spec = spec_of(default, &rules);
        let compiled = compile(spec.clone()).expect("compiles");
        let act = action(kind, a, b, c);
        let d = decide(&compiled, &act);
        prop_assert_eq!((d.verdict, d.rule), reference(&spec, &act));
    }

    /// A matching deny rule decides, wherever allow rules stand; adding an allow rule never
    /// loosens a decision; with no matching rule the default decides.
    #[test]
    fn deny_beats_allow_and_allow_rules_never_loosen(
        default in 0..3usize,
        rules in rules_strategy(),
        extra in (0..3usize, 0..5usize, 0..5usize, proptest::option::of(0..3usize)),
        at in 0..13usize,
        (kind, a, b, c) in (0..3usize, 0..5usize, 0..5usize, 0..3usize),
    ) {
        let spec = spec_of(default, &rules);
        let compiled = compile(spec.clone()).expect("compiles");
        let act = action(kind, a, b, c);
        let before = decide(&compiled, &act);
        if spec.rules.iter().any(|r| r.verdict == Verdict::Deny && reference_matches(r, &act)) {
            prop_assert_eq!(before.verdict, Verdict::Deny);
        }
        if !spec.rules.iter().any(|r| reference_matches(r, &act)) {
            prop_assert_eq!((before.verdict, before.rule), (spec.default, None));
        }
        let mut more = spec.clone();
        let (k, x, y, z) = extra;
        more.rules.insert(at.min(more.rules.len()), rule(k, 0, x, y, z));
        let loosened = compile(more).expect("compiles");
        let after = decide(&loosened, &act);
        if before.rule.is_some() {
            prop_assert!(after.verdict >= before.verdict, "{:?} -> {:?}", before, after);
        }
    }
}
