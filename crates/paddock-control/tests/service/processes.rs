//! Processes: exec (collected and streamed), stdin, background processes and re-attaching, signals
//! and kills, listing, timeouts, PTYs, a caller that goes away, and per-process file-change audit;
//! with the `process.*` rows each writes.

use paddock_types::api::{AttachQuery, AuditRecord, ErrorCode, KillRequest, PtySizeBody, SignalRequest};
use serde_json::json;

use crate::fixture::{body, code, collect, poll, Fixture};

/// The exit row of process `pid` (written by its monitor when it ends).
async fn exit_row(f: &Fixture, pid: u32) -> AuditRecord {
    poll(&format!("the exit row of pid {pid}"), || async {
        f.rows("process.exit")
            .await
            .into_iter()
            .find(|r| r.detail["pid"] == pid)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_collects_output_and_exit_codes_and_records_start_and_exit() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({"env": {"FROM_SANDBOX": "s"}})).await.id;
    let first = f
        .exec(&f.a, &id, json!({"shell": "echo hello; cat", "stdin": "in"}))
        .await
        .expect("exec");
    assert_eq!(
        (first.stdout.as_str(), first.exit.map(|e| e.exit_code)),
        ("hello\nin", Some(0))
    );
    let second = f
        .exec(
            &f.a,
            &id,
            json!({"argv": ["sh", "-c", "printf 12345 >&2; exit 3"], "cwd": "/tmp"}),
        )
        .await
        .expect("exec");
    assert_eq!(
        (second.stderr.as_str(), second.exit.map(|e| e.exit_code)),
        ("12345", Some(3))
    );
    let env = f
        .exec(
            &f.a,
            &id,
            json!({"shell": "echo $FROM_SANDBOX $FROM_REQUEST; pwd; whoami", "env": {"FROM_REQUEST": "r"}, "cwd": "/tmp", "user": "root"}),
        )
        .await
        .expect("exec");
    assert_eq!(env.stdout, "s r\n/tmp\nroot\n");

    let start = |pid: u32| {
        let f = &f;
        async move {
            let exit = exit_row(f, pid).await;
            let exec_id = exit.detail["exec_id"].clone();
            assert!(exec_id.is_string(), "{exit:?}");
            let start = f
                .rows("process.start")
                .await
                .into_iter()
                .find(|r| r.detail["exec_id"] == exec_id)
                .expect("the start row with the same exec id");
            assert!(start.seq < exit.seq);
            (start, exit)
        }
    };
    let (s1, e1) = start(first.pid).await;
    assert_eq!(s1.detail["shell"], "echo hello; cat");
    assert_eq!(s1.detail["user"], "user");
    assert_eq!(
        (
            e1.detail["exit_code"].as_i64(),
            e1.detail["bytes_out"].as_u64(),
            e1.detail["bytes_in"].as_u64()
        ),
        (Some(0), Some(8), Some(2))
    );
    for key in ["duration_ms", "cpu_time_us", "max_rss_kib"] {
        assert!(!e1.detail[key].is_null(), "{key} missing from {e1:?}");
    }
    let (s2, e2) = start(second.pid).await;
    assert_eq!(s2.detail["argv"], json!(["sh", "-c", "printf 12345 >&2; exit 3"]));
    assert_eq!(s2.detail["cwd"], "/tmp");
    assert_eq!(
        (e2.detail["exit_code"].as_i64(), e2.detail["bytes_out"].as_u64()),
        (Some(3), Some(5))
    );
    for row in [&s1, &e1, &s2, &e2] {
        assert_eq!(
            (
                row.tenant.as_deref(),
                row.sandbox_id.as_deref(),
                row.key_id.as_deref(),
                row.outcome.as_str()
            ),
            (
                Some("tenant-a"),
                Some(id.as_str()),
                Some(f.a.key_id.as_str()),
                "ok"
            )
        );
    }
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_says_started_then_output_then_exit() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let out = f
        .exec(&f.a, &id, json!({"shell": "echo a; echo b >&2; exit 7"}))
        .await
        .expect("exec");
    assert_eq!(out.kinds.first(), Some(&"started"));
    assert_eq!(out.kinds.last(), Some(&"exit"));
    assert!(
        out.kinds.contains(&"stdout") && out.kinds.contains(&"stderr"),
        "{out:?}"
    );
    assert_eq!(out.exit.map(|e| e.exit_code), Some(7));
    // An unknown program is refused before anything runs, and recorded as never spawned.
    let e = crate::fixture::error(f.exec(&f.a, &id, json!({"argv": ["no-such-program"]})).await);
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::InvalidRequest, Some("argv"))
    );
    let never = f
        .rows("process.exit")
        .await
        .into_iter()
        .find(|r| r.detail["spawned"] == false)
        .expect("a row for the process that never ran");
    assert_eq!(never.outcome, "invalid_request");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_are_reattached_signalled_and_killed() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let bg = f
        .service
        .exec(
            &f.a,
            &id,
            body(json!({"shell": "echo bg-ready; exec sleep 1000", "background": true, "tag": "a-bg"})),
        )
        .await
        .expect("exec");
    assert!(bg.is_background());
    let pid = bg.pid();
    let replay = |from: u64| {
        let (f, id) = (&f, id.clone());
        async move {
            let query = AttachQuery {
                stdout_from: from,
                stderr_from: 0,
                follow: Some(false),
            };
            collect(
                f.service
                    .attach_process(&f.a, &id, pid, query)
                    .await
                    .expect("attach"),
            )
            .await
        }
    };
    poll("the background process's output", || async {
        (replay(0).await.stdout == "bg-ready\n").then_some(())
    })
    .await;
    assert_eq!(replay(3).await.stdout, "ready\n", "a replay starts at its offset");
    let listed = f.service.list_processes(&f.a, &id).await.expect("list");
    let info = listed.processes.iter().find(|p| p.pid == pid).expect("listed");
    assert!(info.running);
    assert_eq!(info.tag.as_deref(), Some("a-bg"));

    let term = SignalRequest {
        signal: json!("TERM"),
    };
    f.service
        .signal_process(&f.a, &id, pid, term)
        .await
        .expect("signal");
    assert_eq!(exit_row(&f, pid).await.detail["signal"], 15);
    let signal = &f.rows("process.signal").await[0];
    assert_eq!(
        (signal.detail["pid"].as_u64(), signal.detail["signal"].as_i64()),
        (Some(u64::from(pid)), Some(15))
    );
    // Signalling an exited process: it is gone.
    let again = SignalRequest { signal: json!(15) };
    assert_eq!(
        code(f.service.signal_process(&f.a, &id, pid, again).await),
        ErrorCode::ProcessNotFound
    );

    let second = f
        .service
        .exec(
            &f.a,
            &id,
            body(json!({"argv": ["sleep", "1001"], "background": true})),
        )
        .await
        .expect("exec")
        .pid();
    f.service
        .kill_process(&f.a, &id, second, KillRequest { signal: None })
        .await
        .expect("kill");
    assert_eq!(exit_row(&f, second).await.detail["signal"], 9);
    assert_eq!(f.rows("process.kill").await[0].detail["signal"], 9);
    assert!(!f.rows("process.attach").await.is_empty());
    let listed = f.service.list_processes(&f.a, &id).await.expect("list");
    assert!(listed.processes.iter().all(|p| !p.running), "{listed:?}");
    assert_eq!(
        listed
            .processes
            .iter()
            .find(|p| p.pid == second)
            .and_then(|p| p.exit.map(|e| e.exit_code)),
        Some(137)
    );

    // Unknown pids.
    let ghost = 9999;
    assert_eq!(
        code(
            f.service
                .signal_process(
                    &f.a,
                    &id,
                    ghost,
                    SignalRequest {
                        signal: json!("KILL")
                    }
                )
                .await
        ),
        ErrorCode::ProcessNotFound
    );
    assert_eq!(
        code(
            f.service
                .kill_process(&f.a, &id, ghost, KillRequest { signal: None })
                .await
        ),
        ErrorCode::ProcessNotFound
    );
    assert_eq!(
        code(
            f.service
                .attach_process(&f.a, &id, ghost, AttachQuery::default())
                .await
        ),
        ErrorCode::ProcessNotFound
    );
    assert_eq!(
        code(
            f.service
                .write_stdin(&f.a, &id, ghost, bytes::Bytes::from_static(b"x"), false)
                .await
        ),
        ErrorCode::ProcessNotFound
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_is_written_while_the_process_reads_it() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let stream = f
        .service
        .exec(
            &f.a,
            &id,
            body(json!({"shell": "cat; echo end", "stdin_open": true})),
        )
        .await
        .expect("exec");
    let pid = stream.pid();
    f.service
        .write_stdin(&f.a, &id, pid, bytes::Bytes::from_static(b"one "), false)
        .await
        .expect("stdin");
    f.service
        .write_stdin(&f.a, &id, pid, bytes::Bytes::from_static(b"two"), true)
        .await
        .expect("stdin, closed");
    let out = collect(stream).await;
    assert_eq!(out.stdout, "one twoend\n");
    let exit = exit_row(&f, pid).await;
    assert_eq!(exit.detail["bytes_in"], 7);
    // A process started without stdin has none to write to.
    let closed = f
        .service
        .exec(
            &f.a,
            &id,
            body(json!({"argv": ["sleep", "1000"], "background": true})),
        )
        .await
        .expect("exec")
        .pid();
    let e = crate::fixture::error(
        f.service
            .write_stdin(&f.a, &id, closed, bytes::Bytes::from_static(b"x"), false)
            .await,
    );
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreground_caller_that_goes_away_kills_its_process() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let stream = f
        .service
        .exec(&f.a, &id, body(json!({"argv": ["sleep", "1000"]})))
        .await
        .expect("exec");
    let pid = stream.pid();
    drop(stream);
    let exit = exit_row(&f, pid).await;
    assert_eq!(exit.detail["signal"], 9, "{exit:?}");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_kill_and_terminals_resize() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let out = f
        .exec(&f.a, &id, json!({"argv": ["sleep", "1000"], "timeout_ms": 50}))
        .await
        .expect("exec");
    let exit = out.exit.expect("an exit");
    assert!(exit.timed_out, "{exit:?}");
    assert_eq!((exit.signal, exit.exit_code), (Some(9), 137));
    assert_eq!(exit_row(&f, out.pid).await.detail["timed_out"], true);

    let pty = f
        .exec(
            &f.a,
            &id,
            json!({"shell": "echo on a terminal", "pty": {"rows": 10, "cols": 20}}),
        )
        .await
        .expect("exec");
    assert!(pty.kinds.contains(&"pty"), "{pty:?}");
    assert_eq!(pty.stdout, "on a terminal\n");
    let term = f
        .service
        .exec(
            &f.a,
            &id,
            body(json!({"argv": ["sleep", "1000"], "pty": {"rows": 10, "cols": 20}, "background": true})),
        )
        .await
        .expect("exec")
        .pid();
    f.service
        .resize_pty(&f.a, &id, term, PtySizeBody { rows: 50, cols: 100 })
        .await
        .expect("resize");
    let plain = f
        .service
        .exec(
            &f.a,
            &id,
            body(json!({"argv": ["sleep", "1000"], "background": true})),
        )
        .await
        .expect("exec")
        .pid();
    assert_eq!(
        code(
            f.service
                .resize_pty(&f.a, &id, plain, PtySizeBody { rows: 5, cols: 5 })
                .await
        ),
        ErrorCode::InvalidRequest
    );
    let e = crate::fixture::error(
        f.service
            .resize_pty(&f.a, &id, term, PtySizeBody { rows: 0, cols: 5 })
            .await,
    );
    assert_eq!(e.field.as_deref(), Some("pty"));
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_file_changes_are_audited_when_asked() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({"audit_exec_diff": true})).await.id;
    f.sh(&f.a, &id, "echo old > /home/user/keep && echo gone > /tmp/gone")
        .await;
    f.sh(
        &f.a,
        &id,
        "echo new > /home/user/added && echo changed > /home/user/keep && rm /tmp/gone",
    )
    .await;
    let rows = poll("two process.diff rows", || async {
        let rows = f.rows("process.diff").await;
        (rows.len() >= 2).then_some(rows)
    })
    .await;
    let second = &rows[1].detail;
    assert_eq!(
        (
            second["added"].as_u64(),
            second["modified"].as_u64(),
            second["deleted"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{second}"
    );
    let paths: Vec<&str> = second["paths"]
        .as_array()
        .expect("paths")
        .iter()
        .filter_map(|p| p["path"].as_str())
        .collect();
    assert_eq!(paths, ["/home/user/added", "/home/user/keep", "/tmp/gone"]);
    // The diff's snapshots are gone again (they have no records).
    poll("the exec-diff snapshots to be deleted", || async {
        (f.backend.stats().snapshots == 0).then_some(())
    })
    .await;
    f.finish().await;
}
