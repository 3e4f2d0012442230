//! A tenant's allow rule that the operator's deny list makes useless, through a real server: refused
//! with the rule named at create and when the policy changes, rather than refused connection by
//! connection at run time.

use serde_json::json;

use crate::support::harness::{unreachable_network, Harness, Options};

#[test]
fn an_allow_rule_inside_a_denied_network_is_refused_at_create_and_at_change() {
    let h = Harness::with(Options {
        network: Some(unreachable_network()),
        ..Options::default()
    });
    h.block_on(async {
        let a = h.admin.new_tenant("netshadow").await;
        let r = a
            .post(
                "/v1/sandboxes",
                json!({"network": {"allow": [{"domain": "a.test"}, {"cidr": "10.1.2.0/24"}]}}),
            )
            .await;
        let e = r.err(400, "invalid_request");
        assert_eq!(e["field"], "network.allow[1]", "{e}");
        let message = e["message"].as_str().expect("message");
        assert!(message.contains("private (RFC 1918)"), "{message}");
        let list = a.get("/v1/sandboxes").await.ok(200);
        assert_eq!(list["sandboxes"], json!([]), "{list}");

        let id = a
            .create_sandbox(json!({"network": {"allow": [{"domain": "a.test"}]}}))
            .await;
        let path = format!("/v1/sandboxes/{id}/network");
        let r = a
            .put(
                &path,
                json!({"policy": {"allow": [{"cidr": "169.254.169.254", "ports": [80]}]}}),
            )
            .await;
        let e = r.err(400, "invalid_request");
        assert_eq!(e["field"], "policy.allow[0]", "{e}");
        let info = a.get(&path).await.ok(200);
        assert_eq!(info["policy"]["allow"], json!([{"domain": "a.test"}]), "{info}");
        a.put(&path, json!({"policy": {"allow": [{"cidr": "0.0.0.0/0"}]}}))
            .await
            .ok(200);
        a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
    });
}
