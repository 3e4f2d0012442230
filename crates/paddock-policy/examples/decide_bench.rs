//! `decide()` over a policy of 1,000 rules (issue 17's figure: at most 20 µs at p50 for an allowed
//! exec). Run by `bench/policy.sh`: `cargo run --release -p paddock-policy --example decide_bench`.
//!
//! The policy: 1,000 rules of every kind and pattern sort (program globs, command and argument
//! regular expressions, working-directory globs, users, file paths, network hosts), the last one
//! an allow rule for the exec measured, so every exec rule is considered. Prints p50, p99 and the
//! mean of 20,000 timed calls each, as JSON.

use std::time::Instant;

use paddock_policy::{compile, decide, Action, ExecAction, FileOp, PolicySpec, Verdict};
use serde_json::json;

fn policy() -> PolicySpec {
    let mut rules = Vec::new();
    for i in 0..999 {
        let rule = match i % 6 {
            0 => {
                json!({"verdict": "ask", "exec": {"command": {"regex": format!("^tool{i} (deploy|push)( |$)")}}})
            }
            1 => json!({"verdict": "deny", "exec": {"program": {"glob": format!("/opt/bin{i}/*")}}}),
            2 => {
                json!({"verdict": "ask", "exec": {"program": {"glob": format!("cli{i}")}, "args": {"regex": format!("--env[= ]prod{i}")}}})
            }
            3 => {
                json!({"verdict": "ask", "exec": {"cwd": {"glob": format!("/srv/app{i}/**")}, "user": "root"}})
            }
            4 => {
                json!({"verdict": "deny", "file": {"ops": ["delete"], "path": {"glob": format!("/data/{i}/**")}}})
            }
            _ => {
                json!({"verdict": "ask", "network": {"host": {"glob": format!("*.host{i}.example")}, "ports": [443]}})
            }
        };
        rules.push(rule);
    }
    rules.push(json!({"verdict": "allow", "exec": {"program": {"glob": "python3"}}}));
    serde_json::from_value(json!({"default": "ask", "rules": rules})).expect("the policy")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn time(calls: usize, mut f: impl FnMut()) -> (f64, f64, f64) {
    for _ in 0..1000 {
        f();
    }
    let mut ns: Vec<f64> = (0..calls)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_nanos() as f64
        })
        .collect();
    ns.sort_by(f64::total_cmp);
    let mean = ns.iter().sum::<f64>() / ns.len() as f64;
    (
        percentile(&ns, 0.5) / 1000.0,
        percentile(&ns, 0.99) / 1000.0,
        mean / 1000.0,
    )
}

fn main() {
    let started = Instant::now();
    let compiled = compile(policy()).expect("compiles");
    let compile_ms = started.elapsed().as_secs_f64() * 1000.0;
    let allowed = Action::Exec(ExecAction {
        program: "/usr/bin/python3",
        args: "-m pytest -q tests/test_calc.py",
        command: "/usr/bin/python3 -m pytest -q tests/test_calc.py",
        cwd: "/home/user/project",
        user: "user",
        pty: false,
    });
    assert_eq!(decide(&compiled, &allowed).verdict, Verdict::Allow);
    let asked = Action::Exec(ExecAction {
        program: "tool500",
        args: "deploy now",
        command: "tool500 deploy now",
        cwd: "/home/user",
        user: "user",
        pty: false,
    });
    assert_eq!(decide(&compiled, &asked).verdict, Verdict::Ask);
    let file = Action::File {
        op: FileOp::Delete,
        path: "/data/4/x/y",
    };
    assert_eq!(decide(&compiled, &file).verdict, Verdict::Deny);
    let calls = 20_000;
    let mut report = serde_json::Map::new();
    for (name, action) in [
        ("allowed_exec", allowed),
        ("asked_exec", asked),
        ("denied_file_delete", file),
    ] {
        let (p50, p99, mean) = time(calls, || {
            std::hint::black_box(decide(&compiled, std::hint::black_box(&action)));
        });
        report.insert(
            name.to_owned(),
            json!({"p50_us": (p50 * 1000.0).round() / 1000.0, "p99_us": (p99 * 1000.0).round() / 1000.0,
                   "mean_us": (mean * 1000.0).round() / 1000.0, "calls": calls}),
        );
    }
    report.insert("rules".to_owned(), json!(compiled.len()));
    report.insert("compile_ms".to_owned(), json!((compile_ms * 10.0).round() / 10.0));
    report.insert("target_allowed_exec_p50_us".to_owned(), json!(20));
    println!("{}", serde_json::to_string_pretty(&report).expect("json"));
}
