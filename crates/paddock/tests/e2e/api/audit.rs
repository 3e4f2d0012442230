//! The audit log records every action in order, each process start tied to its exit, failed
//! authentications included; filters and paging; the admin verifies the whole chain.

use reqwest::Method;
use serde_json::{json, Value};

use crate::support::harness::{poll, Client, Harness};

use super::exec::exit_of;
use super::lifecycle::rfc3339_ms;
use super::{tar_of, SOON};

#[test]
fn the_audit_log_records_every_action_in_order() {
    let h = Harness::start();
    h.block_on(async {
        let a = h.admin.new_tenant("audited").await;
        let mut expected: Vec<(&str, Option<String>)> = Vec::new();
        let id = a.create_sandbox(json!({"labels": {"k": "v"}})).await;
        expected.push(("sandbox.create", Some(id.clone())));
        let sid = || Some(id.clone());
        let files = format!("/v1/sandboxes/{id}/files");

        let r = a
            .exec_json(&id, json!({"shell": "echo hello; cat", "stdin": "in"}))
            .await;
        assert_eq!(r["stdout"], "hello\nin");
        let p1 = r["pid"].as_u64().expect("pid");
        expected.push(("process.start", sid()));
        let r = a
            .exec_json(
                &id,
                json!({"argv": ["sh", "-c", "printf 12345 >&2; exit 3"], "cwd": "/tmp"}),
            )
            .await;
        let p2 = r["pid"].as_u64().expect("pid");
        expected.push(("process.start", sid()));
        a.write_file(&id, "/home/user/a.txt", "abcdef").await.ok(200);
        expected.push(("file.write", sid()));
        a.read_file(&id, "/home/user/a.txt").await;
        expected.push(("file.read", sid()));
        a.get_q(&format!("{files}/list"), &[("path", "/home/user")])
            .await
            .ok(200);
        expected.push(("file.list", sid()));
        a.post(&format!("{files}/mkdir"), json!({"path": "/home/user/d"}))
            .await
            .ok(201);
        expected.push(("file.mkdir", sid()));
        a.post(
            &format!("{files}/rename"),
            json!({"from": "/home/user/a.txt", "to": "/home/user/d/a.txt"}),
        )
        .await
        .ok(200);
        expected.push(("file.rename", sid()));
        a.delete_q(&files, &[("path", "/home/user/d/a.txt")])
            .await
            .ok(204);
        expected.push(("file.remove", sid()));
        a.post(
            &format!("/v1/sandboxes/{id}/timeout"),
            json!({"timeout_secs": 1200}),
        )
        .await
        .ok(200);
        expected.push(("sandbox.timeout", sid()));
        let p3 = u64::from(a.exec_background(&id, json!({"argv": ["sleep", "1000"]})).await);
        expected.push(("process.start", sid()));
        a.post(
            &format!("/v1/sandboxes/{id}/processes/{p3}/signal"),
            json!({"signal": "TERM"}),
        )
        .await
        .ok(204);
        expected.push(("process.signal", sid()));
        let p4 = u64::from(a.exec_background(&id, json!({"argv": ["sleep", "1001"]})).await);
        expected.push(("process.start", sid()));
        Client::send(
            a.request(Method::GET, &format!("/v1/sandboxes/{id}/processes/{p4}/output"))
                .query(&[("follow", "false")]),
        )
        .await
        .ok(200);
        expected.push(("process.attach", sid()));
        a.post(&format!("/v1/sandboxes/{id}/processes/{p4}/kill"), Value::Null)
            .await
            .ok(204);
        expected.push(("process.kill", sid()));
        let tarball = a.get_q(&format!("{files}/tar"), &[("path", "/home/user")]).await;
        assert_eq!(tarball.status, 200);
        expected.push(("file.tar_download", sid()));
        Client::send(
            a.request(Method::PUT, &format!("{files}/tar"))
                .query(&[("path", "/home/user/up")])
                .body(tar_of(&[("x.txt", b"x")])),
        )
        .await
        .ok(204);
        expected.push(("file.tar_upload", sid()));
        let watch = a
            .request(Method::GET, &format!("{files}/watch"))
            .query(&[("path", "/home/user")])
            .send()
            .await
            .expect("watch");
        assert_eq!(watch.status(), 200);
        drop(watch);
        expected.push(("file.watch", sid()));
        for pid in [p3, p4] {
            exit_of(&a, &id, pid).await;
        }
        a.delete(&format!("/v1/sandboxes/{id}")).await.ok(204);
        expected.push(("sandbox.kill", sid()));
        // A failed authentication is recorded too (for the admin).
        h.with_key("pdk_0123456789ab_nope")
            .get("/v1/sandboxes")
            .await
            .err(401, "unauthorized");

        let rows = poll(SOON, "four process.exit rows", || async {
            let rows = a.audit_rows(&[]).await;
            (rows.iter().filter(|r| r["action"] == "process.exit").count() >= 4).then_some(rows)
        })
        .await;
        for r in &rows {
            assert_eq!(r["tenant"], "audited", "{r}");
        }
        // Every action, in order (exits are written by the process's monitor, so they may follow a
        // later action; they are checked against their start below).
        let actions: Vec<(&str, Option<String>)> = rows
            .iter()
            .filter(|r| r["action"] != "process.exit")
            .map(|r| {
                (
                    r["action"].as_str().expect("action"),
                    r["sandbox_id"].as_str().map(str::to_owned),
                )
            })
            .collect();
        assert_eq!(actions, expected, "the audited actions differ from what was done");
        for r in rows.iter().filter(|r| r["action"] != "process.exit") {
            assert_eq!(r["key_id"], a.key_id.as_deref().expect("key id"), "{r}");
            assert_eq!(r["outcome"], "ok", "{r}");
        }
        let seqs: Vec<u64> = rows.iter().map(|r| r["seq"].as_u64().expect("seq")).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        let times: Vec<u128> = rows
            .iter()
            .map(|r| rfc3339_ms(r["time"].as_str().expect("time")))
            .collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
        // The start row is written before the process exists: it is tied to its exit row (which
        // has the pid) by the exec id both carry.
        let find = |action: &str, pid: u64| {
            let exit = rows
                .iter()
                .position(|r| r["action"] == "process.exit" && r["detail"]["pid"] == pid)
                .unwrap_or_else(|| panic!("no process.exit row for pid {pid}: {rows:#?}"));
            if action == "process.exit" {
                return exit;
            }
            let exec_id = &rows[exit]["detail"]["exec_id"];
            assert!(exec_id.is_string(), "exit row without exec id: {}", rows[exit]);
            rows.iter()
                .position(|r| r["action"] == action && &r["detail"]["exec_id"] == exec_id)
                .unwrap_or_else(|| panic!("no {action} row for pid {pid}: {rows:#?}"))
        };
        for pid in [p1, p2, p3, p4] {
            assert!(
                find("process.start", pid) < find("process.exit", pid),
                "pid {pid}"
            );
            let exit = &rows[find("process.exit", pid)]["detail"];
            for key in ["exit_code", "duration_ms", "bytes_out", "bytes_in", "cpu_time_us"] {
                assert!(!exit[key].is_null(), "{key} missing from {exit}");
            }
        }
        let start = &rows[find("process.start", p1)]["detail"];
        assert_eq!(start["shell"], "echo hello; cat");
        assert_eq!(start["user"], "user");
        let exit = &rows[find("process.exit", p1)]["detail"];
        assert_eq!(
            (
                exit["exit_code"].as_i64(),
                exit["bytes_out"].as_u64(),
                exit["bytes_in"].as_u64()
            ),
            (Some(0), Some(8), Some(2)),
            "{exit}"
        );
        let start = &rows[find("process.start", p2)]["detail"];
        assert_eq!(start["argv"], json!(["sh", "-c", "printf 12345 >&2; exit 3"]));
        assert_eq!(start["cwd"], "/tmp");
        let exit = &rows[find("process.exit", p2)]["detail"];
        assert_eq!(
            (exit["exit_code"].as_i64(), exit["bytes_out"].as_u64()),
            (Some(3), Some(5)),
            "{exit}"
        );
        assert_eq!(rows[find("process.exit", p3)]["detail"]["signal"], 15);
        assert_eq!(rows[find("process.exit", p4)]["detail"]["signal"], 9);
        let signal = rows
            .iter()
            .find(|r| r["action"] == "process.signal" && r["detail"]["pid"] == p3)
            .expect("process.signal row");
        assert_eq!(signal["detail"]["signal"], 15);
        let create = rows
            .iter()
            .find(|r| r["action"] == "sandbox.create")
            .expect("create");
        assert_eq!(
            (
                create["detail"]["source"].as_str(),
                create["detail"]["template"].as_str()
            ),
            (Some("boot"), Some("default"))
        );
        let write = rows.iter().find(|r| r["action"] == "file.write").expect("write");
        assert_eq!(
            (
                write["detail"]["path"].as_str(),
                write["detail"]["bytes_in"].as_u64()
            ),
            (Some("/home/user/a.txt"), Some(6))
        );
        let kill = rows.iter().find(|r| r["action"] == "sandbox.kill").expect("kill");
        assert_eq!(kill["detail"]["reason"], "killed");

        // Filters and paging.
        let family = a.audit_rows(&[("action", "process.")]).await;
        assert_eq!(
            family.len(),
            rows.iter()
                .filter(|r| r["action"].as_str().is_some_and(|x| x.starts_with("process.")))
                .count()
        );
        let exits = a.audit_rows(&[("action", "process.exit")]).await;
        assert_eq!(exits.len(), 4);
        let for_sandbox = a.audit_rows(&[("sandbox", &id)]).await;
        assert_eq!(for_sandbox.len(), rows.len());
        let mut paged = Vec::new();
        let mut after: Option<u64> = None;
        loop {
            let mut q = vec![("limit".to_owned(), "3".to_owned())];
            if let Some(s) = after {
                q.push(("after_seq".to_owned(), s.to_string()));
            }
            let q: Vec<(&str, &str)> = q.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let page = a.get_q("/v1/audit", &q).await.ok(200);
            let records = page["records"].as_array().expect("records");
            assert!(records.len() <= 3);
            paged.extend(records.iter().cloned());
            match page["next_after_seq"].as_u64() {
                Some(s) => after = Some(s),
                None => break,
            }
        }
        assert_eq!(paged, rows, "paging gives every row exactly once");
        let since = rows[5]["time"].as_str().expect("time");
        let later = a.audit_rows(&[("since", since)]).await;
        assert!(later
            .iter()
            .all(|r| rfc3339_ms(r["time"].as_str().expect("t")) >= rfc3339_ms(since)));
        assert!(later.len() < rows.len() && later.len() >= rows.len() - 5);

        // The admin sees the whole chain: gapless, each row hashed onto the previous one, verified.
        let all = h.admin.audit_rows(&[]).await;
        for (i, r) in all.iter().enumerate() {
            assert_eq!(r["seq"].as_u64(), Some(i as u64 + 1), "gap at {r}");
            if i > 0 {
                assert_eq!(r["prev_hash"], all[i - 1]["hash"], "chain broken at {r}");
            }
        }
        let failed = all
            .iter()
            .find(|r| r["action"] == "auth.failed")
            .expect("auth.failed row");
        assert_eq!(
            (failed["outcome"].as_str(), failed["tenant"].as_str()),
            (Some("unauthorized"), None)
        );
        assert_eq!(failed["detail"]["key_id"], "0123456789ab");
        let verdict = h.admin.get("/v1/audit/verify").await.ok(200);
        assert_eq!(verdict["ok"], true, "{verdict}");
        assert_eq!(verdict["first_broken"], Value::Null);
        assert!(
            verdict["rows_checked"].as_u64() >= Some(all.len() as u64),
            "{verdict}"
        );
    });
}
