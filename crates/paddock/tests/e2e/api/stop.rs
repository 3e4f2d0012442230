//! Stopped sandboxes, what a timeout does besides killing (`on_timeout`), and per-process file-change
//! audit (`audit_exec_diff`), in-process against a real service (native backend, SQLite store, axum on
//! a loopback port). Each test has its own service, state directory and cgroup parent; teardown kills
//! every sandbox and checks nothing was left behind (stopped sandboxes' kept files included).

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::harness::{poll, Harness};

use super::SOON;

#[test]
fn stop_keeps_the_files_and_its_place_in_the_quota_and_resume_restarts_the_processes() {
    let h = Harness::start();
    h.block_on(async {
        h.admin
            .put(
                "/v1/tenants/stopper/quota",
                json!({"max_sandboxes": 2, "max_memory": "1G"}),
            )
            .await
            .ok(200);
        let a = h.admin.new_tenant("stopper").await;
        let b = h.admin.new_tenant("stop-snoop").await;
        let id = a.create_sandbox(json!({})).await;
        a.sh(
            &id,
            "echo kept > /home/user/f && mkdir /tmp/t && echo tmp > /tmp/t/x",
        )
        .await;
        a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await;

        // Another tenant can neither stop nor resume it, and learns nothing (404 as for a missing one).
        b.post(&format!("/v1/sandboxes/{id}/stop"), Value::Null)
            .await
            .err(404, "sandbox_not_found");

        let stopped = a
            .post(&format!("/v1/sandboxes/{id}/stop"), Value::Null)
            .await
            .ok(200);
        assert_eq!(stopped["state"], "stopped", "{stopped}");
        assert!(stopped["expires_at"].is_null(), "{stopped}");
        assert!(
            stopped["ended_at"].is_null(),
            "a stopped sandbox has not ended: {stopped}"
        );
        let state = h.env().state();
        assert!(!state.join("run").join(&id).exists(), "no run directory");
        assert!(
            state.join("pool/stopped").join(&id).is_dir(),
            "its files are kept"
        );
        assert!(!state.join("pool/sandboxes").join(&id).exists());

        // Nothing runs in it; its files are not reachable through the agent either.
        a.post(&format!("/v1/sandboxes/{id}/exec"), json!({"argv": ["true"]}))
            .await
            .err(409, "sandbox_not_running");
        a.post(&format!("/v1/sandboxes/{id}/stop"), Value::Null)
            .await
            .err(409, "sandbox_not_running");
        let listed = a.get_q("/v1/sandboxes", &[("state", "stopped")]).await.ok(200);
        assert_eq!(listed["sandboxes"][0]["id"], id.as_str(), "{listed}");
        let running = a.get("/v1/sandboxes").await.ok(200);
        assert_eq!(
            running["sandboxes"].as_array().map(Vec::len),
            Some(0),
            "{running}"
        );

        // A stopped sandbox still counts as a sandbox (it keeps its files and may come back at will),
        // not for memory: another may run with the memory it held, and its resume is refused then.
        let other = a.create_sandbox(json!({})).await;
        let e = a
            .post("/v1/sandboxes", json!({"limits": {"memory": "32M"}}))
            .await
            .err(429, "quota_exceeded");
        assert_eq!(e["field"], "max_sandboxes", "{e}");
        let usage = a.get("/v1/tenants/stopper").await.ok(200);
        assert_eq!(usage["usage"]["sandboxes"], 2, "{usage}");
        assert_eq!(usage["usage"]["memory_bytes"], 1u64 << 30, "{usage}");
        let e = a
            .post(&format!("/v1/sandboxes/{id}/resume"), Value::Null)
            .await
            .err(429, "quota_exceeded");
        assert_eq!(e["field"], "max_memory", "{e}");
        let still = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
        assert_eq!(
            still["state"], "stopped",
            "a refused resume keeps it stopped: {still}"
        );
        a.delete(&format!("/v1/sandboxes/{other}")).await.ok(204);

        let resumed = a
            .post(&format!("/v1/sandboxes/{id}/resume"), Value::Null)
            .await
            .ok(200);
        assert_eq!(resumed["state"], "running", "{resumed}");
        assert_eq!(resumed["id"], id.as_str(), "same id");
        assert!(
            !resumed["expires_at"].is_null(),
            "the timeout restarts: {resumed}"
        );
        assert_eq!(a.sh(&id, "cat /home/user/f /tmp/t/x").await, "kept\ntmp\n");
        assert_eq!(
            a.sh(&id, "pgrep -x sleep || echo none").await,
            "none\n",
            "processes do not survive a stop"
        );
        assert_eq!(a.sh(&id, "hostname").await.trim(), id.as_str());
        a.sh(&id, "echo again > /home/user/g").await;

        // Deleting a stopped sandbox frees its files and ends it as killed.
        a.post(&format!("/v1/sandboxes/{id}/stop"), Value::Null)
            .await
            .ok(200);
        a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        assert!(
            !state.join("pool/stopped").join(&id).exists(),
            "its files are gone"
        );
        let ended = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
        assert_eq!(ended["state"], "killed", "{ended}");
        a.post(&format!("/v1/sandboxes/{id}/resume"), Value::Null)
            .await
            .err(409, "sandbox_not_running");

        let actions: Vec<String> = a
            .audit_rows(&[("sandbox", &id)])
            .await
            .iter()
            .filter_map(|r| r["action"].as_str().map(str::to_owned))
            .filter(|a| a.starts_with("sandbox."))
            .collect();
        assert_eq!(
            actions,
            [
                "sandbox.create",
                "sandbox.stop",
                "sandbox.resume",
                "sandbox.resume",
                "sandbox.stop",
                "sandbox.kill"
            ],
            "the refused resume is recorded too"
        );
    });
}

#[test]
fn a_timeout_can_pause_or_stop_instead_of_killing() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("sleepy").await;
        let paused = a
            .create_sandbox(json!({"timeout_secs": 1, "on_timeout": "pause"}))
            .await;
        let info = a.get(&format!("/v1/sandboxes/{paused}")).await.ok(200);
        assert_eq!(info["on_timeout"], "pause", "{info}");
        a.exec_background(
            &paused,
            json!({"shell": "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; done"}),
        )
        .await;
        let usage = format!("/v1/sandboxes/{paused}/usage");
        let frozen = poll(SOON, "the timeout to pause the sandbox", || async {
            let info = a.get(&format!("/v1/sandboxes/{paused}")).await.ok(200);
            (info["paused"] == true).then_some(info)
        })
        .await;
        assert_eq!(frozen["state"], "running", "{frozen}");
        assert!(
            frozen["expires_at"].is_null(),
            "no second timeout while paused: {frozen}"
        );
        // Paused: no CPU used (the busy loop is frozen).
        let before = a.get(&usage).await.ok(200)["cpu_time_us"].as_u64().expect("cpu");
        tokio::time::sleep(Duration::from_millis(700)).await;
        let after = a.get(&usage).await.ok(200)["cpu_time_us"].as_u64().expect("cpu");
        assert!(
            after - before < 20_000,
            "a paused sandbox used {}µs of CPU",
            after - before
        );
        let rows = a
            .audit_rows(&[("sandbox", &paused), ("action", "sandbox.pause")])
            .await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0]["detail"]["cause"], "timeout", "{rows:?}");
        // Resume thaws it and arms the timeout again (which pauses it again).
        let resumed = a
            .post(&format!("/v1/sandboxes/{paused}/resume"), Value::Null)
            .await
            .ok(200);
        assert_eq!(resumed["paused"], false, "{resumed}");
        poll(SOON, "the resumed loop to use CPU again", || async {
            let now = a.get(&usage).await.ok(200)["cpu_time_us"].as_u64()?;
            (now > after + 50_000).then_some(())
        })
        .await;
        poll(SOON, "the re-armed timeout to pause it again", || async {
            let info = a.get(&format!("/v1/sandboxes/{paused}")).await.ok(200);
            (info["paused"] == true).then_some(())
        })
        .await;

        let stopped = a
            .create_sandbox(json!({"timeout_secs": 1, "on_timeout": "stop"}))
            .await;
        a.sh(&stopped, "echo survives > /home/user/f").await;
        poll(SOON, "the timeout to stop the sandbox", || async {
            let info = a.get(&format!("/v1/sandboxes/{stopped}")).await.ok(200);
            (info["state"] == "stopped").then_some(())
        })
        .await;
        a.post(&format!("/v1/sandboxes/{stopped}/resume"), Value::Null)
            .await
            .ok(200);
        assert_eq!(a.sh(&stopped, "cat /home/user/f").await, "survives\n");

        // The default still kills.
        let killed = a.create_sandbox(json!({"timeout_secs": 1})).await;
        poll(SOON, "the timeout to kill the sandbox", || async {
            let info = a.get(&format!("/v1/sandboxes/{killed}")).await.ok(200);
            (info["state"] == "expired").then_some(())
        })
        .await;
        a.post("/v1/sandboxes", json!({"on_timeout": "hibernate"}))
            .await
            .err(400, "invalid_request");
    });
}

#[test]
fn every_process_file_changes_are_audited_when_asked() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("diffed").await;
        let id = a.create_sandbox(json!({"audit_exec_diff": true})).await;
        a.sh(&id, "echo old > /home/user/keep && echo gone > /tmp/gone")
            .await;
        a.sh(
            &id,
            "echo new > /home/user/added && echo changed > /home/user/keep && rm /tmp/gone",
        )
        .await;
        let rows = poll(SOON, "two process.diff rows", || async {
            let rows = a
                .audit_rows(&[("sandbox", &id), ("action", "process.diff")])
                .await;
            (rows.len() >= 2).then_some(rows)
        })
        .await;
        let last = &rows[1]["detail"];
        let change = |path: &str| {
            last["paths"]
                .as_array()
                .expect("paths")
                .iter()
                .find(|p| p["path"] == path)
                .map(|p| p["change"].as_str().unwrap_or_default().to_owned())
        };
        assert_eq!(change("/home/user/added").as_deref(), Some("added"), "{last}");
        assert_eq!(change("/home/user/keep").as_deref(), Some("modified"), "{last}");
        assert_eq!(change("/tmp/gone").as_deref(), Some("deleted"), "{last}");
        assert_eq!(
            (last["added"].as_u64(), last["deleted"].as_u64()),
            (Some(1), Some(1)),
            "{last}"
        );
        let pid = last["pid"].as_u64().expect("pid");
        let exits = a
            .audit_rows(&[("sandbox", &id), ("action", "process.exit")])
            .await;
        assert!(
            exits.iter().any(|r| r["detail"]["pid"].as_u64() == Some(pid)),
            "the diff names the process whose exit is recorded"
        );
        // The snapshots the diffs were taken against are not the tenant's and do not stay.
        let listed = a.get("/v1/snapshots").await.ok(200);
        assert_eq!(listed["snapshots"].as_array().map(Vec::len), Some(0), "{listed}");
        let pool_snapshots = poll(SOON, "the diff snapshots to be deleted", || async {
            let n = std::fs::read_dir(h.env().state().join("pool/snapshots"))
                .map(|rd| rd.count())
                .unwrap_or(0);
            (n == 0).then_some(n)
        })
        .await;
        assert_eq!(pool_snapshots, 0);

        // Without the option, no diff rows.
        let plain = a.create_sandbox(json!({})).await;
        a.sh(&plain, "echo x > /home/user/x").await;
        let rows = a
            .audit_rows(&[("sandbox", &plain), ("action", "process.diff")])
            .await;
        assert!(rows.is_empty(), "{rows:?}");
    });
}
