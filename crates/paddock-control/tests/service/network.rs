//! Sandbox network policies the operator's deny list makes useless: refused at create and when a
//! policy changes, naming the rule and the operator's reason, with nothing recorded or changed; and
//! keys made without the permission to change a live sandbox's network, refused `set_network`. The
//! fake backend gives sandboxes no network, so a networked sandbox here is one whose network row a
//! second handle on the same database wrote (what a create would have recorded with it).

use paddock_control::{NetworkConfig, ServiceConfig};
use paddock_egress::policy::{OperatorAllow, OperatorPolicy};
use paddock_egress::EgressConfig;
use paddock_runtime::fake::FakeBackend;
use paddock_store::{SandboxNetworkRecord, Store};
use paddock_types::api::{ErrorCode, ListSandboxesQuery};
use paddock_types::NetworkPolicy;
use serde_json::json;

use crate::fixture::{body, code, error, sid, test_config, Fixture};
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
    // No sandbox was recorded for any of them; each refusal has its audit row.
    let list = f
        .service
        .list_sandboxes(&f.a, ListSandboxesQuery::default())
        .await
        .expect("list");
    assert!(list.sandboxes.is_empty(), "{list:?}");
    let rows = f.rows("sandbox.").await;
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(
        rows.iter().all(|r| r.action == "sandbox.create"
            && r.outcome == "invalid_request"
            && r.sandbox_id.is_none()),
        "{rows:?}"
    );

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
        let first: NetworkPolicy = body(json!({"allow": [{"domain": "a.test"}]}));
        let row = SandboxNetworkRecord {
            sandbox_id: id.to_string(),
            policy: serde_json::to_value(&first).expect("json"),
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
        assert_eq!(info.policy, first);
        assert!(info.secrets.is_empty(), "{info:?}");
        assert!(f.rows("network.policy").await.is_empty());

        // A key of the same tenant made without the permission changes nothing either.
        let limited = f
            .service
            .create_key(
                &f.admin,
                body(json!({"tenant": "tenant-a", "change_network": false})),
            )
            .await
            .expect("key");
        let limited = f.service.authenticate(&limited.key).await.expect("the key works");
        let good = json!({"policy": {"allow": [{"domain": "c.test"}]}});
        assert_eq!(
            code(f.service.set_network(&limited, &id, body(good)).await),
            ErrorCode::Forbidden
        );
        assert_eq!(
            f.service.get_network(&limited, &id).await.expect("get").policy,
            first
        );

        let allowed: NetworkPolicy = body(json!({"allow": [{"cidr": "0.0.0.0/0"}]}));
        let info = f
            .service
            .set_network(&f.a, &id, body(json!({ "policy": &allowed })))
            .await
            .expect("a policy that can take effect");
        assert_eq!(info.policy, allowed);
        assert_eq!(f.rows("network.policy").await.len(), 1);
        f.finish().await;
    });
}

#[tokio::test]
async fn set_network_needs_a_key_that_may_change_networks() {
    let f = Fixture::with(|c| networked(c, Vec::new())).await;
    let made = f
        .service
        .create_key(
            &f.admin,
            body(json!({"tenant": "tenant-a", "change_network": false})),
        )
        .await
        .expect("key");
    assert!(!made.change_network && !made.admin);
    let limited = f.service.authenticate(&made.key).await.expect("the key works");
    assert!(!limited.change_network);
    assert!(f.a.change_network, "keys made without saying so may");
    // It acts on its tenant's sandboxes otherwise.
    let id = f.create(&limited, json!({})).await.id;
    let request = || body(json!({"policy": {"allow": [{"domain": "a.test"}]}}));
    let e = error(f.service.set_network(&limited, &id, request()).await);
    assert_eq!(e.code, ErrorCode::Forbidden, "{e:?}");
    assert!(e.message.contains("change_network"), "{}", e.message);
    // Refused before any lookup: the same answer for a sandbox that does not exist.
    assert_eq!(
        code(
            f.service
                .set_network(&limited, &sid("sb-00000000000000ff"), request())
                .await
        ),
        ErrorCode::Forbidden
    );
    // The tenant's other key passes the check (and meets the next one: this sandbox has no network).
    assert_eq!(
        code(f.service.set_network(&f.a, &id, request()).await),
        ErrorCode::InvalidRequest
    );
    let keys = f.service.list_keys(&f.admin).await.expect("keys").keys;
    let listed = keys.iter().find(|k| k.id == made.id).expect("listed");
    assert!(!listed.change_network);
    assert!(
        keys.iter().filter(|k| k.id != made.id).all(|k| k.change_network),
        "{keys:?}"
    );
    let created = f.rows("key.create").await;
    let row = created
        .iter()
        .find(|r| r.detail["key_id"] == made.id.as_str())
        .expect("its key.create row");
    assert_eq!(row.detail["change_network"], false, "{row:?}");
    f.finish().await;
}
