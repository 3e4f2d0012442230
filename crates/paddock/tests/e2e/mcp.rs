//! MCP through the official Python SDK (`mcp` from PyPI, pinned in
//! `tests/mcp_clients/requirements-mcp.txt`, installed by `scripts/install-e2b-clients.sh`) against
//! a real `paddock serve`'s `/mcp`, in both protocol generations; the checks are in
//! `tests/mcp_clients/check_mcp.py`.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::server::Server;
use crate::support::TestEnv;

#[test]
fn python_sdk_over_streamable_http() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = workspace.join("target/e2b-clients/python-mcp/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/install-e2b-clients.sh (scripts/test.sh does)",
        python.display()
    );
    let env = TestEnv::new();
    let server = Server::start(&env, &[], "info");
    let api = server.api();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (key, other) = rt.block_on(async {
        let a = api.create_key(&server.admin_key, "mcp-a").await;
        let b = api.create_key(&server.admin_key, "mcp-b").await;
        (a, b)
    });
    let out = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_clients/check_mcp.py"))
        .env("PADDOCK_MCP_URL", format!("{}/mcp", server.url))
        .env("PADDOCK_API_KEY", key)
        .env("PADDOCK_OTHER_KEY", other)
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env("NO_PROXY", "*")
        .stdin(Stdio::null())
        .output()
        .expect("the MCP check starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the MCP Python SDK check failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("ok: legacy") && stdout.contains("ok: 2026-07-28"),
        "{stdout}"
    );
    drop(server);
    drop(env);
}
