//! What a tenant may run and store, attacked as a hostile client through the REST API of an
//! in-process service on the real native backend: a tenant's quota (set by the admin, shown with its
//! usage) caps its sandboxes; quotas count every stored thing (stopped sandboxes, snapshots,
//! checkpoints, imports, volumes with and without a size, storage bytes) on every path that adds one
//! (create, stop + create, resume, fork with a count, snapshot, checkpoint, import, volume create),
//! also under concurrent requests, refuse with `quota_exceeded` naming the quota, leave nothing behind
//! when they refuse, and deleting frees them.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::harness::{Client, Harness, Reply};

/// How many requests race in the concurrency tests.
const RACERS: usize = 6;

async fn usage(c: &Client, tenant: &str) -> Value {
    c.get(&format!("/v1/tenants/{tenant}")).await.ok(200)["usage"].clone()
}

/// Expects a `quota_exceeded` refusal naming `quota`.
#[track_caller]
fn refused(r: &Reply, quota: &str) {
    let body = r.err(429, "quota_exceeded");
    assert_eq!(body["field"], quota, "{body}");
}

async fn export(c: &Client, snapshot: &str) -> Vec<u8> {
    let r = Client::send(c.request(Method::GET, &format!("/v1/snapshots/{snapshot}/export"))).await;
    assert_eq!(r.status, 200, "{r:?}");
    r.body.to_vec()
}

/// Uploads `archive`. A refusal (quota, name) is answered before the body is read, after which the
/// server closes the connection: this one is not kept for the next request.
async fn import(c: &Client, archive: Vec<u8>) -> Reply {
    Client::send(
        c.request(Method::POST, "/v1/snapshots/import")
            .header("content-type", "application/x-tar")
            .header("connection", "close")
            .body(archive),
    )
    .await
}

/// Names under `<pool>/<dir>` (subvolumes of snapshots, volumes, imports being unpacked).
fn pool_entries(h: &Harness, dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(h.env().state().join("pool").join(dir))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Ids of the tenant's sandboxes in `state` (`all`, `running`, `stopped`).
async fn sandbox_ids(c: &Client, state: &str) -> Vec<String> {
    let list = c.get_q("/v1/sandboxes", &[("state", state)]).await.ok(200);
    list["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_owned())
        .collect()
}

#[test]
fn stopped_sandboxes_snapshots_and_volumes_count_against_the_quota() {
    let h = Harness::start();
    h.block_on(async {
        h.admin
            .put(
                "/v1/tenants/hoarder/quota",
                json!({"max_sandboxes": 3, "max_snapshots": 3, "max_volumes": 2}),
            )
            .await
            .ok(200);
        let a = h.admin.new_tenant("hoarder").await;

        // The probe: stopping sandboxes and creating more must not get past max_sandboxes.
        let s1 = a.create_sandbox(json!({})).await;
        let s2 = a.create_sandbox(json!({})).await;
        a.post(&format!("/v1/sandboxes/{s2}/stop"), Value::Null)
            .await
            .ok(200);
        let s3 = a.create_sandbox(json!({})).await;
        refused(&a.post("/v1/sandboxes", json!({})).await, "max_sandboxes");
        a.post(&format!("/v1/sandboxes/{s3}/stop"), Value::Null)
            .await
            .ok(200);
        refused(&a.post("/v1/sandboxes", json!({})).await, "max_sandboxes");
        assert_eq!(usage(&a, "hoarder").await["sandboxes"], 3);
        // Resuming a stopped one adds no sandbox: it is admitted.
        a.post(&format!("/v1/sandboxes/{s3}/resume"), Value::Null)
            .await
            .ok(200);

        // A fork is refused before anything is made when the quota cannot take every copy.
        a.delete(&format!("/v1/sandboxes/{s3}")).await.ok(204);
        let before = sandbox_ids(&a, "all").await.len();
        refused(
            &a.post(&format!("/v1/sandboxes/{s1}/fork"), json!({"count": 2}))
                .await,
            "max_sandboxes",
        );
        assert_eq!(sandbox_ids(&a, "all").await.len(), before, "no copy was made");
        assert_eq!(
            usage(&a, "hoarder").await["snapshots"],
            0,
            "a refused fork takes no snapshot"
        );
        assert!(pool_entries(&h, "snapshots").is_empty());
        let forked = a
            .post(&format!("/v1/sandboxes/{s1}/fork"), json!({"count": 1}))
            .await
            .ok(201);
        let copy = forked["sandboxes"][0]["id"].as_str().expect("copy").to_owned();
        refused(
            &a.post(&format!("/v1/sandboxes/{s1}/fork"), json!({"count": 1}))
                .await,
            "max_sandboxes",
        );

        // Snapshots, checkpoints and imports share max_snapshots.
        let snap = a
            .post(&format!("/v1/sandboxes/{s1}/snapshots"), json!({"name": "one"}))
            .await
            .ok(201);
        let snap = snap["id"].as_str().expect("id").to_owned();
        a.post(&format!("/v1/sandboxes/{s1}/checkpoint"), Value::Null)
            .await
            .ok(201);
        a.post(&format!("/v1/sandboxes/{copy}/snapshots"), json!({}))
            .await
            .ok(201);
        refused(
            &a.post(&format!("/v1/sandboxes/{s1}/snapshots"), json!({})).await,
            "max_snapshots",
        );
        refused(
            &a.post(&format!("/v1/sandboxes/{copy}/checkpoint"), Value::Null)
                .await,
            "max_snapshots",
        );
        let archive = export(&a, &snap).await;
        refused(&import(&a, archive.clone()).await, "max_snapshots");
        refused(
            &a.post(&format!("/v1/sandboxes/{s1}/fork"), json!({"count": 1}))
                .await,
            "max_sandboxes",
        );
        assert_eq!(usage(&a, "hoarder").await["snapshots"], 3);
        assert_eq!(
            pool_entries(&h, "snapshots").len(),
            3,
            "refusals left nothing behind"
        );
        assert!(pool_entries(&h, "imports").is_empty());
        // Deleting one frees its place, for an import too.
        a.delete(&format!("/v1/snapshots/{snap}")).await.ok(204);
        import(&a, archive).await.ok(201);
        refused(
            &import(&a, export(&a, &forked_snapshot(&a).await).await).await,
            "max_snapshots",
        );

        // Volumes count whether or not they have a size.
        let v1 = a
            .post("/v1/volumes", json!({"name": "sized", "size": "64M"}))
            .await
            .ok(201);
        let v2 = a.post("/v1/volumes", json!({"name": "unsized"})).await.ok(201);
        assert!(
            v2["size_bytes"].as_u64().is_some(),
            "a volume without a size gets the default size: {v2}"
        );
        refused(
            &a.post("/v1/volumes", json!({"name": "third"})).await,
            "max_volumes",
        );
        refused(
            &a.post("/v1/volumes", json!({"name": "third", "size": "1M"}))
                .await,
            "max_volumes",
        );
        assert_eq!(pool_entries(&h, "volumes").len(), 2);
        a.delete(&format!("/v1/volumes/{}", v1["id"].as_str().expect("id")))
            .await
            .ok(204);
        a.post("/v1/volumes", json!({"name": "third"})).await.ok(201);

        // Every refusal is on record.
        let rows = a.audit_rows(&[("tenant", "hoarder")]).await;
        for action in [
            "sandbox.create",
            "sandbox.fork",
            "snapshot.create",
            "sandbox.checkpoint",
            "snapshot.import",
            "volume.create",
        ] {
            assert!(
                rows.iter()
                    .any(|r| r["action"] == action && r["outcome"] == "quota_exceeded"),
                "no refused {action} row"
            );
        }
    });
}

/// Any snapshot of the tenant (to export one more archive).
async fn forked_snapshot(c: &Client) -> String {
    let list = c.get("/v1/snapshots").await.ok(200);
    list["snapshots"][0]["id"]
        .as_str()
        .expect("a snapshot")
        .to_owned()
}

#[test]
fn concurrent_snapshots_volumes_and_forks_cannot_overshoot_the_quota() {
    let h = Harness::start();
    h.block_on(async {
        h.admin
            .put(
                "/v1/tenants/racer/quota",
                json!({"max_snapshots": 2, "max_volumes": 2, "max_sandboxes": 3}),
            )
            .await
            .ok(200);
        let a = h.admin.new_tenant("racer").await;
        let id = a.create_sandbox(json!({})).await;

        let race = |path: String, bodies: Vec<Value>| {
            let a = a.clone();
            async move {
                let tasks: Vec<_> = bodies
                    .into_iter()
                    .map(|body| {
                        let (a, path) = (a.clone(), path.clone());
                        tokio::spawn(async move { a.post(&path, body).await })
                    })
                    .collect();
                let mut replies = Vec::new();
                for t in tasks {
                    replies.push(t.await.expect("request task"));
                }
                replies
            }
        };
        let check = |replies: &[Reply], quota: &str, admitted: usize| {
            for r in replies {
                assert!(
                    r.status == 201 || (r.status == 429 && r.json()["field"] == quota),
                    "{r:?}"
                );
            }
            let ok = replies.iter().filter(|r| r.status == 201).count();
            assert_eq!(ok, admitted, "{quota}: {replies:?}");
        };

        let snaps = race(format!("/v1/sandboxes/{id}/snapshots"), vec![json!({}); RACERS]).await;
        check(&snaps, "max_snapshots", 2);
        assert_eq!(
            pool_entries(&h, "snapshots").len(),
            2,
            "refused captures were removed"
        );

        let bodies = (0..RACERS)
            .map(|i| {
                if i % 2 == 0 {
                    json!({"name": format!("v{i}")})
                } else {
                    json!({"name": format!("v{i}"), "size": "16M"})
                }
            })
            .collect();
        let vols = race("/v1/volumes".to_owned(), bodies).await;
        check(&vols, "max_volumes", 2);
        assert_eq!(
            pool_entries(&h, "volumes").len(),
            2,
            "refused volumes were removed"
        );

        // Forks racing for the last two places: each copy is checked when it is recorded, and a fork
        // that cannot make every copy makes none. The snapshot quota is full: a fork takes no
        // snapshot, so that does not stop it.
        let forks = race(format!("/v1/sandboxes/{id}/fork"), vec![json!({"count": 1}); 3]).await;
        for r in &forks {
            assert!(
                r.status == 201 || (r.status == 429 && r.code() == "quota_exceeded"),
                "{r:?}"
            );
        }
        let live = sandbox_ids(&a, "running").await;
        assert!(live.len() <= 3, "{live:?}");
        let u = usage(&a, "racer").await;
        assert!(u["sandboxes"].as_u64() <= Some(3), "{u}");
        assert!(u["snapshots"].as_u64() <= Some(2), "{u}");
    });
}

#[test]
fn storage_quota_charges_disks_snapshots_volumes_and_imports() {
    let h = Harness::start();
    h.block_on(async {
        h.admin
            .put("/v1/tenants/filler/quota", json!({"max_storage": "1G"}))
            .await
            .ok(200);
        let a = h.admin.new_tenant("filler").await;
        let id = a.create_sandbox(json!({"limits": {"disk": "256M"}})).await;
        assert_eq!(usage(&a, "filler").await["storage_bytes"], 256u64 << 20);

        // A volume without a size is charged (and limited to) the default disk size: more than 1G here.
        refused(
            &a.post("/v1/volumes", json!({"name": "big"})).await,
            "max_storage",
        );
        let vol = a
            .post("/v1/volumes", json!({"name": "v", "size": "256M"}))
            .await
            .ok(201);
        assert_eq!(usage(&a, "filler").await["storage_bytes"], 512u64 << 20);

        // A snapshot is charged what the sandbox had written (its own writes, at least 16 MiB here).
        a.sh(&id, "head -c 16777216 /dev/urandom > /home/user/data && sync")
            .await;
        let snap = a
            .post(&format!("/v1/sandboxes/{id}/snapshots"), json!({}))
            .await
            .ok(201);
        let charged = snap["storage_bytes"].as_u64().expect("charged");
        assert!(
            (16 << 20..=256 << 20).contains(&charged),
            "a snapshot of 16 MiB of writes charged {charged}"
        );
        let used = usage(&a, "filler").await["storage_bytes"]
            .as_u64()
            .expect("bytes");
        assert_eq!(used, (512 << 20) + charged);

        // A second sandbox of 512M no longer fits once the snapshot counts.
        refused(
            &a.post("/v1/sandboxes", json!({"limits": {"disk": "512M"}})).await,
            "max_storage",
        );
        // Each copy of a fork is charged the source's disk limit (and what it starts from): two
        // copies of 256M do not fit, and nothing is made.
        refused(
            &a.post(&format!("/v1/sandboxes/{id}/fork"), json!({"count": 2}))
                .await,
            "max_storage",
        );
        assert_eq!(sandbox_ids(&a, "all").await.len(), 1, "no copy was made");
        assert_eq!(
            usage(&a, "filler").await["storage_bytes"].as_u64(),
            Some(used),
            "a refused fork charges nothing"
        );

        // An import may be no larger than the room left.
        let archive = export(&a, snap["id"].as_str().expect("id")).await;
        assert!(archive.len() > 16 << 20);
        h.admin
            .put(
                "/v1/tenants/filler/quota",
                json!({"max_storage": used + (1 << 20)}),
            )
            .await
            .ok(200);
        refused(&import(&a, archive.clone()).await, "max_storage");
        assert!(pool_entries(&h, "imports").is_empty(), "nothing staged is left");
        assert_eq!(pool_entries(&h, "snapshots").len(), 1);

        // An archive of exactly the room left fits: it is charged its size, and what btrfs spends
        // beside the files (its metadata) is not held against it.
        h.admin
            .put(
                "/v1/tenants/filler/quota",
                json!({"max_storage": used + archive.len() as u64}),
            )
            .await
            .ok(200);
        let exact = import(&a, archive.clone()).await.ok(201);
        assert_eq!(exact["storage_bytes"].as_u64(), Some(archive.len() as u64));
        a.delete(&format!("/v1/snapshots/{}", exact["id"].as_str().expect("id")))
            .await
            .ok(204);

        // Deleting frees: the volume's 256M make room for the import.
        a.delete(&format!("/v1/volumes/{}", vol["id"].as_str().expect("id")))
            .await
            .ok(204);
        let imported = import(&a, archive.clone()).await.ok(201);
        assert_eq!(
            imported["storage_bytes"].as_u64(),
            Some(archive.len() as u64),
            "an import is charged its archive's size"
        );
    });
}

#[test]
fn quotas_per_tenant() {
    let h = Harness::start();
    h.block_on(async {
        let admin = &h.admin;
        let quota = admin
            .put("/v1/tenants/quota-t/quota", json!({"max_sandboxes": 2}))
            .await
            .ok(200);
        assert_eq!(
            (quota["name"].as_str(), quota["quota"]["max_sandboxes"].as_u64()),
            (Some("quota-t"), Some(2))
        );
        let q = admin.new_tenant("quota-t").await;
        let first = q.create_sandbox(json!({})).await;
        q.create_sandbox(json!({})).await;
        let e = q
            .post("/v1/sandboxes", json!({}))
            .await
            .err(429, "quota_exceeded");
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains("sandboxes")),
            "{e}"
        );
        let usage = q.get("/v1/tenants/quota-t").await.ok(200);
        assert_eq!(usage["usage"]["sandboxes"], 2, "{usage}");
        // A refused create leaves nothing behind and no row claiming it happened.
        assert_eq!(
            q.get("/v1/sandboxes").await.ok(200)["sandboxes"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        // Ending one frees its place.
        q.delete(&format!("/v1/sandboxes/{first}")).await.ok(204);
        q.create_sandbox(json!({})).await;
        q.post("/v1/sandboxes", json!({}))
            .await
            .err(429, "quota_exceeded");
        // Raising the quota takes effect at once; other tenants are not affected.
        admin
            .put("/v1/tenants/quota-t/quota", json!({"max_sandboxes": 3}))
            .await
            .ok(200);
        q.create_sandbox(json!({})).await;
        let other = admin.new_tenant("unlimited").await;
        for _ in 0..4 {
            other.create_sandbox(json!({})).await;
        }

        // Concurrent creates cannot overshoot the quota together.
        admin
            .put("/v1/tenants/burst-t/quota", json!({"max_sandboxes": 2}))
            .await
            .ok(200);
        let burst = admin.new_tenant("burst-t").await;
        let attempts: Vec<_> = (0..6)
            .map(|_| {
                let burst = burst.clone();
                tokio::spawn(async move { burst.post("/v1/sandboxes", json!({})).await })
            })
            .collect();
        let mut statuses = Vec::new();
        for attempt in attempts {
            let r = attempt.await.expect("create task");
            assert!(
                r.status == 201 || (r.status == 429 && r.code() == "quota_exceeded"),
                "{r:?}"
            );
            statuses.push(r.status);
        }
        assert_eq!(statuses.iter().filter(|&&s| s == 201).count(), 2, "{statuses:?}");
        let live = burst.get("/v1/sandboxes").await.ok(200);
        assert_eq!(live["sandboxes"].as_array().map(Vec::len), Some(2), "{live}");

        // Memory: the sum of the live sandboxes' limits.
        admin
            .put("/v1/tenants/mem-t/quota", json!({"max_memory": "1G"}))
            .await
            .ok(200);
        let m = admin.new_tenant("mem-t").await;
        m.create_sandbox(json!({"limits": {"memory": "768M"}})).await;
        m.post("/v1/sandboxes", json!({"limits": {"memory": "512M"}}))
            .await
            .err(429, "quota_exceeded");
        m.post("/v1/sandboxes", json!({}))
            .await
            .err(429, "quota_exceeded");
        m.create_sandbox(json!({"limits": {"memory": "256M"}})).await;
        m.post("/v1/sandboxes", json!({"limits": {"memory": "32M"}}))
            .await
            .err(429, "quota_exceeded");
        let usage = m.get("/v1/tenants/mem-t").await.ok(200);
        assert_eq!(usage["usage"]["memory_bytes"], 1u64 << 30, "{usage}");
        // CPUs likewise.
        admin
            .put("/v1/tenants/cpu-t/quota", json!({"max_cpus": 1.5}))
            .await
            .ok(200);
        let c = admin.new_tenant("cpu-t").await;
        c.create_sandbox(json!({"limits": {"cpus": 1}})).await;
        c.post("/v1/sandboxes", json!({"limits": {"cpus": 1}}))
            .await
            .err(429, "quota_exceeded");
        c.create_sandbox(json!({"limits": {"cpus": 0.5}})).await;
        // Quota bodies are validated.
        admin
            .put("/v1/tenants/Bad Name/quota", json!({"max_sandboxes": 1}))
            .await
            .err(400, "invalid_request");
        admin
            .put("/v1/tenants/x/quota", json!({"max_memory": "lots"}))
            .await
            .err(400, "invalid_request");
    });
}
