//! Tenant quotas: refusals name the quota, are recorded, boot nothing, and concurrent requests
//! cannot overshoot; stopped sandboxes count as sandboxes but not as memory.

use paddock_control::Principal;
use paddock_types::api::{ErrorCode, TenantQuotaBody};
use serde_json::json;

use crate::fixture::{body, code, error, sid, Fixture};

async fn quota(f: &Fixture, tenant: &str, quota: serde_json::Value) {
    let quota: TenantQuotaBody = body(quota);
    f.service
        .set_tenant_quota(&f.admin, tenant, quota)
        .await
        .expect("set the quota");
}

async fn usage(f: &Fixture, p: &Principal) -> paddock_types::api::TenantUsageBody {
    f.service
        .get_tenant(p, &p.tenant)
        .await
        .expect("the tenant reads itself")
        .usage
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_quota_refuses_names_itself_and_frees_on_kill() {
    let f = Fixture::start().await;
    quota(&f, "tenant-a", json!({"max_sandboxes": 2})).await;
    let first = f.create(&f.a, json!({})).await.id;
    f.create(&f.a, json!({})).await;
    let e = error(f.try_create(&f.a, json!({})).await);
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::QuotaExceeded, Some("max_sandboxes"))
    );
    assert!(e.message.contains("sandboxes"), "{e:?}");
    assert_eq!(f.backend.stats().created, 2, "a refused create boots nothing");
    assert_eq!(usage(&f, &f.a).await.sandboxes, 2);
    let refused = f.rows("sandbox.create").await;
    let refused: Vec<_> = refused.iter().filter(|r| r.outcome == "quota_exceeded").collect();
    assert_eq!(refused.len(), 1);
    assert_eq!(
        (
            refused[0].detail["field"].as_str(),
            refused[0].sandbox_id.as_deref()
        ),
        (Some("max_sandboxes"), None)
    );
    f.service.kill_sandbox(&f.a, &first).await.expect("kill");
    f.create(&f.a, json!({})).await;
    assert_eq!(
        code(f.try_create(&f.a, json!({})).await),
        ErrorCode::QuotaExceeded
    );
    quota(&f, "tenant-a", json!({"max_sandboxes": 3})).await;
    f.create(&f.a, json!({})).await;
    // Other tenants are not affected.
    for _ in 0..4 {
        f.create(&f.b, json!({})).await;
    }
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_snapshots_and_volumes_cannot_overshoot() {
    let f = Fixture::start().await;
    quota(
        &f,
        "tenant-a",
        json!({"max_sandboxes": 2, "max_snapshots": 2, "max_volumes": 2}),
    )
    .await;
    let attempts: Vec<_> = (0..6)
        .map(|_| {
            let (service, p) = (f.service.clone(), f.a.clone());
            tokio::spawn(async move { service.create_sandbox(&p, body(json!({}))).await })
        })
        .collect();
    let mut created = Vec::new();
    for attempt in attempts {
        match attempt.await.expect("joined") {
            Ok(info) => created.push(info.id),
            Err(e) => assert_eq!(e.code, ErrorCode::QuotaExceeded, "{e:?}"),
        }
    }
    assert_eq!(created.len(), 2);
    assert_eq!(f.backend.stats().live, 2);
    let id = sid(&created[0]);
    let snapshots: Vec<_> = (0..6)
        .map(|_| {
            let (service, p, id) = (f.service.clone(), f.a.clone(), id.clone());
            tokio::spawn(async move { service.create_snapshot(&p, &id, body(json!({}))).await })
        })
        .collect();
    let mut taken = 0;
    for attempt in snapshots {
        match attempt.await.expect("joined") {
            Ok(_) => taken += 1,
            Err(e) => assert_eq!(
                (e.code, e.field.as_deref()),
                (ErrorCode::QuotaExceeded, Some("max_snapshots"))
            ),
        }
    }
    assert_eq!(taken, 2);
    let volumes: Vec<_> = (0..6)
        .map(|i| {
            let (service, p) = (f.service.clone(), f.a.clone());
            tokio::spawn(async move {
                service
                    .create_volume(&p, body(json!({"name": format!("v{i}")})))
                    .await
            })
        })
        .collect();
    let mut made = 0;
    for attempt in volumes {
        match attempt.await.expect("joined") {
            Ok(_) => made += 1,
            Err(e) => assert_eq!(
                (e.code, e.field.as_deref()),
                (ErrorCode::QuotaExceeded, Some("max_volumes"))
            ),
        }
    }
    assert_eq!(made, 2);
    assert_eq!(f.backend.stats().volumes, 2, "a refused volume leaves no storage");
    let u = usage(&f, &f.a).await;
    assert_eq!((u.sandboxes, u.snapshots, u.volumes), (2, 2, 2));
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_cpu_quotas_sum_the_live_sandboxes_limits() {
    let f = Fixture::start().await;
    quota(&f, "tenant-a", json!({"max_memory": "1G", "max_cpus": 1.5})).await;
    f.create(&f.a, json!({"limits": {"memory": "768M", "cpus": 1}}))
        .await;
    let e = error(
        f.try_create(&f.a, json!({"limits": {"memory": "512M", "cpus": 0.5}}))
            .await,
    );
    assert_eq!(e.field.as_deref(), Some("max_memory"));
    assert_eq!(
        code(f.try_create(&f.a, json!({"limits": {"cpus": 0.5}})).await),
        ErrorCode::QuotaExceeded,
        "the default 1G memory does not fit"
    );
    f.create(&f.a, json!({"limits": {"memory": "256M", "cpus": 0.5}}))
        .await;
    let e = error(
        f.try_create(&f.a, json!({"limits": {"memory": "32M", "cpus": 0.1}}))
            .await,
    );
    assert_eq!(e.code, ErrorCode::QuotaExceeded);
    let u = usage(&f, &f.a).await;
    assert_eq!((u.memory_bytes, u.cpus), (1 << 30, 1.5));
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_sandbox_counts_as_a_sandbox_and_its_resume_must_fit_the_memory_quota() {
    let f = Fixture::start().await;
    quota(&f, "tenant-a", json!({"max_sandboxes": 2, "max_memory": "1G"})).await;
    let id = f.create(&f.a, json!({})).await.id;
    f.service.stop_sandbox(&f.a, &id).await.expect("stop");
    let other = f.create(&f.a, json!({})).await.id;
    let e = error(f.try_create(&f.a, json!({"limits": {"memory": "32M"}})).await);
    assert_eq!(e.field.as_deref(), Some("max_sandboxes"));
    let u = usage(&f, &f.a).await;
    assert_eq!((u.sandboxes, u.memory_bytes), (2, 1 << 30));
    let e = error(f.service.resume_sandbox(&f.a, &id).await);
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::QuotaExceeded, Some("max_memory"))
    );
    let still = f.service.get_sandbox(&f.a, &id).await.expect("get");
    assert_eq!(
        still.state,
        paddock_types::api::SandboxStateBody::Stopped,
        "a refused resume keeps it stopped"
    );
    f.service.kill_sandbox(&f.a, &other).await.expect("kill");
    f.service.resume_sandbox(&f.a, &id).await.expect("resume");
    let resumes: Vec<String> = f
        .rows("sandbox.resume")
        .await
        .into_iter()
        .map(|r| r.outcome)
        .collect();
    assert_eq!(
        resumes,
        ["quota_exceeded", "ok"],
        "the refused resume is recorded too"
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_the_quota_cannot_take_is_refused_before_anything_is_made() {
    let f = Fixture::start().await;
    quota(&f, "tenant-a", json!({"max_sandboxes": 2})).await;
    let id = f.create(&f.a, json!({})).await.id;
    let before = f.backend.stats();
    let e = error(f.service.fork_sandbox(&f.a, &id, body(json!({"count": 2}))).await);
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::QuotaExceeded, Some("max_sandboxes"))
    );
    let after = f.backend.stats();
    assert_eq!((after.created, after.snapshots), (before.created, 0));
    let rows = f.rows("sandbox.fork").await;
    assert_eq!((rows.len(), rows[0].outcome.as_str()), (1, "quota_exceeded"));
    f.service
        .fork_sandbox(&f.a, &id, body(json!({"count": 1})))
        .await
        .expect("one copy fits");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_storage_quota_charges_disks_volumes_and_imports() {
    let f = Fixture::with(|c| c.default_limits.disk = Some(paddock_types::ByteSize::mib(100))).await;
    quota(&f, "tenant-a", json!({"max_storage": "250M"})).await;
    f.create(&f.a, json!({})).await;
    f.service
        .create_volume(&f.a, body(json!({"name": "v", "size": "100M"})))
        .await
        .expect("fits");
    let e = error(
        f.service
            .create_volume(&f.a, body(json!({"name": "w", "size": "100M"})))
            .await,
    );
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::QuotaExceeded, Some("max_storage"))
    );
    let e = error(f.try_create(&f.a, json!({})).await);
    assert_eq!(e.field.as_deref(), Some("max_storage"));
    // An import may be no larger than the storage left (50M here).
    let big = vec![0u8; 60 << 20];
    let e = error(
        f.service
            .import_snapshot(&f.a, None, Default::default(), crate::fixture::bytes_body(&big))
            .await,
    );
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::QuotaExceeded, Some("max_storage"))
    );
    assert_eq!(f.rows("snapshot.import").await[0].outcome, "quota_exceeded");
    assert_eq!(f.backend.stats().volumes, 1);
    f.finish().await;
}
