//! The MCP tools through a real MCP client (rmcp's, over an in-memory duplex transport) against the
//! service on the fake backend: the tool list with its schemas and annotations, each tool's
//! structured result, a command's non-zero exit as data, failures as `isError` with the service's
//! code, and tenancy (another key's sandbox is not there).

mod support;
// Other tools, one module each (they share `support`).
mod approvals;
mod calls;
mod code;
mod files;
mod limits;
mod network;
mod ports;
mod processes;
mod resources;
mod snapshots;

use serde_json::json;
use support::{call, connect, failed, service, structured, TOOLS};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_drive_a_sandbox_and_report_failures_as_tool_errors() {
    let (service, a, b) = service().await;
    let client = connect(&service, a).await;
    let info = client.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|s| s.name.as_str()),
        Some("paddock")
    );
    assert!(info
        .instructions
        .as_deref()
        .is_some_and(|i| i.contains("sandbox_create")));

    // The tools, each with an output schema; annotations mark the read-only and destructive ones.
    let tools = client.list_all_tools().await.expect("tools");
    let mut names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(names, TOOLS);
    for tool in &tools {
        assert!(tool.output_schema.is_some(), "{} has no output schema", tool.name);
        assert!(
            tool.description.as_deref().is_some_and(|d| d.len() > 20),
            "{}",
            tool.name
        );
    }
    let hint = |name: &str| {
        let t = tools.iter().find(|t| t.name == name).expect("tool");
        let a = t.annotations.clone().expect("annotations");
        (a.read_only_hint, a.destructive_hint)
    };
    assert_eq!(hint("sandbox_list").0, Some(true));
    assert_eq!(hint("file_read").0, Some(true));
    assert_eq!(hint("sandbox_kill").1, Some(true));

    // Create: a running sandbox with the default lifetime.
    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    assert_eq!(created["state"], "running", "{created}");
    assert!(created["expires_at"].is_string(), "{created}");
    let listed = structured(&call(&client, "sandbox_list", json!({})).await);
    assert_eq!(listed["sandboxes"][0]["sandbox_id"], id.as_str(), "{listed}");

    // A command: its output, and a non-zero exit as data.
    let ran = structured(
        &call(
            &client,
            "run_command",
            json!({"sandbox_id": id, "command": "echo hi; echo oops >&2; exit 3"}),
        )
        .await,
    );
    assert_eq!(
        (
            ran["exit_code"].as_i64(),
            ran["stdout"].as_str(),
            ran["stderr"].as_str(),
            ran["truncated"].as_bool()
        ),
        (Some(3), Some("hi\n"), Some("oops\n"), Some(false)),
        "{ran}"
    );
    let bad = failed(
        &call(
            &client,
            "run_command",
            json!({"sandbox_id": id, "command": "true", "timeout_secs": 0}),
        )
        .await,
    );
    assert!(bad.starts_with("invalid_request:"), "{bad}");

    // Files: written (parents made), read back; a missing one is a tool error with its code.
    let written = structured(
        &call(
            &client,
            "file_write",
            json!({"sandbox_id": id, "path": "/home/user/p/a.txt", "content": "héllo\n"}),
        )
        .await,
    );
    assert_eq!(written["bytes"], 7, "{written}");
    let read = structured(
        &call(
            &client,
            "file_read",
            json!({"sandbox_id": id, "path": "/home/user/p/a.txt"}),
        )
        .await,
    );
    assert_eq!(
        (read["content"].as_str(), read["encoding"].as_str()),
        (Some("héllo\n"), Some("utf-8")),
        "{read}"
    );
    let missing = failed(&call(&client, "file_read", json!({"sandbox_id": id, "path": "/nope"})).await);
    assert!(missing.starts_with("file_not_found:"), "{missing}");
    let seen = structured(
        &call(
            &client,
            "run_command",
            json!({"sandbox_id": id, "command": "cat /home/user/p/a.txt"}),
        )
        .await,
    );
    assert_eq!(seen["stdout"], "héllo\n", "{seen}");

    // The edit-test loop: list, checkpoint, a wrong edit, roll back, the right edit.
    let listing = structured(
        &call(
            &client,
            "file_list",
            json!({"sandbox_id": id, "path": "/home/user/p"}),
        )
        .await,
    );
    assert_eq!(
        listing["entries"],
        json!([{"name": "a.txt", "kind": "file", "size": 7}]),
        "{listing}"
    );
    let saved = structured(&call(&client, "checkpoint", json!({"sandbox_id": id})).await);
    assert!(saved["checkpoint_id"].is_string(), "{saved}");
    let edit = |old: &str, new: &str| json!({"sandbox_id": id, "path": "/home/user/p/a.txt", "old_text": old, "new_text": new});
    structured(&call(&client, "file_edit", edit("héllo", "wrong")).await);
    let empty = failed(&call(&client, "file_edit", edit("", "x")).await);
    assert!(empty.starts_with("invalid_request:"), "{empty}");
    let absent = failed(&call(&client, "file_edit", edit("héllo", "x")).await);
    assert!(absent.contains("not found"), "{absent}");
    structured(&call(&client, "rollback", json!({"sandbox_id": id})).await);
    let back = structured(
        &call(
            &client,
            "file_read",
            json!({"sandbox_id": id, "path": "/home/user/p/a.txt"}),
        )
        .await,
    );
    assert_eq!(
        back["content"], "héllo\n",
        "the rollback restored the file: {back}"
    );
    let right = structured(&call(&client, "file_edit", edit("héllo", "hello, world")).await);
    assert_eq!(right["bytes"], 13, "{right}");
    let extended = structured(
        &call(
            &client,
            "sandbox_extend",
            json!({"sandbox_id": id, "timeout_secs": 1200}),
        )
        .await,
    );
    assert_ne!(extended["expires_at"], created["expires_at"], "{extended}");

    // Another key's tenant sees nothing of it.
    let other = connect(&service, b).await;
    let theirs = structured(&call(&other, "sandbox_list", json!({})).await);
    assert_eq!(theirs["sandboxes"], json!([]), "{theirs}");
    let refused = failed(
        &call(
            &other,
            "run_command",
            json!({"sandbox_id": id, "command": "true"}),
        )
        .await,
    );
    assert!(refused.starts_with("sandbox_not_found:"), "{refused}");
    let refused = failed(&call(&other, "sandbox_kill", json!({"sandbox_id": id})).await);
    assert!(refused.starts_with("sandbox_not_found:"), "{refused}");

    // Bad arguments are tool errors too; then the sandbox is killed, and gone.
    let malformed = failed(&call(&client, "sandbox_kill", json!({"sandbox_id": "not an id"})).await);
    assert!(malformed.starts_with("invalid_request:"), "{malformed}");
    structured(&call(&client, "sandbox_kill", json!({"sandbox_id": id})).await);
    let listed = structured(&call(&client, "sandbox_list", json!({})).await);
    assert_eq!(listed["sandboxes"], json!([]), "{listed}");
    let gone = failed(
        &call(
            &client,
            "run_command",
            json!({"sandbox_id": id, "command": "true"}),
        )
        .await,
    );
    assert!(
        gone.starts_with("sandbox_not_found:") || gone.starts_with("sandbox_not_running:"),
        "{gone}"
    );

    client.cancel().await.expect("closed");
    other.cancel().await.expect("closed");
    service.shutdown().await;
}
