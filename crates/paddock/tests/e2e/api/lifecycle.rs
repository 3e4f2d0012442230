//! A sandbox's lifecycle through the API: validation errors naming the field, timeouts, expiry,
//! extension and usage, lists filtered by label and paged, refused environment names.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::harness::{poll, Client, Harness, Options, Reply};

use super::{JSON, SOON};

#[test]
fn validation_errors_name_the_field() {
    let h = Harness::with(Options {
        max_limits: paddock_types::Limits {
            memory: Some(paddock_types::ByteSize::gib(2)),
            cpus: None,
            pids: None,
            disk: None,
        },
        ..Options::default()
    });
    h.block_on(async {
        let a = h.admin.new_tenant("validation").await;
        let field = |r: &Reply| r.json()["field"].as_str().unwrap_or("").to_owned();
        for (body, expected) in [
            (json!({"limits": {"memory": "lots"}}), "limits.memory"),
            (json!({"limits": {"memory": "4G"}}), "limits.memory"),
            (json!({"limits": {"memory": -1}}), "limits.memory"),
            (json!({"limits": {"pids": 0}}), "limits.pids"),
            (json!({"limits": {"cpus": -1}}), "limits.cpus"),
            (json!({"limits": {"disk": "1X"}}), "limits.disk"),
            (json!({"limits": {"swap": "1G"}}), "limits.swap"),
            (json!({"timeout_secs": 0}), "timeout_secs"),
            (json!({"timeout_secs": 1_000_000_000u64}), "timeout_secs"),
            (json!({"timeout_secs": "soon"}), "timeout_secs"),
            (json!({"template": "nope"}), "template"),
            (json!({"workdir": "relative/dir"}), "workdir"),
            (json!({"user": "no such user!"}), "user"),
            (json!({"labels": {"a=b": "x"}}), "labels.a=b"),
            (json!({"bogus": 1}), "bogus"),
        ] {
            let r = a.post("/v1/sandboxes", body.clone()).await;
            r.err(400, "invalid_request");
            assert_eq!(field(&r), expected, "{body}: {r:?}");
        }
        // A body must be a JSON object: serde alone would read `[]` as a request with every field
        // defaulted (and create a sandbox).
        for body in ["[]", "[{}]", "null", "3", "\"x\""] {
            let r = Client::send(
                a.request(Method::POST, "/v1/sandboxes")
                    .header("content-type", JSON)
                    .body(body),
            )
            .await;
            let refused = r.err(400, "invalid_request");
            let message = refused["message"].as_str().unwrap_or("");
            if body != "null" {
                assert!(message.contains("must be a JSON object"), "{body}: {refused}");
            }
        }
        assert!(a.get("/v1/sandboxes").await.ok(200)["sandboxes"]
            .as_array()
            .is_some_and(Vec::is_empty));
        let id = a.create_sandbox(json!({"limits": {"memory": "2G"}})).await;
        let exec = format!("/v1/sandboxes/{id}/exec");
        for (body, expected) in [
            (json!({}), "argv"),
            (json!({"argv": []}), "argv"),
            (json!({"argv": [""]}), "argv"),
            (json!({"argv": ["true"], "shell": "true"}), "argv"),
            (json!({"argv": "true"}), "argv"),
            (json!({"argv": ["/nonexistent/program"]}), "argv"),
            (json!({"argv": ["true"], "cwd": "relative"}), "cwd"),
            (json!({"argv": ["true"], "cwd": "/nonexistent"}), "cwd"),
            (json!({"argv": ["true"], "user": "ghost"}), "user"),
            (json!({"argv": ["true"], "pty": {"rows": 0, "cols": 80}}), "pty"),
            (json!({"argv": ["true"], "env": {"": "x"}}), "env."),
            (json!({"argv": ["true"], "timeout_ms": "x"}), "timeout_ms"),
            (json!({"argv": ["true"], "bogus": true}), "bogus"),
        ] {
            let r = a.post(&exec, body.clone()).await;
            r.err(400, "invalid_request");
            assert_eq!(field(&r), expected, "{body}: {r:?}");
        }
        let r = a
            .post(&format!("/v1/sandboxes/{id}/timeout"), json!({"timeout_secs": 0}))
            .await;
        r.err(400, "invalid_request");
        assert_eq!(field(&r), "timeout_secs");
        let r = a.post(&format!("/v1/sandboxes/{id}/timeout"), json!({})).await;
        assert_eq!(field(&r), "timeout_secs", "{r:?}");
        for (query, expected) in [
            ("limit=0", "limit"),
            ("limit=x", "limit"),
            ("state=bogus", "state"),
            ("label=nokv", "label"),
            ("bogus=1", "bogus"),
        ] {
            let r = a.get(&format!("/v1/sandboxes?{query}")).await;
            r.err(400, "invalid_request");
            assert_eq!(field(&r), expected, "{query}: {r:?}");
        }
        // A cursor no page could have returned is refused by every list, not answered with an
        // empty page.
        for list in ["/v1/sandboxes", "/v1/snapshots", "/v1/volumes"] {
            for cursor in ["%ff%00", "", "UPPER", "a%2Fb"] {
                let r = a.get(&format!("{list}?cursor={cursor}")).await;
                r.err(400, "invalid_request");
                assert_eq!(field(&r), "cursor", "{list}?cursor={cursor}: {r:?}");
            }
        }
        for (query, expected) in [
            ("limit=0", "limit"),
            ("since=yesterday", "since"),
            ("after_seq=-1", "after_seq"),
        ] {
            let r = a.get(&format!("/v1/audit?{query}")).await;
            r.err(400, "invalid_request");
            assert_eq!(field(&r), expected, "{query}: {r:?}");
        }
        let r = h.admin.post("/v1/keys", json!({"tenant": "Not A Tenant"})).await;
        r.err(400, "invalid_request");
        assert_eq!(field(&r), "tenant");
        // Malformed bodies, wrong content types, oversized JSON, unknown routes and methods.
        Client::send(
            a.request(Method::POST, "/v1/sandboxes")
                .header("content-type", JSON)
                .body("{"),
        )
        .await
        .err(400, "invalid_request");
        Client::send(
            a.request(Method::POST, "/v1/sandboxes")
                .header("content-type", "text/plain")
                .body("{}"),
        )
        .await
        .err(400, "invalid_request");
        let huge = json!({"labels": {"big": "x".repeat(2 << 20)}});
        a.post("/v1/sandboxes", huge).await.err(413, "payload_too_large");
        a.get("/v1/nothing").await.err(404, "invalid_request");
        Client::send(a.request(Method::PATCH, "/v1/sandboxes"))
            .await
            .err(405, "invalid_request");
    });
}

/// RFC 3339 (as the API writes it) to milliseconds since the epoch.
pub(super) fn rfc3339_ms(text: &str) -> u128 {
    humantime::parse_rfc3339(text)
        .unwrap_or_else(|e| panic!("{text:?} is not RFC 3339: {e}"))
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_millis()
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("time")
        .as_millis()
}

#[test]
fn timeouts_expiry_extension_and_usage() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("timer").await;
        // Expiry: the reaper ends it; it stays visible as `expired`.
        let short = a.create_sandbox(json!({"timeout_secs": 1})).await;
        let expired = poll(SOON, "the reaper to expire the sandbox", || async {
            let info = a.get(&format!("/v1/sandboxes/{short}")).await.ok(200);
            (info["state"] == "expired").then_some(info)
        })
        .await;
        assert_eq!(expired["end_reason"], "expired", "{expired}");
        assert!(expired["ended_at"].is_string(), "{expired}");
        assert!(
            rfc3339_ms(expired["ended_at"].as_str().expect("ended_at"))
                >= rfc3339_ms(expired["expires_at"].as_str().expect("expires_at")),
            "{expired}"
        );
        a.post(&format!("/v1/sandboxes/{short}/exec"), json!({"argv": ["true"]}))
            .await
            .err(409, "sandbox_not_running");
        a.delete(&format!("/v1/sandboxes/{short}")).await.err(409, "sandbox_not_running");
        a.post(&format!("/v1/sandboxes/{short}/timeout"), json!({"timeout_secs": 60}))
            .await
            .err(409, "sandbox_not_running");
        let running = a.get("/v1/sandboxes").await.ok(200);
        assert!(running["sandboxes"].as_array().is_some_and(Vec::is_empty), "{running}");
        let listed = a.get("/v1/sandboxes?state=expired").await.ok(200);
        assert_eq!(listed["sandboxes"][0]["id"], short.as_str());
        let rows = a.audit_rows(&[("sandbox", &short), ("action", "sandbox.expire")]).await;
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0]["tenant"], "timer");
        assert_eq!(rows[0]["key_id"], Value::Null, "the reaper acted, not a key: {}", rows[0]);
        // Its resources go (the run directory is the backend's record of a live sandbox): the end is
        // recorded first and the teardown follows, so the state can be read a moment before.
        let run_dir = h.env().state().join("run").join(&short);
        poll(SOON, "the expired sandbox's teardown", || async {
            (!run_dir.exists()).then_some(())
        })
        .await;

        // Extension: a 2-second sandbox given 600 seconds outlives its first deadline.
        let id = a.create_sandbox(json!({"timeout_secs": 2})).await;
        let first = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200)["expires_at"]
            .as_str()
            .map(rfc3339_ms)
            .expect("expires_at");
        let extended = a
            .post(&format!("/v1/sandboxes/{id}/timeout"), json!({"timeout_secs": 600}))
            .await
            .ok(200);
        let later = rfc3339_ms(extended["expires_at"].as_str().expect("expires_at"));
        assert!(later >= first + 590_000, "{first} -> {later}");

        // Usage moves while the first deadline passes.
        let usage = format!("/v1/sandboxes/{id}/usage");
        let before = a.get(&usage).await.ok(200);
        assert_eq!(before["memory_limit_bytes"], 1u64 << 30, "{before}");
        // The 10G default disk, lowered to the tests' 8G pool (no sandbox can write more than the pool).
        assert_eq!(before["disk_limit_bytes"], 8u64 << 30, "{before}");
        assert!(before["pids"].as_u64().is_some_and(|p| p >= 1), "{before}");
        // A shell variable of 150 MB, held while the shell waits.
        let filler = a
            .exec_background(
                &id,
                json!({"shell": "x=$(head -c 150000000 /dev/zero | tr '\\0' a); echo ${#x}; sleep 1000; echo ${#x}"}),
            )
            .await;
        let grown = poll(SOON, "memory use to grow by 100 MiB", || async {
            let now = a.get(&usage).await.ok(200);
            (now["memory_bytes"].as_u64()? > before["memory_bytes"].as_u64()? + (100 << 20)).then_some(now)
        })
        .await;
        assert!(grown["memory_peak_bytes"].as_u64() >= grown["memory_bytes"].as_u64(), "{grown}");
        assert!(grown["pids"].as_u64() > before["pids"].as_u64(), "{grown}");
        a.sh(&id, "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done").await;
        a.sh(&id, "head -c 30M /dev/urandom > /home/user/disk.bin; sync").await;
        poll(SOON, "cpu and disk use to grow", || async {
            let now = a.get(&usage).await.ok(200);
            (now["cpu_time_us"].as_u64()? > before["cpu_time_us"].as_u64()? + 100_000
                && now["disk_bytes"].as_u64()? > before["disk_bytes"].as_u64()? + (20 << 20))
            .then_some(())
        })
        .await;
        a.post(&format!("/v1/sandboxes/{id}/processes/{filler}/kill"), Value::Null)
            .await
            .ok(204);
        poll(SOON, "memory use to drop again", || async {
            let now = a.get(&usage).await.ok(200);
            (now["memory_bytes"].as_u64()? < before["memory_bytes"].as_u64()? + (60 << 20)).then_some(())
        })
        .await;
        // Past the original deadline (plus several reaper rounds) it still runs.
        while now_ms() < first + 2_000 {
            let info = a.get(&format!("/v1/sandboxes/{id}")).await.ok(200);
            assert_eq!(info["state"], "running", "expired despite the extension: {info}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(a.get(&format!("/v1/sandboxes/{id}")).await.ok(200)["state"], "running");
        let rows = a.audit_rows(&[("sandbox", &id), ("action", "sandbox.timeout")]).await;
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0]["detail"]["timeout_secs"], 600);
    });
}

#[test]
fn lists_filter_by_label_and_page() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("lister").await;
        let mut batch = BTreeSet::new();
        for i in 0..5 {
            batch.insert(
                a.create_sandbox(json!({"labels": {"batch": "b1", "n": i.to_string()}}))
                    .await,
            );
        }
        let odd = a.create_sandbox(json!({"labels": {"batch": "b2"}})).await;
        let mut seen = Vec::new();
        let mut pages = 0;
        let mut cursor: Option<String> = None;
        loop {
            let mut q = vec![("label", "batch=b1".to_owned()), ("limit", "2".to_owned())];
            if let Some(c) = &cursor {
                q.push(("cursor", c.clone()));
            }
            let q: Vec<(&str, &str)> = q.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let page = a.get_q("/v1/sandboxes", &q).await.ok(200);
            pages += 1;
            let ids = page["sandboxes"].as_array().expect("sandboxes");
            assert!(ids.len() <= 2, "{page}");
            for sb in ids {
                assert_eq!(sb["labels"]["batch"], "b1", "{sb}");
                seen.push(sb["id"].as_str().expect("id").to_owned());
            }
            match page["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => break,
            }
            assert!(pages < 10, "paging does not end");
        }
        assert_eq!(pages, 3);
        assert_eq!(seen.len(), 5, "each exactly once: {seen:?}");
        assert_eq!(seen.iter().cloned().collect::<BTreeSet<_>>(), batch);
        let one = a
            .get_q("/v1/sandboxes", &[("label", "batch=b1,n=3")])
            .await
            .ok(200);
        assert_eq!(one["sandboxes"].as_array().map(Vec::len), Some(1), "{one}");
        assert_eq!(one["sandboxes"][0]["labels"]["n"], "3");
        let none = a.get_q("/v1/sandboxes", &[("label", "batch=b3")]).await.ok(200);
        assert_eq!(none["sandboxes"], json!([]));
        let all = a.get("/v1/sandboxes").await.ok(200);
        let all: BTreeSet<&str> = all["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .filter_map(|s| s["id"].as_str())
            .collect();
        assert_eq!(all.len(), 6);
        assert!(all.contains(odd.as_str()));
        // Ended sandboxes leave the default list and appear under their state.
        let ended: Vec<String> = batch.iter().take(2).cloned().collect();
        for id in &ended {
            a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        }
        let running = a.get_q("/v1/sandboxes", &[("label", "batch=b1")]).await.ok(200);
        assert_eq!(running["sandboxes"].as_array().map(Vec::len), Some(3));
        let stopped = a.get_q("/v1/sandboxes", &[("state", "killed")]).await.ok(200);
        let stopped: BTreeSet<&str> = stopped["sandboxes"]
            .as_array()
            .expect("sandboxes")
            .iter()
            .map(|s| {
                assert_eq!(s["end_reason"], "killed", "{s}");
                s["id"].as_str().expect("id")
            })
            .collect();
        assert_eq!(stopped, ended.iter().map(String::as_str).collect());
        let everything = a
            .get_q("/v1/sandboxes", &[("state", "all"), ("label", "batch=b1")])
            .await
            .ok(200);
        assert_eq!(everything["sandboxes"].as_array().map(Vec::len), Some(5));
        // A listed sandbox says what it is.
        let sb = a.get(&format!("/v1/sandboxes/{odd}")).await.ok(200);
        assert_eq!(sb["template"], "default");
        assert_eq!(sb["user"], "user");
        assert_eq!(sb["limits"]["memory"], 1u64 << 30);
    });
}

#[test]
fn environment_names_with_an_equals_sign_are_refused_up_front() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("envcheck").await;
        // A name such as `A=B` is not a variable name (`A=B=x` would set A to `B=x`), and the agent
        // refuses it at every exec. The service must refuse it when the sandbox is created, naming
        // the field, instead of creating a sandbox in which no process can ever start.
        let r = a.post("/v1/sandboxes", json!({"env": {"A=B": "x"}})).await;
        if r.status == 201 {
            let id = r.json()["id"].as_str().expect("id").to_owned();
            let exec = a
                .post(&format!("/v1/sandboxes/{id}/exec"), json!({"argv": ["true"]}))
                .await;
            panic!(
                "a sandbox env name with '=' was accepted ({r:?}); every exec in that sandbox then \
                 fails: {exec:?}"
            );
        }
        let body = r.err(400, "invalid_request");
        assert_eq!(body["field"], "env.A=B", "{body}");
        let id = a.create_sandbox(json!({})).await;
        let body = a
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                json!({"argv": ["true"], "env": {"A=B": "x"}}),
            )
            .await
            .err(400, "invalid_request");
        assert_eq!(body["field"], "env.A=B", "{body}");
    });
}
