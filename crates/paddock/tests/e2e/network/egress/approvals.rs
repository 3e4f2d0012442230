//! A network `ask`: a sandbox's connection to a name its allowlist does not cover, which its
//! approval policy says to ask about, waits in the egress proxy as a pending approval (kind
//! `network`, asked by the sandbox itself) until a person decides: approved, that connection goes
//! through to the server; rejected, it is refused. A name the policy does not ask about is refused
//! at once, as before, and nothing inside the sandbox can approve it.

use std::time::Duration;

use serde_json::json;

use super::{fetch, network_config, outside};
use crate::support::harness::{poll, Harness, Options};

#[test]
fn a_policy_ask_on_network_holds_the_connection_until_a_person_decides() {
    let o = outside();
    let h = Harness::with(Options {
        network: Some(network_config(&o)),
        ..Options::default()
    });
    let http = o.http;
    h.block_on(async {
        let agent = h.admin.new_tenant("netask").await;
        let person = h
            .admin
            .new_tenant_with("netask", json!({"approver": true}))
            .await;
        let id = agent
            .create_sandbox(json!({"network": {"allow": [{"domain": "allowed.test"}]}}))
            .await;
        person
            .put(
                &format!("/v1/sandboxes/{id}/policy"),
                json!({"policy": {"default": "allow", "rules": [
                    {"verdict": "ask", "reason": "a new host", "network": {"host": {"glob": "other.test"}}}]}}),
            )
            .await
            .ok(200);

        // Held: the fetch waits while the approval is pending.
        let url = format!("http://other.test:{http}/echo");
        let (client, sandbox, script) = (agent.clone(), id.clone(), fetch(&url, None));
        let held = tokio::spawn(async move { client.sh(&sandbox, &script).await });
        let pending = poll(Duration::from_secs(60), "the held connection's approval", || {
            let person = person.clone();
            async move {
                let listed = person.get("/v1/approvals?state=pending").await.ok(200);
                listed["approvals"]
                    .as_array()
                    .and_then(|a| a.first().cloned())
            }
        })
        .await;
        assert_eq!(pending["kind"], "network", "{pending}");
        assert_eq!(pending["summary"], format!("connect other.test:{http}"), "{pending}");
        assert_eq!(pending["requested_by"], format!("sandbox:{id}"), "{pending}");
        assert_eq!(pending["sandbox_id"], id.as_str());
        assert!(!held.is_finished(), "the fetch ended while its connection was held");
        let approval = pending["id"].as_str().expect("id").to_owned();
        person
            .post(&format!("/v1/approvals/{approval}/approve"), json!({"note": "fine once"}))
            .await
            .ok(200);
        let got = tokio::time::timeout(Duration::from_secs(60), held)
            .await
            .expect("the fetch ends once approved")
            .expect("joined");
        assert!(got.starts_with("GOT auth=None host=other.test"), "{got}");

        // Once: the next connection is held again; rejected, it is refused.
        let (client, sandbox, script) = (agent.clone(), id.clone(), fetch(&url, None));
        let held = tokio::spawn(async move { client.sh(&sandbox, &script).await });
        let pending = poll(Duration::from_secs(60), "the second approval", || {
            let person = person.clone();
            let first = approval.clone();
            async move {
                let listed = person.get("/v1/approvals?state=pending").await.ok(200);
                listed["approvals"]
                    .as_array()
                    .and_then(|a| a.iter().find(|x| x["id"] != first.as_str()).cloned())
            }
        })
        .await;
        let second = pending["id"].as_str().expect("id").to_owned();
        person
            .post(&format!("/v1/approvals/{second}/reject"), json!({}))
            .await
            .ok(200);
        let refused = tokio::time::timeout(Duration::from_secs(60), held)
            .await
            .expect("the fetch ends once rejected")
            .expect("joined");
        assert!(refused.contains("ERR") && refused.contains("403"), "{refused}");

        // A name the policy does not ask about: refused at once, nothing queued.
        let other = agent
            .sh(&id, &fetch(&format!("http://pypi.test:{http}/echo"), None))
            .await;
        assert!(other.contains("ERR") && other.contains("403"), "{other}");
        let listed = person.get("/v1/approvals").await.ok(200);
        assert_eq!(listed["approvals"].as_array().map(Vec::len), Some(2), "{listed}");
        let rows = person.audit_rows(&[("action", "network.connection")]).await;
        assert!(
            rows.iter().any(|r| r["detail"]["rule"]["kind"] == "approved"),
            "the approved connection's row names its rule: {rows:#?}"
        );
    });
}
