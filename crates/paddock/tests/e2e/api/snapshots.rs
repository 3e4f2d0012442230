//! Snapshots, step transactions (checkpoints and rollbacks), forks, creation from a snapshot, and
//! pause / resume through the API.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::harness::{poll, Client, Harness};

use super::SOON;

/// Snapshots, step transactions, forks, creation from a snapshot, and pause / resume through the API.
#[test]
fn snapshots_checkpoints_forks_and_pause() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("snapper").await;
        let b = h.admin.new_tenant("snoop").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            "cd /home/user && echo one > f && mkdir d && echo keep > d/k && chmod 600 f && ln -s f link",
        )
        .await;

        // Step transaction: checkpoint, a destructive step, rollback restores exactly.
        let cp = a
            .post(&format!("/v1/sandboxes/{id}/checkpoint"), json!(null))
            .await
            .ok(201);
        assert_eq!(cp["kind"], "checkpoint");
        let before = a
            .sh(
                &id,
                "cd /home/user && stat -c '%n %a %U %s' f d/k link && readlink link",
            )
            .await;
        a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await;
        a.sh(
            &id,
            "cd /home/user && echo two > f && rm -r d && chmod 644 f && echo new > g",
        )
        .await;
        let rolled = a
            .post(&format!("/v1/sandboxes/{id}/rollback"), json!(null))
            .await
            .ok(200);
        assert_eq!(rolled["id"], id.as_str(), "the id stays");
        let after = a
            .sh(
                &id,
                "cd /home/user && stat -c '%n %a %U %s' f d/k link && readlink link",
            )
            .await;
        assert_eq!(after, before, "content, modes, owners and symlinks restored");
        assert_eq!(a.sh(&id, "cat /home/user/f /home/user/d/k").await, "one\nkeep\n");
        assert_eq!(a.sh(&id, "test -e /home/user/g || echo gone").await, "gone\n");
        assert_eq!(
            a.sh(&id, "pgrep -x sleep || echo none").await,
            "none\n",
            "processes restart with a rollback"
        );
        // The rollback consumed the checkpoint.
        a.post(&format!("/v1/sandboxes/{id}/rollback"), json!(null))
            .await
            .err(404, "snapshot_not_found");
        // Commit drops a checkpoint and keeps the step.
        a.post(&format!("/v1/sandboxes/{id}/checkpoint"), json!(null))
            .await
            .ok(201);
        a.sh(&id, "echo kept > /home/user/step").await;
        a.post(&format!("/v1/sandboxes/{id}/commit"), json!(null))
            .await
            .ok(200);
        a.post(&format!("/v1/sandboxes/{id}/commit"), json!(null))
            .await
            .err(404, "snapshot_not_found");

        // Diff since a checkpoint: what was added, modified and deleted, with a text diff.
        a.post(&format!("/v1/sandboxes/{id}/checkpoint"), json!(null))
            .await
            .ok(201);
        a.sh(
            &id,
            "cd /home/user && echo changed > step && rm link && echo fresh > added",
        )
        .await;
        let diff = a
            .get_q(&format!("/v1/sandboxes/{id}/diff"), &[("text", "true")])
            .await
            .ok(200);
        let change = |path: &str| {
            diff["entries"]
                .as_array()
                .expect("entries")
                .iter()
                .find(|e| e["path"] == path)
                .map(|e| e["change"].as_str().unwrap_or_default().to_owned())
        };
        assert_eq!(change("/home/user/step").as_deref(), Some("modified"), "{diff:#}");
        assert_eq!(change("/home/user/link").as_deref(), Some("deleted"), "{diff:#}");
        assert_eq!(change("/home/user/added").as_deref(), Some("added"), "{diff:#}");
        assert_eq!(
            change("/home/user/f"),
            None,
            "an unchanged file is not listed: {diff:#}"
        );
        let step = diff["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .find(|e| e["path"] == "/home/user/step")
            .expect("step");
        let unified = step["unified"].as_str().expect("a text diff");
        assert!(
            unified.contains("-kept") && unified.contains("+changed"),
            "{unified}"
        );
        a.post(&format!("/v1/sandboxes/{id}/rollback"), json!(null))
            .await
            .ok(200);
        assert_eq!(
            a.sh(&id, "cat /home/user/step; readlink /home/user/link").await,
            "kept\nf\n"
        );
        assert_eq!(a.sh(&id, "cat /home/user/step").await, "kept\n");

        // A named snapshot, forks and a sandbox created from the snapshot never see each other's writes.
        let snap = a
            .post(
                &format!("/v1/sandboxes/{id}/snapshots"),
                json!({"name": "base", "labels": {"x": "1"}}),
            )
            .await
            .ok(201);
        let sid = snap["id"].as_str().expect("snapshot id").to_owned();
        let copies = fork(&a, &id, 3).await;
        assert_eq!(copies.len(), 3);
        for (i, copy) in copies.iter().enumerate() {
            assert_ne!(copy, &id);
            assert_eq!(a.sh(copy, "cat /home/user/f").await, "one\n");
            a.sh(copy, &format!("echo {i} > /home/user/mine")).await;
        }
        for (i, copy) in copies.iter().enumerate() {
            assert_eq!(a.sh(copy, "cat /home/user/mine").await, format!("{i}\n"));
        }
        assert_eq!(
            a.sh(&id, "test -e /home/user/mine || echo absent").await,
            "absent\n"
        );
        a.sh(&id, "echo parent > /home/user/parent-only").await;
        let from_snap = a.create_sandbox(json!({"snapshot": sid})).await;
        assert_eq!(
            a.sh(
                &from_snap,
                "cat /home/user/step; test -e /home/user/parent-only || echo absent"
            )
            .await,
            "kept\nabsent\n"
        );
        for copy in &copies {
            assert_eq!(
                a.sh(copy, "test -e /home/user/parent-only || echo absent").await,
                "absent\n"
            );
        }

        // Another tenant sees none of it.
        b.get(&format!("/v1/snapshots/{sid}"))
            .await
            .err(404, "snapshot_not_found");
        b.delete(&format!("/v1/snapshots/{sid}"))
            .await
            .err(404, "snapshot_not_found");
        b.post("/v1/sandboxes", json!({"snapshot": sid}))
            .await
            .err(404, "snapshot_not_found");
        let listed = b.get("/v1/snapshots").await.ok(200);
        assert!(
            listed["snapshots"].as_array().expect("list").is_empty(),
            "{listed}"
        );
        let mine = a.get_q("/v1/snapshots", &[("sandbox", &id)]).await.ok(200);
        assert_eq!(mine["snapshots"].as_array().expect("list").len(), 1, "{mine}");
        let got = a.get(&format!("/v1/snapshots/{sid}")).await.ok(200);
        assert_eq!(got["name"], "base");
        assert!(got["referenced_bytes"].as_u64().is_some(), "{got}");

        // Pause freezes: no CPU is used, the agent is not asked; resume thaws.
        a.exec_background(&from_snap, json!({"argv": ["sh", "-c", "while :; do :; done"]}))
            .await;
        let paused = a
            .post(&format!("/v1/sandboxes/{from_snap}/pause"), json!(null))
            .await
            .ok(200);
        assert_eq!(paused["paused"], true);
        let cpu = |u: Value| u["cpu_time_us"].as_u64().expect("cpu");
        let t0 = cpu(a.get(&format!("/v1/sandboxes/{from_snap}/usage")).await.ok(200));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t1 = cpu(a.get(&format!("/v1/sandboxes/{from_snap}/usage")).await.ok(200));
        assert!(
            t1 - t0 < 20_000,
            "a paused sandbox used {} µs of CPU in 0.5 s",
            t1 - t0
        );
        a.post(
            &format!("/v1/sandboxes/{from_snap}/exec"),
            json!({"argv": ["true"]}),
        )
        .await
        .err(409, "sandbox_not_running");
        let resumed = a
            .post(&format!("/v1/sandboxes/{from_snap}/resume"), json!(null))
            .await
            .ok(200);
        assert_eq!(resumed["paused"], false);
        // On a loaded host the thawed loop may get little CPU at first: wait (with a deadline) for it
        // to use 50 ms.
        poll(SOON, "the resumed busy loop to use CPU again", || async {
            let t2 = cpu(a.get(&format!("/v1/sandboxes/{from_snap}/usage")).await.ok(200));
            (t2 - t1 > 50_000).then_some(())
        })
        .await;

        // Deleting the snapshot does not touch the sandboxes made from it.
        a.delete(&format!("/v1/snapshots/{sid}")).await.ok(204);
        a.get(&format!("/v1/snapshots/{sid}"))
            .await
            .err(404, "snapshot_not_found");
        assert_eq!(a.sh(&from_snap, "cat /home/user/f").await, "one\n");
        // Killing a paused-then-resumed sandbox and the forks leaves nothing (the harness checks).
        let actions: Vec<String> = a
            .audit_rows(&[("action", "sandbox.")])
            .await
            .iter()
            .map(|r| r["action"].as_str().unwrap_or_default().to_owned())
            .collect();
        for wanted in [
            "sandbox.checkpoint",
            "sandbox.rollback",
            "sandbox.commit",
            "sandbox.fork",
            "sandbox.pause",
            "sandbox.resume",
        ] {
            assert!(
                actions.iter().any(|a| a == wanted),
                "no {wanted} row in {actions:?}"
            );
        }
    });
}

/// A fork snapshots its copies straight from the sandbox's volume, holding the sandbox frozen until
/// they are made: every copy holds the same instant of a process that never stops writing, the
/// sandbox runs on after, and each copy is charged what the sandbox held, its last writes included.
#[test]
fn fork_copies_hold_one_instant_of_a_busy_sandbox() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("forker").await;
        let id = a.create_sandbox(json!({})).await;
        let storage = async || {
            h.admin.get("/v1/tenants/forker").await.ok(200)["usage"]["storage_bytes"]
                .as_u64()
                .expect("storage_bytes")
        };
        let alone = storage().await;
        // A counter written to two files in turn, as fast as it goes.
        a.exec_background(
            &id,
            json!({"argv": ["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > /home/user/a; echo $i > /home/user/b; done"]}),
        )
        .await;
        poll(SOON, "the writer to count", || async {
            (counter(&a, &id).await > 100).then_some(())
        })
        .await;
        // 8 MiB written just before the fork: not yet in the pool's committed accounting.
        a.sh(&id, "head -c 8388608 /dev/urandom > /home/user/blob").await;
        let copies = fork(&a, &id, 4).await;
        let mut seen = Vec::new();
        for copy in &copies {
            seen.push(a.sh(copy, "cat /home/user/a /home/user/b; wc -c < /home/user/blob").await);
        }
        assert!(
            seen.iter().all(|s| s == &seen[0]),
            "the copies hold different instants: {seen:?}"
        );
        assert!(seen[0].ends_with("8388608\n"), "{seen:?}");
        // The copies' processes are not copied (their counters stay); the sandbox's writer runs on.
        let at_fork = counter(&a, &copies[0]).await;
        poll(SOON, "the sandbox's writer to go on after the fork", || async {
            (counter(&a, &id).await > at_fork + 100).then_some(())
        })
        .await;
        assert_eq!(counter(&a, &copies[0]).await, at_fork);
        let info = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
        assert_eq!(info["paused"], false, "{info}");
        // Each copy is charged its disk limit and what the sandbox held, the blob included.
        let row = a.audit_rows(&[("action", "sandbox.fork")]).await;
        let charged = row[0]["detail"]["base_bytes"].as_u64().expect("base_bytes");
        assert!(charged >= 8 << 20, "a copy's base leaves out the last writes: {}", row[0]);
        assert_eq!(storage().await, 5 * alone + 4 * charged);
        // A paused sandbox is not forked (its agent cannot answer), and stays paused.
        a.post(&format!("/v1/sandboxes/{id}/pause"), json!(null)).await.ok(200);
        a.post(&format!("/v1/sandboxes/{id}/fork"), json!({"count": 1}))
            .await
            .err(409, "sandbox_not_running");
        let info = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
        assert_eq!(info["paused"], true, "{info}");
        a.post(&format!("/v1/sandboxes/{id}/resume"), json!(null)).await.ok(200);
        assert_eq!(a.sh(&id, "echo ok").await, "ok\n");
    });
}

/// What a sandbox's counter (`fork_copies_hold_one_instant_of_a_busy_sandbox`) says, 0 before it
/// starts.
async fn counter(a: &Client, id: &str) -> u64 {
    a.sh(id, "cat /home/user/b 2>/dev/null || echo 0")
        .await
        .trim()
        .parse::<u64>()
        .unwrap_or(0)
}

/// Forks sandbox `id` into `count` copies; their ids.
async fn fork(a: &Client, id: &str, count: u32) -> Vec<String> {
    let forks = a
        .post(&format!("/v1/sandboxes/{id}/fork"), json!({ "count": count }))
        .await
        .ok(201);
    forks["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_owned())
        .collect()
}
