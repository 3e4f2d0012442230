//! MCP through the official Python SDK (`mcp` from PyPI, pinned in
//! `tests/mcp_clients/requirements-mcp.txt`, installed by `scripts/install-e2b-clients.sh`) in both
//! protocol generations: against a real `paddock serve`'s `/mcp`, and `paddock mcp` on stdio
//! (relayed to a server, and with its own `--local` service); the checks are in
//! `tests/mcp_clients/check_mcp.py`. The other clients and transports are in their own modules.

mod code;
mod npm_clients;
mod sessions;

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::server::Server;
use crate::support::TestEnv;

/// Runs `check_mcp.py` over `transport` with `vars`; returns its stdout once it passed.
fn check(transport: &str, vars: &[(&str, &str)]) -> String {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = workspace.join("target/e2b-clients/python-mcp/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/install-e2b-clients.sh (scripts/test.sh does)",
        python.display()
    );
    let out = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_clients/check_mcp.py"))
        .arg(transport)
        .envs(vars.iter().copied())
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env("NO_PROXY", "*")
        .stdin(Stdio::null())
        .output()
        .expect("the MCP check starts");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the MCP Python SDK check over {transport} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("ok: legacy") && stdout.contains("ok: 2026-07-28"),
        "{stdout}"
    );
    stdout
}

/// Two tenants' keys on `server`.
fn two_keys(server: &Server) -> (String, String) {
    let api = server.api();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let a = api.create_key(&server.admin_key, "mcp-a").await;
        let b = api.create_key(&server.admin_key, "mcp-b").await;
        (a, b)
    })
}

#[test]
fn python_sdk_over_streamable_http() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let (key, other) = two_keys(&server);
    let url = format!("{}/mcp", server.url);
    let out = check(
        "http",
        &[
            ("PADDOCK_MCP_URL", &url),
            ("PADDOCK_API_KEY", &key),
            ("PADDOCK_OTHER_KEY", &other),
        ],
    );
    assert!(out.contains("ok: refusals"), "{out}");
    drop(server);
    drop(env);
}

/// `paddock mcp` on stdio, relaying to a server's `/mcp` with the client's key.
#[test]
fn python_sdk_over_stdio_relayed_to_a_server() {
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let (key, other) = two_keys(&server);
    let bin = env.cmd().get_program().to_string_lossy().into_owned();
    check(
        "stdio",
        &[
            ("PADDOCK_BIN", &bin),
            ("PADDOCK_URL", &server.url),
            ("PADDOCK_API_KEY", &key),
            ("PADDOCK_OTHER_KEY", &other),
        ],
    );
    drop(server);
    drop(env);
}

/// `paddock mcp --local` on stdio: the service in the process itself, its sandboxes removed when
/// the client disconnects.
#[test]
fn python_sdk_over_stdio_with_a_local_service() {
    let env = TestEnv::new();
    let cmd = env.cmd();
    let mut vars: Vec<(String, String)> = cmd
        .get_envs()
        .filter_map(|(k, v)| {
            Some((
                k.to_string_lossy().into_owned(),
                v?.to_string_lossy().into_owned(),
            ))
        })
        .collect();
    vars.push((
        "PADDOCK_BIN".into(),
        cmd.get_program().to_string_lossy().into_owned(),
    ));
    let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let out = check("local", &vars);
    assert!(out.contains("ok: left behind"), "{out}");
    env.assert_clean();
    drop(env);
}
