//! `port_url` with the operator's settings: the API route and the sandbox's host for a port, the
//! port checked, a sandbox that is not running refused, another tenant's sandbox missing, and a
//! server that publishes no URL saying so.

use paddock_control::{Principal, SandboxService};
use paddock_mcp::{McpSettings, PaddockMcp};
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt as _};
use serde_json::json;

use crate::support::{call, connect, failed, service, structured};

/// A client of `principal`'s server configured with `settings`.
async fn connect_with(
    service: &SandboxService,
    principal: Principal,
    settings: McpSettings,
) -> RunningService<RoleClient, ()> {
    let (server_end, client_end) = tokio::io::duplex(1 << 16);
    let server = PaddockMcp::new(service.clone(), principal, settings);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_end).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_end).await.expect("the client connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_url_names_the_api_route_and_the_sandboxs_host() {
    let (service, a, b) = service().await;
    let settings = McpSettings {
        public_url: Some("http://127.0.0.1:8080/".into()),
        port_domain: Some("sb.localhost".into()),
    };
    let client = connect_with(&service, a.clone(), settings.clone()).await;
    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();

    let urls = structured(&call(&client, "port_url", json!({"sandbox_id": id, "port": 8000})).await);
    assert_eq!(
        urls,
        json!({
            "sandbox_id": id,
            "port": 8000,
            "url": format!("http://127.0.0.1:8080/v1/sandboxes/{id}/ports/8000/http/"),
            "host_url": format!("https://8000-{id}.sb.localhost"),
            "host_url_public": false,
        }),
        "{urls}"
    );
    let zero = failed(&call(&client, "port_url", json!({"sandbox_id": id, "port": 0})).await);
    assert!(zero.starts_with("invalid_request: port:"), "{zero}");

    // Without a port domain: the API route only; without a public URL either: unsupported.
    let api_only = McpSettings {
        port_domain: None,
        ..settings.clone()
    };
    let plain = connect_with(&service, a.clone(), api_only).await;
    let urls = structured(&call(&plain, "port_url", json!({"sandbox_id": id, "port": 3000})).await);
    assert_eq!(
        (
            &urls["host_url"],
            urls["url"].as_str().map(|u| u.ends_with("/ports/3000/http/"))
        ),
        (&json!(null), Some(true)),
        "{urls}"
    );
    let bare = connect(&service, a).await;
    let none = failed(&call(&bare, "port_url", json!({"sandbox_id": id, "port": 3000})).await);
    assert!(none.starts_with("unsupported:"), "{none}");

    // Another tenant's sandbox is not there (even before the settings are looked at).
    let other = connect_with(&service, b.clone(), settings.clone()).await;
    let refused = failed(&call(&other, "port_url", json!({"sandbox_id": id, "port": 8000})).await);
    assert!(refused.starts_with("sandbox_not_found:"), "{refused}");
    let other_bare = connect(&service, b).await;
    let refused = failed(&call(&other_bare, "port_url", json!({"sandbox_id": id, "port": 8000})).await);
    assert!(refused.starts_with("sandbox_not_found:"), "{refused}");

    // An ended sandbox serves no port.
    structured(&call(&client, "sandbox_kill", json!({"sandbox_id": id})).await);
    let ended = failed(&call(&client, "port_url", json!({"sandbox_id": id, "port": 8000})).await);
    assert!(ended.starts_with("sandbox_not_running:"), "{ended}");

    for c in [client, plain, bare, other, other_bare] {
        c.cancel().await.expect("closed");
    }
    service.shutdown().await;
}
