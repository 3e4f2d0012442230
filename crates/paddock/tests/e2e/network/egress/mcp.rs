//! MCP on networked sandboxes. URL transfers (`file_download_url`, `file_upload_url`): the sandbox
//! itself fetches and sends, so its policy decides what is reachable (an allowed host answers, any
//! other is refused by the egress proxy), and the bytes land where the tools say. The network
//! tools: an allowlist the operator's deny list makes useless is refused at `sandbox_create`, and
//! `network_set` changes a policy only for a key allowed to.

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

        // An allowlist inside the operator's deny list is refused at create, naming the rule.
        let shadowed = error_text(&call(
            &client,
            "sandbox_create",
            json!({"network_allow": ["allowed.test", "10.1.2.0/24"]}),
        )
        .await);
        assert!(shadowed.starts_with("invalid_request: network.allow[1]:"), "{shadowed}");

        // The policy changes for this key, not for one made without the permission.
        let changed = ok(&call(
            &client,
            "network_set",
            json!({"sandbox_id": id, "policy": {"allow": [{"domain": "other.test"}]}}),
        )
        .await);
        assert_eq!(changed["policy"]["allow"], json!([{"domain": "other.test"}]), "{changed}");
        let made = h
            .admin
            .post(
                "/v1/keys",
                json!({"tenant": "mcpurl", "name": "agent", "change_network": false}),
            )
            .await
            .ok(201);
        let limited = connect(&service, made["key"].as_str().expect("a key")).await;
        let forbidden = error_text(&call(
            &limited,
            "network_set",
            json!({"sandbox_id": id, "policy": {"allow": [{"domain": "allowed.test"}]}}),
        )
        .await);
        assert!(forbidden.starts_with("forbidden:"), "{forbidden}");
        let kept = ok(&call(&limited, "network_get", json!({"sandbox_id": id})).await);
        assert_eq!(kept["policy"]["allow"], json!([{"domain": "other.test"}]), "{kept}");

        ok(&call(&client, "sandbox_kill", json!({"sandbox_id": id})).await);
        client.cancel().await.expect("closed");
        limited.cancel().await.expect("closed");
    });
}
