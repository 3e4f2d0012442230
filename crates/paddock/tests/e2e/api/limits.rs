//! What a tenant may ask for, attacked as a hostile client through the REST API of an in-process
//! service on the real native backend: limits are bounded by the host (maxima derived as `paddock
//! serve` derives them) and by absolute minima, refused with `invalid_request` naming the field and
//! never answered 500; every sandbox gets a CPU weight and, where the hierarchy offers one, a block
//! I/O weight.

use std::path::Path;

use serde_json::{json, Value};

use crate::support::{
    harness::{Client, Harness},
    skip,
};

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
fn limits_outside_the_hosts_bounds_are_refused_naming_the_field() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("asker").await;
        // The probes (this host: pid_max 32768, 2 CPUs), then the minima.
        for (limits, field) in [
            (json!({"pids": 4_000_000}), "limits.pids"),
            (json!({"pids": 10_000_000}), "limits.pids"),
            (json!({"memory": "1"}), "limits.memory"),
            (json!({"memory": "1T"}), "limits.memory"),
            (json!({"cpus": 1000}), "limits.cpus"),
            (json!({"cpus": 0}), "limits.cpus"),
            (json!({"pids": 1}), "limits.pids"),
            (json!({"pids": 0}), "limits.pids"),
            (json!({"disk": "1"}), "limits.disk"),
            (json!({"disk": "100T"}), "limits.disk"),
            (json!({"memory": "16M"}), "limits.memory"),
        ] {
            let r = a.post("/v1/sandboxes", json!({ "limits": limits })).await;
            let body = r.err(400, "invalid_request");
            assert_eq!(body["field"], field, "{limits}: {body}");
        }
        assert!(sandbox_ids(&a, "all").await.is_empty(), "nothing was created");
        // The smallest allowed sandbox runs a command.
        let id = a
            .create_sandbox(json!({"limits": {"memory": "32M", "pids": 8, "disk": "16M"}}))
            .await;
        assert_eq!(a.sh(&id, "echo small | cat").await, "small\n");
        // A fork asks for its source's limits: checked like a create.
        a.post(&format!("/v1/sandboxes/{id}/fork"), json!({"count": 1}))
            .await
            .ok(201);
    });
}

#[test]
fn any_limits_are_answered_201_or_400_never_500() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use std::cell::Cell;
    let h = Harness::start();
    let a = h.block_on(h.admin.new_tenant("fuzzer"));
    // Half of each within this host's bounds, half anywhere (edges of the bounds included).
    let size = |fits: std::ops::Range<u64>| {
        prop_oneof![
            1 => Just(Value::Null),
            3 => fits.prop_map(Value::from),
            1 => any::<u64>().prop_map(Value::from),
            2 => prop::sample::select(vec!["0", "1", "15M", "16M", "31M", "32M", "1T", "16E", "-1", "x"])
                .prop_map(Value::from),
        ]
    };
    let pids = prop_oneof![
        1 => Just(Value::Null),
        3 => (8u64..=4096).prop_map(Value::from),
        1 => any::<u32>().prop_map(Value::from),
        2 => prop::sample::select(vec![0u64, 1, 7, 8192, 8193, 4_194_304, 4_194_305, 10_000_000])
            .prop_map(Value::from),
    ];
    let cpus = prop_oneof![
        1 => Just(Value::Null),
        3 => (10u32..=2000).prop_map(|m| Value::from(f64::from(m) / 1000.0)),
        2 => prop::sample::select(vec![0.0, 0.001, 2.001, 1000.0, 1024.0, 5000.0, -1.0])
            .prop_map(Value::from),
    ];
    let strategy = (size(32 << 20..(4 << 30)), cpus, pids, size(16 << 20..(4 << 30)));
    // A fixed seed: the same cases on every run.
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 40,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let (created, refused) = (Cell::new(0), Cell::new(0));
    runner
        .run(&strategy, |(memory, cpus, pids, disk)| {
            let mut limits = serde_json::Map::new();
            for (k, v) in [("memory", memory), ("cpus", cpus), ("pids", pids), ("disk", disk)] {
                if !v.is_null() {
                    limits.insert(k.to_owned(), v);
                }
            }
            let body = json!({ "limits": limits });
            let r = h.block_on(a.post("/v1/sandboxes", body.clone()));
            prop_assert!(
                r.status == 201 || (r.status == 400 && r.code() == "invalid_request"),
                "{body}: {r:?}"
            );
            if r.status == 201 {
                created.set(created.get() + 1);
                let id = r.json()["id"].as_str().expect("id").to_owned();
                h.block_on(a.delete(&format!("/v1/sandboxes/{id}"))).ok(204);
            } else {
                refused.set(refused.get() + 1);
                prop_assert!(
                    r.json()["field"]
                        .as_str()
                        .is_some_and(|f| f.starts_with("limits.")),
                    "{body}: {r:?}"
                );
            }
            Ok(())
        })
        .expect("every answer is 201 or a 400 naming a limit");
    // Both kinds of answer were exercised.
    assert!(
        created.get() >= 5 && refused.get() >= 5,
        "{} created, {} refused",
        created.get(),
        refused.get()
    );
}

#[test]
fn every_sandbox_gets_a_cpu_weight_and_an_io_weight_where_offered() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("weighted").await;
        let plain = a.create_sandbox(json!({})).await;
        let half = a.create_sandbox(json!({"limits": {"cpus": 0.5}})).await;
        let parent = &h.env().cgroup_parent;
        let read = |hierarchy: &str, id: &str, file: &str| {
            std::fs::read_to_string(
                Path::new("/sys/fs/cgroup")
                    .join(hierarchy)
                    .join(parent)
                    .join(id)
                    .join(file),
            )
            .map(|s| s.trim().to_owned())
        };
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        if v2 {
            assert_eq!(read("", &plain, "cpu.weight").expect("cpu.weight"), "100");
            assert_eq!(read("", &half, "cpu.weight").expect("cpu.weight"), "50");
        } else {
            // No CPU quota: still one CPU's share, so a busy sandbox cannot starve the others.
            assert_eq!(read("cpu", &plain, "cpu.shares").expect("cpu.shares"), "1024");
            assert_eq!(read("cpu", &plain, "cpu.cfs_quota_us").expect("quota"), "-1");
            assert_eq!(read("cpu", &half, "cpu.shares").expect("cpu.shares"), "512");
        }
        let io = if v2 {
            ["io.bfq.weight", "io.weight"]
                .into_iter()
                .find_map(|f| read("", &plain, f).ok())
        } else if ["blkio.bfq.weight", "blkio.weight"].iter().any(|f| {
            // Offered where the sandboxes' parent cgroup has a weight file (BFQ on v1); the
            // blkio hierarchy alone offers only throttling.
            Path::new("/sys/fs/cgroup/blkio").join(parent).join(f).exists()
        }) {
            let w = ["blkio.bfq.weight", "blkio.weight"]
                .into_iter()
                .find_map(|f| read("blkio", &plain, f).ok());
            assert!(
                w.is_some(),
                "the blkio hierarchy offers a weight but the sandbox has none"
            );
            w
        } else {
            skip("the I/O weight check: this host's cgroups offer no block I/O weight");
            None
        };
        if let Some(w) = io {
            assert!(w.contains("100"), "default I/O weight: {w}");
        }
        // Its processes are in its blkio cgroup too (weights act on them).
        if !v2 && Path::new("/sys/fs/cgroup/blkio/tasks").exists() {
            let procs = read("blkio", &plain, "cgroup.procs").expect("procs");
            assert!(!procs.is_empty(), "the sandbox's init joined its blkio cgroup");
        }
    });
}
