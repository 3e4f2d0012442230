//! The audit log as a whole: every operation of a sandbox's life writes its row, in order, with
//! its tenant, key, sandbox and outcome (the end-to-end suite's `the_audit_log_records_every_action_in_order`
//! without root).

use paddock_control::WriteFileOptions;
use paddock_types::api::{
    AttachQuery, AuditQuery, ExecResult, KillRequest, SetTimeoutRequest, SignalRequest,
};
use serde_json::json;

use crate::fixture::{body, bytes_body, collect, poll, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_writes_its_row_in_order() {
    let f = Fixture::start().await;
    let s = &f.service;
    let p = &f.a;
    let id = f.create(p, json!({"labels": {"k": "v"}})).await.id;
    let mut expected = vec!["sandbox.create"];
    // A collected exec, as `POST .../exec` answers with one JSON document.
    let collected = s
        .exec(p, &id, body(json!({"shell": "echo hello; cat", "stdin": "in"})))
        .await
        .expect("exec")
        .collect()
        .await;
    let (pieces, held) = collected.into_json();
    let document: Vec<u8> = pieces.iter().flat_map(|b| b.iter().copied()).collect();
    drop(held);
    let result: ExecResult = serde_json::from_slice(&document).expect("an ExecResult");
    assert_eq!(
        (result.stdout.as_deref(), result.exit.map(|e| e.exit_code)),
        (Some("hello\nin"), Some(0))
    );
    expected.push("process.start");
    s.write_file(
        p,
        &id,
        "/home/user/a.txt",
        WriteFileOptions::default(),
        bytes_body(b"abcdef"),
    )
    .await
    .expect("write");
    expected.push("file.write");
    s.read_file(p, &id, "/home/user/a.txt").await.expect("read");
    expected.push("file.read");
    s.list_dir(p, &id, "/home/user").await.expect("list");
    expected.push("file.list");
    s.stat_file(p, &id, "/home/user/a.txt")
        .await
        .expect("stat (no row)");
    s.make_dir(p, &id, body(json!({"path": "/home/user/d"})))
        .await
        .expect("mkdir");
    expected.push("file.mkdir");
    s.rename_file(
        p,
        &id,
        body(json!({"from": "/home/user/a.txt", "to": "/home/user/d/a.txt"})),
    )
    .await
    .expect("rename");
    expected.push("file.rename");
    s.remove_file(p, &id, "/home/user/d/a.txt", false, None)
        .await
        .expect("remove");
    expected.push("file.remove");
    s.set_timeout(p, &id, SetTimeoutRequest { timeout_secs: 1200 })
        .await
        .expect("timeout");
    expected.push("sandbox.timeout");
    let p3 = s
        .exec(
            p,
            &id,
            body(json!({"argv": ["sleep", "1000"], "background": true})),
        )
        .await
        .expect("exec")
        .pid();
    expected.push("process.start");
    s.signal_process(
        p,
        &id,
        p3,
        SignalRequest {
            signal: json!("TERM"),
        },
    )
    .await
    .expect("signal");
    expected.push("process.signal");
    let p4 = s
        .exec(
            p,
            &id,
            body(json!({"argv": ["sleep", "1001"], "background": true})),
        )
        .await
        .expect("exec")
        .pid();
    expected.push("process.start");
    let replay = AttachQuery {
        follow: Some(false),
        ..AttachQuery::default()
    };
    collect(s.attach_process(p, &id, p4, replay).await.expect("attach")).await;
    expected.push("process.attach");
    s.kill_process(p, &id, p4, KillRequest { signal: None })
        .await
        .expect("kill");
    expected.push("process.kill");
    drop(s.download_tar(p, &id, "/home/user").await.expect("tar download"));
    expected.push("file.tar_download");
    s.watch_dir(p, &id, "/home/user", false).await.expect("watch");
    expected.push("file.watch");
    s.create_snapshot(p, &id, body(json!({"name": "s"})))
        .await
        .expect("snapshot");
    expected.push("snapshot.create");
    s.checkpoint(p, &id).await.expect("checkpoint");
    expected.push("sandbox.checkpoint");
    s.diff_sandbox(p, &id, body(json!({}))).await.expect("diff");
    expected.push("sandbox.diff");
    s.commit(p, &id).await.expect("commit");
    expected.push("sandbox.commit");
    s.pause_sandbox(p, &id).await.expect("pause");
    expected.push("sandbox.pause");
    s.resume_sandbox(p, &id).await.expect("resume");
    expected.push("sandbox.resume");
    s.stop_sandbox(p, &id).await.expect("stop");
    expected.push("sandbox.stop");
    s.resume_sandbox(p, &id)
        .await
        .expect("resume the stopped sandbox");
    expected.push("sandbox.resume");
    let rows = poll("three process.exit rows", || async {
        let rows = f
            .audit(AuditQuery {
                sandbox: Some(id.to_string()),
                ..AuditQuery::default()
            })
            .await;
        (rows.iter().filter(|r| r.action == "process.exit").count() >= 3).then_some(rows)
    })
    .await;
    s.kill_sandbox(p, &id).await.expect("kill");
    expected.push("sandbox.kill");
    let mut actions = f.actions_but_exits(&id).await;
    actions.retain(|a| a != "process.exit");
    assert_eq!(actions, expected, "the audited actions differ from what was done");
    for row in rows.iter().filter(|r| r.action != "process.exit") {
        assert_eq!(row.tenant.as_deref(), Some("tenant-a"), "{row:?}");
        assert_eq!(row.key_id.as_deref(), Some(p.key_id.as_str()), "{row:?}");
        assert_eq!(row.outcome, "ok", "{row:?}");
    }
    let seqs: Vec<u64> = rows.iter().map(|r| r.seq).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    // Paddock's own housekeeping answers too.
    assert_eq!(s.recovering(), 0);
    assert!(
        s.bootstrap_admin_key().await.expect("bootstrap").is_none(),
        "one admin key exists"
    );
    s.prune_network_audit().await.expect("prune");
    f.finish().await;
}
