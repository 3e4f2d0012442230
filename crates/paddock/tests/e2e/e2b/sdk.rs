//! Runs the SDK suites in `crates/paddock/tests/e2b_clients/` against a real server.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::support::server::Server;
use crate::support::TestEnv;

/// The domain of per-sandbox hosts the server is configured with (`get_host` answers under it; the
/// tests send such hosts to the listener directly, no name is ever resolved).
const DOMAIN: &str = "paddock.test";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

pub(super) fn clients() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2b_clients")
}

/// A key's E2B spelling (`pdk_<id>_<secret>` → `e2b_<id><secret>`).
pub(super) fn e2b_spelling(key: &str) -> String {
    let rest = key.strip_prefix("pdk_").expect("a paddock key");
    let (id, secret) = rest.split_once('_').expect("id and secret");
    format!("e2b_{id}{secret}")
}

/// A server with the E2B front-end under [`DOMAIN`] and two tenants' keys (E2B spelling).
struct Setup {
    env: TestEnv,
    _files: tempfile::TempDir,
    server: Server,
    key: String,
    other_key: String,
}

impl Setup {
    fn start() -> Setup {
        let env = TestEnv::new();
        // Beside the state directory, never in it (the server only takes over an empty one).
        let files = tempfile::tempdir().expect("a directory for the configuration");
        let config = files.path().join("serve.toml");
        // `code-interpreter-v1` (the code interpreter SDK's default template): the host's root, whose
        // Python has the kernels (scripts/install-deps.sh).
        std::fs::write(
            &config,
            format!("[e2b]\ndomain = \"{DOMAIN}\"\n[templates.code-interpreter-v1]\nrootfs = \"host\"\n"),
        )
        .expect("write the configuration");
        let server = Server::start(&env, &["--config", config.to_str().expect("utf-8 path")], "info");
        let api = server.api();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (key, other_key) = rt.block_on(async {
            let a = api.create_key(&server.admin_key, "e2b-a").await;
            api.unlimited_quota(&server.admin_key, "e2b-a").await;
            let b = api.create_key(&server.admin_key, "e2b-b").await;
            (a, b)
        });
        Setup {
            env,
            _files: files,
            server,
            key: e2b_spelling(&key),
            other_key: e2b_spelling(&other_key),
        }
    }

    /// The environment every suite gets: the one listener as E2B's API and sandbox URL.
    fn vars(&self) -> Vec<(&'static str, String)> {
        vec![
            ("E2B_API_URL", self.server.url.clone()),
            ("E2B_SANDBOX_URL", self.server.url.clone()),
            ("E2B_DOMAIN", DOMAIN.to_owned()),
            ("E2B_API_KEY", self.key.clone()),
            ("PADDOCK_OTHER_KEY", self.other_key.clone()),
            ("NO_PROXY", "*".to_owned()),
        ]
    }

    /// After a suite: no sandbox of either tenant is left running.
    fn finish(self) {
        let Setup { env, server, .. } = self;
        drop(server);
        drop(env);
    }
}

/// Runs `cmd` with the suite's environment and fails the test with its output unless it passes.
fn run_suite(setup: &Setup, mut cmd: Command, what: &str) {
    cmd.envs(setup.vars())
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .stdin(Stdio::null());
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} did not start: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}\n{stderr}");
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

fn python_suite(venv: &str) {
    python_file(venv, "test_sdk.py");
}

fn python_file(venv: &str, file: &str) {
    let python = workspace()
        .join("target/e2b-clients")
        .join(venv)
        .join("bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/install-e2b-clients.sh (scripts/test.sh does)",
        python.display()
    );
    let setup = Setup::start();
    let mut cmd = Command::new(python);
    cmd.current_dir(clients().join("python")).args([
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rfE",
        "--maxfail=50",
        file,
    ]);
    run_suite(&setup, cmd, &format!("the E2B Python SDK suite ({venv})"));
    setup.finish();
}

#[test]
fn python_sdk_newest() {
    python_suite("python-newest");
}

#[test]
fn python_code_interpreter_sdk() {
    python_file("python-interpreter", "test_code_interpreter.py");
}

#[test]
fn python_sdk_2_45() {
    python_suite("python-2.45");
}

fn js_file(package: &str, file: &str, what: &str) {
    let dir = clients().join("js");
    assert!(
        dir.join("node_modules").join(package).exists(),
        "{} has no node_modules/{package}: run scripts/install-e2b-clients.sh (scripts/test.sh does)",
        dir.display()
    );
    let setup = Setup::start();
    let mut cmd = Command::new("node");
    cmd.current_dir(&dir)
        .args(["--test", "--test-concurrency=1", file]);
    run_suite(&setup, cmd, what);
    setup.finish();
}

#[test]
fn js_sdk_newest() {
    js_file("e2b", "sdk.test.mjs", "the E2B JavaScript SDK suite");
}

#[test]
fn js_code_interpreter_sdk() {
    js_file(
        "@e2b/code-interpreter",
        "code_interpreter.test.mjs",
        "the E2B code interpreter JavaScript SDK suite",
    );
}
