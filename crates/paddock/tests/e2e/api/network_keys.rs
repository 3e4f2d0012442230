//! The per-key permission to change a live sandbox's network: on for keys by default, off for a key
//! made with `change_network: false`, which `PUT /v1/sandboxes/{id}/network` then refuses
//! (`forbidden`, nothing changed) while the tenant's other keys may.

use serde_json::json;

use crate::support::harness::{unreachable_network, Harness, Options};

#[test]
fn a_key_made_without_change_network_cannot_change_a_sandboxs_network() {
    let h = Harness::with(Options {
        network: Some(unreachable_network()),
        ..Options::default()
    });
    h.block_on(async {
        let a = h.admin.new_tenant("netkeys").await;
        let made = h
            .admin
            .post(
                "/v1/keys",
                json!({"tenant": "netkeys", "name": "agent", "change_network": false}),
            )
            .await
            .ok(201);
        assert_eq!(made["change_network"], false, "{made}");
        let limited = h.with_key(made["key"].as_str().expect("key"));
        let listed = h.admin.get("/v1/keys").await.ok(200);
        for k in listed["keys"].as_array().expect("keys") {
            assert_eq!(k["change_network"], k["id"] != made["id"], "{k}");
        }

        let id = a
            .create_sandbox(json!({"network": {"allow": [{"domain": "a.test"}]}}))
            .await;
        let path = format!("/v1/sandboxes/{id}/network");
        let r = limited
            .put(&path, json!({"policy": {"allow": [{"domain": "b.test"}]}}))
            .await;
        r.err(403, "forbidden");
        let info = limited.get(&path).await.ok(200);
        assert_eq!(info["policy"]["allow"], json!([{"domain": "a.test"}]), "{info}");
        let info = a
            .put(&path, json!({"policy": {"allow": [{"domain": "b.test"}]}}))
            .await
            .ok(200);
        assert_eq!(info["policy"]["allow"], json!([{"domain": "b.test"}]), "{info}");
        a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
    });
}
