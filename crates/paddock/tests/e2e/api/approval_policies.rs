//! Approval policies over HTTP: a plain key is refused (`403 forbidden`, nothing stored) but may
//! read; an approver key sets, reads and deletes its tenant's policy and a sandbox's; a policy that
//! does not compile is refused with `400 invalid_request` naming its field; every change is in the
//! audit log.

use serde_json::json;

use crate::support::harness::Harness;

#[test]
fn approval_policies_are_set_read_and_deleted_by_an_approver_key_only() {
    let h = Harness::start();
    h.block_on(async {
        let plain = h.admin.new_tenant("policies").await;
        let approver = h
            .admin
            .new_tenant_with("policies", json!({"approver": true}))
            .await;
        let listed = h.admin.get("/v1/keys").await.ok(200);
        for k in listed["keys"].as_array().expect("keys") {
            if k["tenant"] == "policies" {
                assert_eq!(
                    k["approver"],
                    k["id"].as_str() == approver.key_id.as_deref(),
                    "{k}"
                );
            }
        }
        let id = plain.create_sandbox(json!({})).await;
        let sandbox_path = format!("/v1/sandboxes/{id}/policy");
        let tenant_policy = json!({"default": "allow", "rules": [
            {"verdict": "ask", "reason": "pushes leave the sandbox",
             "exec": {"command": {"regex": "^git push( |$)"}}}]});

        // A plain key: refused, nothing stored; it may read (there is nothing yet).
        for path in ["/v1/policy", sandbox_path.as_str()] {
            plain
                .put(path, json!({"policy": tenant_policy}))
                .await
                .err(403, "forbidden");
            plain.delete(path).await.err(403, "forbidden");
            plain.get(path).await.err(404, "policy_not_found");
        }

        // An approver: the tenant's policy and the sandbox's, kept apart.
        let info = approver
            .put("/v1/policy", json!({"policy": tenant_policy}))
            .await
            .ok(200);
        assert_eq!(info["policy"], tenant_policy, "{info}");
        assert!(info.get("sandbox_id").is_none(), "{info}");
        let info = approver
            .put(&sandbox_path, json!({"policy": {"default": "deny"}}))
            .await
            .ok(200);
        assert_eq!(info["policy"], json!({"default": "deny", "rules": []}), "{info}");
        assert_eq!(info["sandbox_id"], id.as_str(), "{info}");
        assert_eq!(plain.get("/v1/policy").await.ok(200)["policy"], tenant_policy);
        assert_eq!(
            plain.get(&sandbox_path).await.ok(200)["policy"]["default"],
            "deny"
        );

        // A faulty policy: refused whole, naming its field; the policy before is kept.
        let faulty = json!({"default": "allow", "rules": [
            {"verdict": "ask", "exec": {"program": {"glob": "ok"}}},
            {"verdict": "deny", "exec": {"args": {"regex": "(unclosed"}}}]});
        let e = approver
            .put("/v1/policy", json!({"policy": faulty}))
            .await
            .err(400, "invalid_request");
        assert_eq!(e["field"], "policy.rules[1].exec.args", "{e}");
        let e = approver
            .put("/v1/policy", json!({"policy": {"default": "allow"}, "extra": 1}))
            .await
            .err(400, "invalid_request");
        assert!(e["message"].as_str().unwrap_or_default().contains("extra"), "{e}");
        assert_eq!(plain.get("/v1/policy").await.ok(200)["policy"], tenant_policy);

        // Deleted, each scope alone; a second delete finds nothing.
        approver.delete(&sandbox_path).await.ok(204);
        plain.get(&sandbox_path).await.err(404, "policy_not_found");
        plain.get("/v1/policy").await.ok(200);
        approver.delete(&sandbox_path).await.err(404, "policy_not_found");
        approver.delete("/v1/policy").await.ok(204);
        plain.get("/v1/policy").await.err(404, "policy_not_found");

        let rows = h
            .admin
            .get_q("/v1/audit", &[("action", "policy."), ("tenant", "policies")])
            .await
            .ok(200);
        let actions: Vec<(&str, &str)> = rows["records"]
            .as_array()
            .expect("records")
            .iter()
            .map(|r| {
                (
                    r["action"].as_str().unwrap_or_default(),
                    r["detail"]["scope"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            actions,
            [
                ("policy.set", "tenant"),
                ("policy.set", "sandbox"),
                ("policy.delete", "sandbox"),
                ("policy.delete", "tenant"),
            ],
            "{rows}"
        );
        plain.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
    });
}
