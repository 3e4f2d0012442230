//! Limits through MCP: a sandbox's lifetime is enforced (one made with a short `timeout_secs` ends
//! by itself; one past the server's maximum is refused), and so are the resource limits the
//! server allows.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{call, connect, failed, service, structured};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_ends_at_its_timeout_and_one_past_the_maximum_is_refused() {
    let (service, a, _) = service().await;
    let client = connect(&service, a).await;
    let too_long = failed(&call(&client, "sandbox_create", json!({"timeout_secs": 25 * 3600})).await);
    assert!(too_long.starts_with("invalid_request:"), "{too_long}");
    let listed = structured(&call(&client, "sandbox_list", json!({})).await);
    assert_eq!(listed["sandboxes"], json!([]), "nothing was made: {listed}");

    let created = structured(&call(&client, "sandbox_create", json!({"timeout_secs": 1})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    // The reaper ends it; each look is paced, the deadline only a safety net.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ended = loop {
        let info = structured(&call(&client, "sandbox_info", json!({"sandbox_id": id})).await);
        if info["state"] != "running" {
            break info;
        }
        assert!(
            Instant::now() < deadline,
            "still running a minute after its timeout: {info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(ended["ended_at"].is_string(), "{ended}");
    let gone = failed(
        &call(
            &client,
            "run_command",
            json!({"sandbox_id": id, "command": "true"}),
        )
        .await,
    );
    assert!(
        gone.starts_with("sandbox_not_running:") || gone.starts_with("sandbox_not_found:"),
        "{gone}"
    );
    client.cancel().await.expect("closed");
    service.shutdown().await;
}
