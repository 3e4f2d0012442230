//! `/mcp`'s sessions and origins on a real server with `[mcp] max_sessions = 2`: a third session
//! of the `initialize`-based generation is refused with 503 `unavailable` while the stateless
//! generation still answers, and closing a session makes room again; a page of the server's own
//! loopback origin is answered, any other origin refused.

use serde_json::{json, Value};

use crate::support::server::Server;
use crate::support::TestEnv;

const ACCEPT: &str = "application/json, text/event-stream";

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "e2e", "version": "1"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_bounded_and_only_the_servers_own_origin_is_answered() {
    let dir = tempfile::tempdir().expect("config dir");
    let config = dir.path().join("paddock.toml");
    std::fs::write(&config, "[mcp]\nmax_sessions = 2\n").expect("config written");
    let env = TestEnv::new();
    let server = Server::start(&env, &["--config", config.to_str().expect("utf-8")], "info");
    let key = server.api().create_key(&server.admin_key, "mcp-sessions").await;
    let url = format!("{}/mcp", server.url);
    let http = reqwest::Client::builder().no_proxy().build().expect("client");
    let post = |body: Value| {
        http.post(&url)
            .bearer_auth(&key)
            .header("Accept", ACCEPT)
            .json(&body)
    };

    let mut sessions = Vec::new();
    for _ in 0..2 {
        let answer = post(initialize()).send().await.expect("initialize");
        assert_eq!(answer.status(), 200, "{:?}", answer.text().await);
        let id = answer.headers()["mcp-session-id"]
            .to_str()
            .expect("a session id")
            .to_owned();
        sessions.push(id);
    }
    let refused = post(initialize()).send().await.expect("a third initialize");
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.expect("a JSON error");
    assert_eq!(body["code"], "unavailable", "{body}");

    // The stateless generation opens no session: it still answers.
    let discover = json!({"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {"_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}}});
    let answer = post(discover)
        .header("MCP-Protocol-Version", "2026-07-28")
        .header("Mcp-Method", "server/discover")
        .send()
        .await
        .expect("discover");
    assert_eq!(answer.status(), 200, "{:?}", answer.text().await);

    // Closing one makes room for another.
    let closed = http
        .delete(&url)
        .bearer_auth(&key)
        .header("Mcp-Session-Id", &sessions[0])
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .expect("delete");
    assert!(closed.status().is_success(), "{}", closed.status());
    let again = post(initialize()).send().await.expect("initialize again");
    assert_eq!(again.status(), 200, "{:?}", again.text().await);

    // Origins: the server's own (on loopback) is answered, another is refused.
    let port = server.url.rsplit(':').next().expect("a port").to_owned();
    let own = post(json!({"jsonrpc": "2.0", "id": 3, "method": "ping"}))
        .header("Origin", format!("http://127.0.0.1:{port}"))
        .header("Mcp-Session-Id", &sessions[1])
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .expect("ping");
    assert_eq!(own.status(), 200, "{:?}", own.text().await);
    let foreign = post(json!({"jsonrpc": "2.0", "id": 4, "method": "ping"}))
        .header("Origin", "http://127.0.0.1:1")
        .header("Mcp-Session-Id", &sessions[1])
        .header("MCP-Protocol-Version", "2025-11-25")
        .send()
        .await
        .expect("ping");
    assert_eq!(foreign.status(), 403);
    drop(server);
    drop(env);
}
