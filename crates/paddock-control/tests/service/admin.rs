//! Keys, tenants, quotas, the audit log (query, paging, verification), templates, metrics, secrets
//! and a sandbox's network settings: who may do what, and the rows each writes.

use paddock_types::api::{AuditQuery, CreateKeyRequest, ErrorCode};
use serde_json::json;

use crate::fixture::{body, code, error, Fixture};

fn key(tenant: &str, admin: bool) -> CreateKeyRequest {
    CreateKeyRequest {
        tenant: tenant.into(),
        name: Some(format!("{tenant} key")),
        admin,
        change_network: true,
        approver: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_tenants_are_the_admins_and_a_revoked_key_is_refused() {
    let f = Fixture::start().await;
    let s = &f.service;
    // A tenant's key manages nothing.
    assert_eq!(
        code(s.create_key(&f.b, key("tenant-b", false)).await),
        ErrorCode::Forbidden
    );
    assert_eq!(
        code(s.create_key(&f.b, key("tenant-b", true)).await),
        ErrorCode::Forbidden
    );
    assert_eq!(code(s.list_tenants(&f.b).await), ErrorCode::Forbidden);
    assert_eq!(code(s.get_tenant(&f.b, "tenant-a").await), ErrorCode::Forbidden);
    assert_eq!(
        code(
            s.set_tenant_quota(&f.b, "tenant-b", body(json!({"max_sandboxes": 100})))
                .await
        ),
        ErrorCode::Forbidden
    );
    assert_eq!(code(s.revoke_key(&f.b, &f.a.key_id).await), ErrorCode::Forbidden);
    assert_eq!(code(s.verify_audit(&f.b).await), ErrorCode::Forbidden);
    assert_eq!(code(s.render_metrics(&f.b)), ErrorCode::Forbidden);
    assert_eq!(
        s.get_tenant(&f.b, "tenant-b").await.expect("itself").name,
        "tenant-b"
    );
    let keys = s.list_keys(&f.b).await.expect("own keys");
    assert!(
        !keys.keys.is_empty() && keys.keys.iter().all(|k| k.tenant == "tenant-b"),
        "{keys:?}"
    );
    assert!(s.list_keys(&f.admin).await.expect("all keys").keys.len() >= 3);

    // Quotas are set by the admin, validated, and create the tenant.
    let set = s
        .set_tenant_quota(
            &f.admin,
            "tenant-q",
            body(json!({"max_sandboxes": 2, "max_memory": "1G"})),
        )
        .await
        .expect("quota");
    assert_eq!(
        (set.name.as_str(), set.quota.max_sandboxes),
        ("tenant-q", Some(2))
    );
    let tenants = s.list_tenants(&f.admin).await.expect("tenants");
    assert!(
        tenants.tenants.iter().any(|t| t.name == "tenant-q"),
        "{tenants:?}"
    );
    assert_eq!(
        code(s.get_tenant(&f.admin, "nobody-here").await),
        ErrorCode::InvalidRequest
    );
    let quota_row = &f.rows("tenant.quota").await[0];
    assert_eq!(
        (
            quota_row.detail["for_tenant"].as_str(),
            quota_row.detail["max_sandboxes"].as_u64()
        ),
        (Some("tenant-q"), Some(2))
    );

    // The last active admin key cannot be revoked; once another exists, it can.
    assert_eq!(
        code(s.revoke_key(&f.admin, &f.admin.key_id).await),
        ErrorCode::Forbidden
    );
    let second = s
        .create_key(&f.admin, key("ops", true))
        .await
        .expect("second admin");
    s.revoke_key(&f.admin, &second.id).await.expect("revoke");
    assert_eq!(
        code(s.revoke_key(&f.admin, &second.id).await),
        ErrorCode::KeyNotFound
    );
    // A revoked key, garbage and a well-formed unknown key are all unauthorized, and recorded.
    let c = s.create_key(&f.admin, key("tenant-c", false)).await.expect("c");
    s.revoke_key(&f.admin, &c.id).await.expect("revoke c");
    for bad in [
        c.key.as_str(),
        "nonsense",
        "pdk_0123456789ab_0000000000000000000000000000000000000000000",
    ] {
        assert_eq!(code(s.authenticate(bad).await), ErrorCode::Unauthorized, "{bad}");
    }
    let failed = f.rows("auth.failed").await;
    assert_eq!(failed.len(), 3);
    assert!(failed
        .iter()
        .all(|r| r.outcome == "unauthorized" && r.tenant.is_none()));
    assert_eq!(failed[2].detail["key_id"], "0123456789ab");
    assert_eq!(
        failed[0].detail["key_id"], c.id,
        "the key id part names the revoked key"
    );
    let creates = f.rows("key.create").await;
    assert!(creates
        .iter()
        .any(|r| r.detail["for_tenant"] == "ops" && r.detail["admin"] == true));
    assert_eq!(f.rows("key.revoke").await.len(), 2);
    let e = error(
        s.create_key(
            &f.admin,
            CreateKeyRequest {
                tenant: "x".into(),
                name: Some("n".repeat(300)),
                admin: false,
                change_network: true,
                approver: false,
            },
        )
        .await,
    );
    assert_eq!(e.field.as_deref(), Some("name"));
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_is_a_gapless_chain_filtered_by_tenant_and_paged() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    for i in 0..3 {
        f.sh(&f.a, &id, &format!("echo {i} > /tmp/{i}")).await;
    }
    f.create(&f.b, json!({})).await;
    f.service.kill_sandbox(&f.a, &id).await.expect("kill");
    let all = f.audit(AuditQuery::default()).await;
    for (i, row) in all.iter().enumerate() {
        assert_eq!(row.seq, i as u64 + 1, "gap at {row:?}");
        if i > 0 {
            assert_eq!(row.prev_hash, all[i - 1].hash, "chain broken at {row:?}");
        }
    }
    // A tenant sees its own rows only, in order, and pages give each row once.
    let mine: Vec<_> = all
        .iter()
        .filter(|r| r.tenant.as_deref() == Some("tenant-a"))
        .cloned()
        .collect();
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = f
            .service
            .query_audit(
                &f.a,
                AuditQuery {
                    limit: Some(3),
                    after_seq: after,
                    ..AuditQuery::default()
                },
            )
            .await
            .expect("page");
        assert!(page.records.len() <= 3);
        paged.extend(page.records);
        match page.next_after_seq {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(paged, mine);
    let for_sandbox = f
        .service
        .query_audit(
            &f.a,
            AuditQuery {
                sandbox: Some(id.to_string()),
                action: Some("process.".into()),
                ..AuditQuery::default()
            },
        )
        .await
        .expect("filtered");
    assert!(for_sandbox
        .records
        .iter()
        .all(|r| r.action.starts_with("process.") && r.sandbox_id.as_deref() == Some(id.as_str())));
    let since = mine[2].time.clone();
    let later = f
        .service
        .query_audit(
            &f.a,
            AuditQuery {
                since: Some(since),
                ..AuditQuery::default()
            },
        )
        .await
        .expect("since");
    assert!(later.records.len() < mine.len() && later.records.len() >= mine.len() - 2);
    let verdict = f.service.verify_audit(&f.admin).await.expect("verify");
    assert!(
        verdict.ok && verdict.rows_checked >= all.len() as u64,
        "{verdict:?}"
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_metrics_secrets_and_network_settings() {
    let f = Fixture::start().await;
    let templates = f.service.list_templates(&f.a).await.expect("templates");
    assert_eq!(templates.templates.len(), 1);
    assert_eq!(
        (
            templates.templates[0].name.as_str(),
            templates.templates[0].warm_pool_size
        ),
        ("default", 0)
    );
    let id = f.create(&f.a, json!({})).await.id;
    f.service.record_request(
        "GET",
        "/v1/sandboxes/{id}",
        200,
        std::time::Duration::from_millis(3),
    );
    f.service.record_error(ErrorCode::SandboxNotFound);
    let metrics = f.service.render_metrics(&f.admin).expect("metrics");
    for needle in [
        "paddock_sandboxes{state=\"running\"} 1",
        "paddock_sandbox_create_seconds_count{source=\"boot\"} 1",
        "route=\"/v1/sandboxes/{id}\"",
        "paddock_api_errors_total{code=\"sandbox_not_found\"} 1",
    ] {
        assert!(metrics.contains(needle), "no {needle} in:\n{metrics}");
    }

    // Secrets belong to their tenant; a bad name is named.
    let made = f
        .service
        .create_secret(
            &f.a,
            body(json!({"name": "GH", "value": "t0k3n", "hosts": ["api.github.com"]})),
        )
        .await
        .expect("secret");
    assert_eq!(made.name, "GH");
    let e = error(
        f.service
            .create_secret(
                &f.a,
                body(json!({"name": "bad name", "value": "x", "hosts": ["a.example"]})),
            )
            .await,
    );
    assert_eq!(e.field.as_deref(), Some("name"));
    assert_eq!(f.service.list_secrets(&f.a).await.expect("list").secrets.len(), 1);
    f.service.delete_secret(&f.a, "GH").await.expect("delete");
    assert_eq!(
        code(f.service.delete_secret(&f.a, "GH").await),
        ErrorCode::SecretNotFound
    );
    let actions: Vec<String> = f.rows("secret.").await.into_iter().map(|r| r.action).collect();
    assert_eq!(actions, ["secret.create", "secret.delete"]);
    assert!(
        !format!("{:?}", f.rows("secret.").await).contains("t0k3n"),
        "a secret's value is never recorded"
    );

    // Without an egress proxy no sandbox has a network to read or change.
    assert_eq!(
        code(f.service.get_network(&f.a, &id).await),
        ErrorCode::InvalidRequest
    );
    assert_eq!(
        code(
            f.service
                .set_network(&f.a, &id, body(json!({"secrets": []})))
                .await
        ),
        ErrorCode::InvalidRequest
    );
    f.finish().await;
}
