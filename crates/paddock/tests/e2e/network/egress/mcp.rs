//! MCP's URL transfers (`file_download_url`, `file_upload_url`) on a networked sandbox: the sandbox
//! itself fetches and sends, so its policy decides what is reachable (an allowed host answers, any
//! other is refused by the egress proxy), and the bytes land where the tools say.

use serde_json::json;

use super::{network_config, outside};
use crate::support::harness::{Harness, Options};
use crate::support::mcp::{call, connect, error_text, ok};

#[test]
fn url_transfers_go_through_the_sandboxs_own_network_policy() {
    let o = outside();
    let h = Harness::with(Options {
        network: Some(network_config(&o)),
        ..Options::default()
    });
    let http = o.http;
    h.block_on(async {
        let tenant = h.admin.new_tenant("mcpurl").await;
        let service = h.service.clone().expect("the service");
        let client = connect(&service, tenant.key.as_deref().expect("a key")).await;
        let created = ok(&call(
            &client,
            "sandbox_create",
            json!({"network_allow": ["allowed.test"], "timeout_secs": 300}),
        )
        .await);
        let id = created["sandbox_id"].as_str().expect("an id").to_owned();

        // Allowed: the file holds what the server answered.
        let got = ok(&call(
            &client,
            "file_download_url",
            json!({"sandbox_id": id, "url": format!("http://allowed.test:{http}/echo"), "path": "/tmp/in/echo.txt"}),
        )
        .await);
        let read = ok(&call(&client, "file_read", json!({"sandbox_id": id, "path": "/tmp/in/echo.txt"})).await);
        let text = read["content"].as_str().expect("text");
        assert!(text.starts_with("auth=None host=allowed.test"), "{text}");
        assert_eq!(got["bytes"].as_u64(), Some(text.len() as u64), "{got}");

        // Not in the policy: the proxy refuses, the tool says so, no file is left claiming success.
        let refused = error_text(&call(
            &client,
            "file_download_url",
            json!({"sandbox_id": id, "url": format!("http://other.test:{http}/echo"), "path": "/tmp/in/other.txt"}),
        )
        .await);
        assert!(refused.starts_with("unavailable:"), "{refused}");

        // Sent: the server keeps the body, as a later download shows.
        ok(&call(
            &client,
            "file_write",
            json!({"sandbox_id": id, "path": "/tmp/out/report.txt", "content": "findings\n"}),
        )
        .await);
        let sent = ok(&call(
            &client,
            "file_upload_url",
            json!({"sandbox_id": id, "path": "/tmp/out/report.txt", "url": format!("http://allowed.test:{http}/upload/report")}),
        )
        .await);
        assert_eq!(sent["status"], 201, "{sent}");
        ok(&call(
            &client,
            "file_download_url",
            json!({"sandbox_id": id, "url": format!("http://allowed.test:{http}/uploaded/report"), "path": "/tmp/in/back.txt"}),
        )
        .await);
        let back = ok(&call(&client, "file_read", json!({"sandbox_id": id, "path": "/tmp/in/back.txt"})).await);
        assert_eq!(back["content"], "findings\n", "{back}");
        let refused = error_text(&call(
            &client,
            "file_upload_url",
            json!({"sandbox_id": id, "path": "/tmp/out/report.txt", "url": format!("http://other.test:{http}/upload/x")}),
        )
        .await);
        assert!(refused.starts_with("unavailable:"), "{refused}");
        let bad = error_text(&call(
            &client,
            "file_download_url",
            json!({"sandbox_id": id, "url": "file:///etc/shadow", "path": "/tmp/x"}),
        )
        .await);
        assert!(bad.starts_with("invalid_request:"), "{bad}");
        ok(&call(&client, "sandbox_kill", json!({"sandbox_id": id})).await);
        client.cancel().await.expect("closed");
    });
}
