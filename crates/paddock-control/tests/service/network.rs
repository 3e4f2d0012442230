//! Sandbox network policies the operator's deny list makes useless: refused at create and when a
//! policy changes, naming the rule and the operator's reason, with nothing recorded or changed. The
//! fake backend gives sandboxes no network, so a networked sandbox here is one whose network row a
//! second handle on the same database wrote (what a create would have recorded with it).

use paddock_control::{NetworkConfig, ServiceConfig};
use paddock_egress::policy::{OperatorAllow, OperatorPolicy};
use paddock_egress::EgressConfig;
use paddock_runtime::fake::FakeBackend;
use paddock_store::{SandboxNetworkRecord, Store};
use paddock_types::api::{ErrorCode, ListSandboxesQuery};
use serde_json::json;

use crate::fixture::{body, error, test_config, Fixture};
use crate::restart::shared_database;

/// An egress proxy with the default deny list and `allow` as the operator's exceptions.
fn networked(config: &mut ServiceConfig, allow: Vec<OperatorAllow>) {
    config.network = Some(NetworkConfig {
        ports: Default::default(),
        egress: EgressConfig {
            operator: OperatorPolicy {
                allow,
                ..OperatorPolicy::default()
            },
            system_resolver: false,
            public_roots: false,
            ..Default::default()
        },
        conntrack: Default::default(),
    });
}

#[tokio::test]
async fn create_refuses_an_allow_rule_inside_a_denied_network() {
    let f = Fixture::with(|c| {
        networked(
            c,
            vec![OperatorAllow {
                cidr: "10.9.0.0/16".parse().expect("cidr"),
                ports: vec!["5432".parse().expect("port")],
                reason: "the shared database".into(),
            }],
        )
    })
    .await;
    for (policy, field, reason) in [
        (
            json!({"allow": [{"domain": "a.test"}, {"cidr": "203.0.113.0/24"}, {"cidr": "10.1.2.0/24"}]}),
            "network.allow[2]",
            "private (RFC 1918)",
        ),
        (
            json!({"allow": [{"cidr": "169.254.169.254", "ports": [80]}]}),
            "network.allow[0]",
            "cloud metadata",
        ),
        (
            json!({"allow": [{"cidr": "::1"}, {"cidr": "127.0.0.1"}]}),
            "network.allow[0]",
            "loopback",
        ),
        // The operator's exception covers 5432 only.
        (
            json!({"allow": [{"cidr": "10.9.1.0/24", "ports": [443]}]}),
            "network.allow[0]",
            "private (RFC 1918)",
        ),
    ] {
        let e = error(f.try_create(&f.a, json!({ "network": policy })).await);
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{policy}: {e:?}");
        assert_eq!(e.field.as_deref(), Some(field), "{policy}: {e:?}");
        assert!(e.message.contains(reason), "{policy}: {}", e.message);
    }
    // Nothing was recorded for any of them.
    let list = f
        .service
        .list_sandboxes(&f.a, ListSandboxesQuery::default())
        .await
        .expect("list");
    assert!(list.sandboxes.is_empty(), "{list:?}");
    assert!(f.rows("sandbox.").await.is_empty());

    // Rules that can take effect pass the check (and reach the fake backend, which has no network).
    for policy in [
        json!({"allow": [{"cidr": "0.0.0.0/0"}, {"cidr": "::/0"}, {"domain": "localhost"}]}),
        json!({"allow": [{"cidr": "10.9.1.0/24", "ports": ["5000-6000"]}]}),
    ] {
        let e = error(f.try_create(&f.a, json!({ "network": policy })).await);
        assert!(
            e.field
                .as_deref()
                .is_none_or(|field| !field.starts_with("network")),
            "{policy}: {e:?}"
        );
    }
    f.finish().await;
}

#[test]
fn set_network_refuses_an_allow_rule_inside_a_denied_network_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let Some(database) = shared_database(dir.path()) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut config = test_config();
        networked(&mut config, Vec::new());
        let store = Store::open(&database).expect("the store");
        let f = Fixture::on(FakeBackend::new().expect("the fake backend"), store, config).await;
        let id = f.create(&f.a, json!({})).await.id;
        let first = json!({"allow": [{"domain": "a.test"}]});
        let row = SandboxNetworkRecord {
            sandbox_id: id.to_string(),
            policy: first.clone(),
            secrets: Vec::new(),
            ca_cert_pem: String::new(),
            ca_key_pem: String::new(),
            updated_at_ms: 0,
        };
        let writer = Store::open(&database).expect("a second handle");
        writer
            .transaction(|tx| tx.put_sandbox_network(&row))
            .expect("the network row");
        f.service
            .create_secret(
                &f.a,
                body(json!({"name": "GH", "value": "t0k3n", "hosts": ["api.github.com"]})),
            )
            .await
            .expect("secret");

        let refused = f
            .service
            .set_network(
                &f.a,
                &id,
                body(json!({
                    "policy": {"allow": [{"domain": "b.test"}, {"cidr": "192.168.1.0/24", "ports": [22]}]},
                    "secrets": ["GH"],
                })),
            )
            .await;
        let e = error(refused);
        assert_eq!(
            (e.code, e.field.as_deref()),
            (ErrorCode::InvalidRequest, Some("policy.allow[1]")),
            "{e:?}"
        );
        assert!(e.message.contains("private (RFC 1918)"), "{}", e.message);
        // Neither the policy nor the secrets of the refused request were applied or recorded.
        let info = f.service.get_network(&f.a, &id).await.expect("get");
        assert_eq!(serde_json::to_value(&info.policy).expect("json"), first);
        assert!(info.secrets.is_empty(), "{info:?}");
        assert!(f.rows("network.policy").await.is_empty());

        let allowed = json!({"allow": [{"cidr": "0.0.0.0/0"}]});
        let info = f
            .service
            .set_network(&f.a, &id, body(json!({ "policy": allowed })))
            .await
            .expect("a policy that can take effect");
        assert_eq!(serde_json::to_value(&info.policy).expect("json"), allowed);
        assert_eq!(f.rows("network.policy").await.len(), 1);
        f.finish().await;
    });
}
