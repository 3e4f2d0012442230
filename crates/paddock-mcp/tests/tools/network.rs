//! `network_get` and `network_set` on a server without an egress proxy (the fake backend's): a
//! sandbox without a network is refused with the service's code, bad arguments are refused before
//! the service, and another tenant's calls answer as for a missing sandbox. (Policies of networked
//! sandboxes need the egress proxy: the end-to-end tests.)

use serde_json::json;

use crate::support::{call, connect, failed, service, structured};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_network_tools_refuse_what_the_service_refuses() {
    let (service, a, b) = service().await;
    let client = connect(&service, a).await;
    let tools = client.list_all_tools().await.expect("tools");
    let hints = |name: &str| {
        let t = tools.iter().find(|t| t.name == name).expect("tool");
        let a = t.annotations.clone().expect("annotations");
        (a.read_only_hint, a.destructive_hint)
    };
    assert_eq!(hints("network_get").0, Some(true));
    assert_eq!(hints("network_set"), (Some(false), Some(true)));

    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    let policy = json!({"allow": [{"domain": "*.example.com", "ports": [443, "8000-8100"]}]});

    let got = failed(&call(&client, "network_get", json!({"sandbox_id": id})).await);
    assert!(
        got.starts_with("invalid_request:") && got.contains("has no network"),
        "{got}"
    );
    let set = failed(
        &call(
            &client,
            "network_set",
            json!({"sandbox_id": id, "policy": policy}),
        )
        .await,
    );
    assert!(
        set.starts_with("invalid_request:") && set.contains("has no network"),
        "{set}"
    );
    let set = failed(
        &call(
            &client,
            "network_set",
            json!({"sandbox_id": id, "secrets": ["GH"]}),
        )
        .await,
    );
    assert!(set.contains("has no network"), "{set}");

    // Arguments the tool refuses itself.
    let empty = failed(&call(&client, "network_set", json!({"sandbox_id": id})).await);
    assert!(empty.starts_with("invalid_request: policy:"), "{empty}");
    let both = json!({"allow": [{"domain": "example.com", "cidr": "10.0.0.0/8"}]});
    let bad = failed(&call(&client, "network_set", json!({"sandbox_id": id, "policy": both})).await);
    assert!(bad.starts_with("invalid_request: policy:"), "{bad}");
    let port = json!({"allow": [{"domain": "example.com", "ports": ["https"]}]});
    let bad = failed(&call(&client, "network_set", json!({"sandbox_id": id, "policy": port})).await);
    assert!(bad.starts_with("invalid_request: policy:"), "{bad}");
    let malformed = failed(&call(&client, "network_get", json!({"sandbox_id": "not an id"})).await);
    assert!(malformed.starts_with("invalid_request:"), "{malformed}");

    // Another tenant.
    let other = connect(&service, b).await;
    let refused = failed(&call(&other, "network_get", json!({"sandbox_id": id})).await);
    assert!(refused.starts_with("sandbox_not_found:"), "{refused}");
    let refused = failed(&call(&other, "network_set", json!({"sandbox_id": id, "policy": policy})).await);
    assert!(refused.starts_with("sandbox_not_found:"), "{refused}");

    structured(&call(&client, "sandbox_kill", json!({"sandbox_id": id})).await);
    client.cancel().await.expect("closed");
    other.cancel().await.expect("closed");
    service.shutdown().await;
}
