//! Warm pools: the pool fills to its size, belongs to nobody until claimed, a create claims from it
//! (with the request's limits and environment applied), it refills, and the counts and metrics say
//! so.

use std::collections::BTreeSet;

use paddock_types::api::{ErrorCode, SandboxStateBody};
use serde_json::json;

use crate::fixture::{body, code, poll, sid, Fixture};

/// The `paddock_warm_pool_size` gauge of the default template.
fn pool_gauge(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with("paddock_warm_pool_size{") && l.contains("template=\"default\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Waits until two sandboxes are warm and `total` are live on the backend; the live ids.
async fn pool_ready(f: &Fixture, total: usize) -> BTreeSet<String> {
    poll(&format!("2 warm sandboxes of {total}"), || async {
        let metrics = f.service.render_metrics(&f.admin).expect("metrics");
        let ids: BTreeSet<String> = f.backend.sandbox_ids().iter().map(|id| id.to_string()).collect();
        (pool_gauge(&metrics) == Some(2) && ids.len() == total).then_some(ids)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pool_fills_serves_claims_and_refills() {
    let f = Fixture::with(|c| {
        if let Some(t) = c.templates.get_mut("default") {
            t.warm_pool_size = 2;
        }
    })
    .await;
    let warm = pool_ready(&f, 2).await;
    let metrics = f.service.render_metrics(&f.admin).expect("metrics");
    assert!(
        metrics.contains("paddock_warm_pool_target{template=\"default\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("paddock_sandboxes{state=\"warm\"} 2"),
        "{metrics}"
    );
    assert_eq!(
        f.service.list_templates(&f.a).await.expect("templates").templates[0].warm_pool_size,
        2
    );
    // A warm sandbox belongs to nobody: no tenant (not even the admin's) can reach it.
    for wid in &warm {
        for p in [&f.a, &f.admin] {
            assert_eq!(
                code(f.service.get_sandbox(p, &sid(wid)).await),
                ErrorCode::SandboxNotFound
            );
            assert_eq!(
                code(f.service.kill_sandbox(p, &sid(wid)).await),
                ErrorCode::SandboxNotFound
            );
            assert_eq!(
                code(f.exec(p, &sid(wid), json!({"argv": ["true"]})).await),
                ErrorCode::SandboxNotFound
            );
        }
    }
    assert!(
        f.rows("sandbox.").await.is_empty(),
        "warm boots are not tenants' actions"
    );

    // A create is a claim, with the request's limits, environment and labels.
    let info = f
        .create(
            &f.a,
            json!({"limits": {"memory": "300M"}, "env": {"FOO": "bar"}, "labels": {"via": "pool"}}),
        )
        .await;
    assert!(
        warm.contains(&info.id.to_string()),
        "{} was not one of the warm sandboxes {warm:?}",
        info.id
    );
    assert_eq!(info.state, SandboxStateBody::Running);
    assert_eq!(info.limits.memory.map(u64::from), Some(300 << 20));
    assert_eq!(info.labels["via"], "pool");
    assert_eq!(
        f.backend.memory_limit(&info.id.parse().expect("id")),
        Some(Some(300 << 20)),
        "the limit was applied to the claimed sandbox"
    );
    let usage = f.service.sandbox_usage(&f.a, &info.id).await.expect("usage");
    assert_eq!(usage.memory_limit_bytes, Some(300 << 20));
    assert_eq!(
        f.sh(&f.a, &info.id, "echo $FOO; whoami; hostname").await,
        format!("bar\nuser\n{}\n", info.id)
    );
    let rows = f.rows("sandbox.create").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].sandbox_id.as_deref(), rows[0].detail["source"].as_str()),
        (Some(info.id.as_str()), Some("pool"))
    );
    assert_eq!(rows[0].key_id.as_deref(), Some(f.a.key_id.as_str()));

    // The pool refills; concurrent creates never share a sandbox.
    let refilled = pool_ready(&f, 3).await;
    let attempts: Vec<_> = (0..4)
        .map(|_| {
            let (service, p) = (f.service.clone(), f.a.clone());
            tokio::spawn(async move { service.create_sandbox(&p, body(json!({}))).await })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for attempt in attempts {
        let info = attempt.await.expect("joined").expect("created");
        assert!(
            ids.insert(info.id.clone()),
            "a sandbox was handed out twice: {info:?}"
        );
    }
    assert!(
        ids.iter().any(|id| refilled.contains(id)),
        "some creates were claims"
    );
    let creates = f.rows("sandbox.create").await;
    for created in &ids {
        assert_eq!(
            creates
                .iter()
                .filter(|r| r.sandbox_id.as_deref() == Some(created.as_str()))
                .count(),
            1
        );
    }
    let claimed = 1 + ids.len();
    pool_ready(&f, claimed + 2).await;

    // A claim respects the tenant's quota and consumes nothing when refused.
    f.service
        .set_tenant_quota(&f.admin, "warm-q", body(json!({"max_sandboxes": 1})))
        .await
        .expect("quota");
    let q = f.tenant("warm-q").await;
    f.create(&q, json!({})).await;
    pool_ready(&f, claimed + 3).await;
    let before = f.backend.stats();
    assert_eq!(code(f.try_create(&q, json!({})).await), ErrorCode::QuotaExceeded);
    assert_eq!(f.backend.stats(), before, "a refused claim changed nothing");
    // A sandbox with volumes boots cold; killing a claimed one removes it, the warm ones stay.
    f.service
        .create_volume(&f.a, body(json!({"name": "v"})))
        .await
        .expect("volume");
    let cold = f
        .create(&f.a, json!({"volumes": [{"volume": "v", "path": "/data"}]}))
        .await;
    let source = f
        .rows("sandbox.create")
        .await
        .into_iter()
        .find(|r| r.sandbox_id.as_deref() == Some(cold.id.as_str()))
        .expect("its row");
    assert_eq!(source.detail["source"], "boot");
    f.service.kill_sandbox(&f.a, &info.id).await.expect("kill");
    assert!(!f.backend.sandbox_ids().iter().any(|id| id.as_str() == info.id));
    pool_ready(&f, claimed + 3).await;
    f.finish().await;
}
