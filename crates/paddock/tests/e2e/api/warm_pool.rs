//! Warm pools: a warm sandbox belongs to nobody until a create claims it; creates are served from
//! the pool, which refills.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{json, Value};

use crate::support::harness::{poll, Harness, Options};

use super::SOON;

/// Names of the sandboxes the backend runs for this environment (warm ones included).
fn run_dirs(h: &Harness) -> BTreeSet<String> {
    std::fs::read_dir(h.env().state().join("run"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("sb-"))
                .collect()
        })
        .unwrap_or_default()
}

fn pool_gauge(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with("paddock_warm_pool_size{") && l.contains("template=\"default\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Waits until two sandboxes are warm and `total` run; returns the running ones.
async fn pool_ready(h: &Harness, total: usize) -> BTreeSet<String> {
    poll(SOON, &format!("2 warm sandboxes of {total}"), || async {
        let metrics = h.admin.get("/metrics").await;
        assert_eq!(metrics.status, 200, "{metrics:?}");
        let dirs = run_dirs(h);
        (pool_gauge(&metrics.text()) == Some(2) && dirs.len() == total).then_some(dirs)
    })
    .await
}

#[test]
fn warm_pool_serves_creates_and_refills() {
    let h = Harness::with(Options {
        warm_pool: 2,
        ..Options::default()
    });
    h.block_on(async {
        let warm = pool_ready(&h, 2).await;
        let templates = h.admin.get("/v1/templates").await.ok(200);
        assert_eq!(
            templates["templates"],
            json!([{"name": "default", "warm_pool_size": 2}])
        );
        let a = h.admin.new_tenant("warm").await;
        // A warm sandbox belongs to nobody: no tenant can reach it before it is claimed.
        for wid in &warm {
            a.get(&format!("/v1/sandboxes/{wid}"))
                .await
                .err(404, "sandbox_not_found");
            a.post(&format!("/v1/sandboxes/{wid}/exec"), json!({"argv": ["true"]}))
                .await
                .err(404, "sandbox_not_found");
            a.delete(&format!("/v1/sandboxes/{wid}"))
                .await
                .err(404, "sandbox_not_found");
            h.admin
                .get(&format!("/v1/sandboxes/{wid}"))
                .await
                .err(404, "sandbox_not_found");
        }

        // A create is a claim, with the request's limits and environment applied.
        let info = a
            .post(
                "/v1/sandboxes",
                json!({"limits": {"memory": "300M"}, "env": {"FOO": "bar"}, "labels": {"via": "pool"}}),
            )
            .await
            .ok(201);
        let id = info["id"].as_str().expect("id").to_owned();
        assert!(
            warm.contains(&id),
            "{id} was not one of the warm sandboxes {warm:?}"
        );
        assert_eq!(info["state"], "running");
        assert_eq!(info["limits"]["memory"], 300u64 << 20);
        assert_eq!(info["labels"]["via"], "pool");
        let rows = a.audit_rows(&[("action", "sandbox.create")]).await;
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (
                rows[0]["sandbox_id"].as_str(),
                rows[0]["detail"]["source"].as_str()
            ),
            (Some(id.as_str()), Some("pool"))
        );
        // The limit is live on the claimed sandbox's cgroup (v1 memory hierarchy, or v2).
        let v1 = Path::new("/sys/fs/cgroup/memory")
            .join(&h.env().cgroup_parent)
            .join(&id);
        let file = if v1.exists() {
            v1.join("memory.limit_in_bytes")
        } else {
            Path::new("/sys/fs/cgroup")
                .join(&h.env().cgroup_parent)
                .join(&id)
                .join("memory.max")
        };
        let limit = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(
            limit.trim(),
            (300u64 << 20).to_string(),
            "the claimed sandbox's cgroup limit"
        );
        let usage = a.get(&format!("/v1/sandboxes/{id}/usage")).await.ok(200);
        assert_eq!(usage["memory_limit_bytes"], 300u64 << 20);
        let r = a
            .exec_json(&id, json!({"shell": "echo $FOO; id -un; hostname"}))
            .await;
        assert_eq!(r["stdout"], format!("bar\nuser\n{id}\n"));

        // The pool refills (the claimed one runs on, two are warm again).
        let refilled = pool_ready(&h, 3).await;
        let second = a.create_sandbox(json!({})).await;
        assert!(
            refilled.contains(&second) && second != id,
            "{second} not from the refilled pool"
        );
        // Concurrent creates never share a sandbox: some are claims, the rest boot.
        let attempts: Vec<_> = (0..4)
            .map(|_| {
                let a = a.clone();
                tokio::spawn(async move { a.post("/v1/sandboxes", json!({})).await.ok(201) })
            })
            .collect();
        let mut ids = BTreeSet::new();
        for attempt in attempts {
            let info = attempt.await.expect("create task");
            assert!(
                ids.insert(info["id"].as_str().expect("id").to_owned()),
                "a sandbox was handed out twice: {info}"
            );
        }
        let creates = a.audit_rows(&[("action", "sandbox.create")]).await;
        for created in &ids {
            let rows: Vec<&Value> = creates
                .iter()
                .filter(|r| r["sandbox_id"] == created.as_str())
                .collect();
            assert_eq!(rows.len(), 1, "{created}: {rows:?}");
        }
        // Two claimed before, these, and two warm.
        let claimed = 2 + ids.len();
        pool_ready(&h, claimed + 2).await;
        // A claim respects the tenant's quota and consumes nothing when refused.
        h.admin
            .put("/v1/tenants/warm-q/quota", json!({"max_sandboxes": 1}))
            .await
            .ok(200);
        let q = h.admin.new_tenant("warm-q").await;
        q.create_sandbox(json!({})).await;
        pool_ready(&h, claimed + 3).await;
        q.post("/v1/sandboxes", json!({}))
            .await
            .err(429, "quota_exceeded");
        assert_eq!(
            run_dirs(&h).len(),
            claimed + 3,
            "a refused claim changed the pool"
        );
        // Killing a claimed sandbox removes it; the warm ones stay.
        a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        assert!(!run_dirs(&h).contains(&id));
        assert_eq!(
            a.get(&format!("/v1/sandboxes/{id}")).await.ok(200)["state"],
            "killed"
        );
    });
}
