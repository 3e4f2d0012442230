//! The sandbox state machine: create, get, list, kill, expiry and timeout extension, pause and
//! resume, stop and resume, what a timeout does, a dead agent, usage; the transitions allowed and
//! the codes of the ones refused, with the rows each writes.

use paddock_runtime::RuntimeError;
use paddock_types::api::{AuditQuery, ErrorCode, ListSandboxesQuery, SandboxStateBody, SetTimeoutRequest};
use serde_json::json;

use crate::fixture::{body, code, poll, Fixture};

fn running() -> ListSandboxesQuery {
    ListSandboxesQuery::default()
}

fn in_state(state: &str) -> ListSandboxesQuery {
    ListSandboxesQuery {
        state: Some(state.into()),
        ..ListSandboxesQuery::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_get_list_and_kill_write_their_rows() {
    let f = Fixture::start().await;
    let info = f
        .create(&f.a, json!({"labels": {"team": "x"}, "env": {"K": "v"}}))
        .await;
    assert_eq!(info.state, SandboxStateBody::Running);
    assert_eq!(
        (info.tenant.as_str(), info.template.as_str()),
        ("tenant-a", "default")
    );
    assert_eq!(info.env_keys, ["K"]);
    assert_eq!(f.backend.stats().live, 1);
    let got = f.service.get_sandbox(&f.a, &info.id).await.expect("get");
    assert_eq!(got.labels["team"], "x");
    let listed = f.service.list_sandboxes(&f.a, running()).await.expect("list");
    assert_eq!(
        listed.sandboxes.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [info.id.as_str()]
    );
    let labelled = ListSandboxesQuery {
        label: Some("team=y".into()),
        ..ListSandboxesQuery::default()
    };
    assert!(f
        .service
        .list_sandboxes(&f.a, labelled)
        .await
        .expect("list")
        .sandboxes
        .is_empty());

    f.service.kill_sandbox(&f.a, &info.id).await.expect("kill");
    let ended = f
        .service
        .get_sandbox(&f.a, &info.id)
        .await
        .expect("still readable");
    assert_eq!(ended.state, SandboxStateBody::Killed);
    assert_eq!(ended.end_reason.as_deref(), Some("killed"));
    assert!(ended.ended_at.is_some());
    assert_eq!(f.backend.stats().live, 0, "the backend tore it down");
    assert!(f
        .service
        .list_sandboxes(&f.a, running())
        .await
        .expect("list")
        .sandboxes
        .is_empty());
    assert_eq!(
        f.service
            .list_sandboxes(&f.a, in_state("killed"))
            .await
            .expect("list")
            .sandboxes
            .len(),
        1
    );
    // A killed sandbox refuses everything live.
    assert_eq!(
        code(f.service.kill_sandbox(&f.a, &info.id).await),
        ErrorCode::SandboxNotRunning
    );
    assert_eq!(
        code(f.exec(&f.a, &info.id, json!({"argv": ["true"]})).await),
        ErrorCode::SandboxNotRunning
    );
    assert_eq!(
        code(f.service.stop_sandbox(&f.a, &info.id).await),
        ErrorCode::SandboxNotRunning
    );
    assert_eq!(
        code(f.service.pause_sandbox(&f.a, &info.id).await),
        ErrorCode::SandboxNotRunning
    );
    assert_eq!(
        code(f.service.resume_sandbox(&f.a, &info.id).await),
        ErrorCode::SandboxNotRunning
    );

    let rows = f
        .audit(AuditQuery {
            sandbox: Some(info.id.to_string()),
            ..AuditQuery::default()
        })
        .await;
    let actions: Vec<&str> = rows.iter().map(|r| r.action.as_str()).collect();
    assert_eq!(actions, ["sandbox.create", "sandbox.kill"]);
    for row in &rows {
        assert_eq!(row.tenant.as_deref(), Some("tenant-a"), "{row:?}");
        assert_eq!(row.key_id.as_deref(), Some(f.a.key_id.as_str()), "{row:?}");
        assert_eq!(row.outcome, "ok", "{row:?}");
    }
    assert_eq!(rows[0].detail["source"], "boot");
    assert_eq!(rows[0].detail["template"], "default");
    assert_eq!(rows[1].detail["reason"], "killed");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_boot_answers_no_space_and_is_recorded_as_an_error() {
    let f = Fixture::start().await;
    f.backend.fail_next(
        "create_sandbox",
        RuntimeError::Pool {
            what: "snapshot the template into",
            path: "/pool/sandboxes/x".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        },
    );
    let e = f.try_create(&f.a, json!({})).await.expect_err("the pool is full");
    assert_eq!(e.code, ErrorCode::NoSpace, "{e:?}");
    assert_eq!(f.backend.stats().created, 0);
    let failed = f
        .service
        .list_sandboxes(&f.a, in_state("failed"))
        .await
        .expect("list");
    assert_eq!(failed.sandboxes.len(), 1);
    let reason = failed.sandboxes[0].end_reason.clone().unwrap_or_default();
    assert!(reason.starts_with("create_failed"), "{reason}");
    let rows = f.rows("sandbox.create").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].outcome, "error");
    assert_eq!(
        rows[0].sandbox_id.as_deref(),
        Some(failed.sandboxes[0].id.as_str())
    );
    // Another failure is internal and says nothing of its cause.
    f.backend.fail_next(
        "create_sandbox",
        RuntimeError::Setup("mount failed: EPERM".into()),
    );
    let e = f.try_create(&f.a, json!({})).await.expect_err("setup fails");
    assert_eq!(e.code, ErrorCode::Internal);
    assert!(!e.message.contains("EPERM"), "{e:?}");
    // The next create works.
    f.create(&f.a, json!({})).await;
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_expires_sandboxes_and_an_extension_postpones_it() {
    let f = Fixture::start().await;
    let short = f.create(&f.a, json!({"timeout_secs": 1})).await;
    let long = f.create(&f.a, json!({"timeout_secs": 2})).await;
    let extended = f
        .service
        .set_timeout(&f.a, &long.id, SetTimeoutRequest { timeout_secs: 600 })
        .await
        .expect("extend");
    assert!(extended.expires_at > long.expires_at, "{extended:?}");
    let expired = poll("the reaper to expire the sandbox", || async {
        let info = f.service.get_sandbox(&f.a, &short.id).await.expect("get");
        (info.state == SandboxStateBody::Expired).then_some(info)
    })
    .await;
    assert_eq!(expired.end_reason.as_deref(), Some("expired"));
    poll("the expired sandbox's teardown", || async {
        (!f.backend.sandbox_ids().iter().any(|id| id.as_str() == short.id)).then_some(())
    })
    .await;
    for refused in [
        code(f.exec(&f.a, &short.id, json!({"argv": ["true"]})).await),
        code(f.service.kill_sandbox(&f.a, &short.id).await),
        code(
            f.service
                .set_timeout(&f.a, &short.id, SetTimeoutRequest { timeout_secs: 60 })
                .await,
        ),
    ] {
        assert_eq!(refused, ErrorCode::SandboxNotRunning);
    }
    let rows = f.rows("sandbox.expire").await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].tenant.as_deref(), Some("tenant-a"));
    assert_eq!(rows[0].key_id, None, "the reaper acted, not a key");
    // The extended one outlives its first deadline: nothing can show that but time passing (a
    // few reaper rounds past it).
    let first_deadline =
        humantime::parse_rfc3339(long.expires_at.as_deref().expect("expires_at")).expect("RFC 3339");
    let wait = first_deadline
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    tokio::time::sleep(wait + std::time::Duration::from_millis(300)).await;
    let info = f.service.get_sandbox(&f.a, &long.id).await.expect("get");
    assert_eq!(
        info.state,
        SandboxStateBody::Running,
        "expired despite the extension"
    );
    let rows = f.rows("sandbox.timeout").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].detail["timeout_secs"], 600);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_freezes_the_agent_and_resume_thaws_it() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    f.sh(&f.a, &id, "echo kept > /home/user/f").await;
    let paused = f.service.pause_sandbox(&f.a, &id).await.expect("pause");
    assert!(paused.paused);
    assert_eq!(f.backend.is_paused(&id.parse().expect("id")), Some(true));
    // Pausing again changes nothing (and writes no second row).
    f.service.pause_sandbox(&f.a, &id).await.expect("pause again");
    // The agent is frozen: everything that needs it is refused; what reads the storage is not.
    assert_eq!(
        code(f.exec(&f.a, &id, json!({"argv": ["true"]})).await),
        ErrorCode::SandboxNotRunning
    );
    assert_eq!(
        code(f.service.list_dir(&f.a, &id, "/home/user").await),
        ErrorCode::SandboxNotRunning
    );
    f.service
        .sandbox_usage(&f.a, &id)
        .await
        .expect("usage while paused");
    let snapshot = f
        .service
        .create_snapshot(&f.a, &id, body(json!({})))
        .await
        .expect("a paused sandbox can be snapshotted");
    assert_eq!(
        f.backend.is_paused(&id.parse().expect("id")),
        Some(true),
        "and stays paused"
    );
    let resumed = f.service.resume_sandbox(&f.a, &id).await.expect("resume");
    assert!(!resumed.paused);
    f.service.resume_sandbox(&f.a, &id).await.expect("resume again");
    assert_eq!(f.sh(&f.a, &id, "cat /home/user/f").await, "kept\n");
    // Exactly one pause and one resume, around the snapshot (exits are written by the process's
    // monitor, so they are left out of the order).
    assert_eq!(
        f.actions_but_exits(&id).await,
        [
            "sandbox.create",
            "process.start",
            "sandbox.pause",
            "snapshot.create",
            "sandbox.resume",
            "process.start"
        ]
    );
    assert_eq!(snapshot.sandbox_id.as_deref(), Some(id.as_str()));
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_keeps_the_files_and_resume_restarts_the_processes() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    f.sh(
        &f.a,
        &id,
        "echo kept > /home/user/f; mkdir /tmp/t; echo tmp > /tmp/t/x",
    )
    .await;
    f.exec(&f.a, &id, json!({"argv": ["sleep", "1000"], "background": true}))
        .await
        .expect("background");
    let stopped = f.service.stop_sandbox(&f.a, &id).await.expect("stop");
    assert_eq!(stopped.state, SandboxStateBody::Stopped);
    assert!(
        stopped.expires_at.is_none() && stopped.ended_at.is_none(),
        "{stopped:?}"
    );
    let stats = f.backend.stats();
    assert_eq!(
        (stats.live, stats.stopped),
        (0, 1),
        "its files are kept, nothing runs"
    );
    assert_eq!(
        code(f.exec(&f.a, &id, json!({"argv": ["true"]})).await),
        ErrorCode::SandboxNotRunning
    );
    assert_eq!(
        code(f.service.stop_sandbox(&f.a, &id).await),
        ErrorCode::SandboxNotRunning
    );
    assert_eq!(
        code(f.service.pause_sandbox(&f.a, &id).await),
        ErrorCode::SandboxNotRunning
    );
    assert_eq!(
        f.service
            .list_sandboxes(&f.a, in_state("stopped"))
            .await
            .expect("list")
            .sandboxes[0]
            .id,
        id
    );
    let resumed = f.service.resume_sandbox(&f.a, &id).await.expect("resume");
    assert_eq!(
        (resumed.id.as_str(), resumed.state),
        (id.as_str(), SandboxStateBody::Running)
    );
    assert!(resumed.expires_at.is_some(), "the timeout restarts");
    assert_eq!(f.sh(&f.a, &id, "cat /home/user/f /tmp/t/x").await, "kept\ntmp\n");
    let processes = f.service.list_processes(&f.a, &id).await.expect("processes");
    assert!(
        processes.processes.iter().all(
            |p| !matches!(&p.command, paddock_types::api::ProcessCommand::Argv { argv } if argv[0] == "sleep")
        ),
        "processes do not survive a stop: {processes:?}"
    );
    assert_eq!(f.sh(&f.a, &id, "hostname").await.trim(), id);
    // Killing a stopped sandbox frees its kept files and ends it as killed.
    f.service.stop_sandbox(&f.a, &id).await.expect("stop again");
    f.service
        .kill_sandbox(&f.a, &id)
        .await
        .expect("kill the stopped sandbox");
    assert_eq!(f.backend.stats().stopped, 0);
    let ended = f.service.get_sandbox(&f.a, &id).await.expect("get");
    assert_eq!(ended.state, SandboxStateBody::Killed);
    assert_eq!(
        code(f.service.resume_sandbox(&f.a, &id).await),
        ErrorCode::SandboxNotRunning
    );
    let lifecycle: Vec<String> = f
        .actions(&id)
        .await
        .into_iter()
        .filter(|a| a.starts_with("sandbox."))
        .collect();
    assert_eq!(
        lifecycle,
        [
            "sandbox.create",
            "sandbox.stop",
            "sandbox.resume",
            "sandbox.stop",
            "sandbox.kill"
        ]
    );
    let resume = &f.rows("sandbox.resume").await[0];
    assert_eq!(resume.detail["from"], "stopped");
    let kill = &f.rows("sandbox.kill").await[0];
    assert_eq!(kill.detail["from"], "stopped");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_can_pause_or_stop_instead_of_killing() {
    let f = Fixture::start().await;
    let paused = f
        .create(&f.a, json!({"timeout_secs": 1, "on_timeout": "pause"}))
        .await
        .id;
    let stopped = f
        .create(&f.a, json!({"timeout_secs": 1, "on_timeout": "stop"}))
        .await
        .id;
    f.sh(&f.a, &stopped, "echo survives > /home/user/f").await;
    let frozen = poll("the timeout to pause the sandbox", || async {
        let info = f.service.get_sandbox(&f.a, &paused).await.expect("get");
        info.paused.then_some(info)
    })
    .await;
    assert_eq!(frozen.state, SandboxStateBody::Running);
    assert!(
        frozen.expires_at.is_none(),
        "no second timeout while paused: {frozen:?}"
    );
    assert_eq!(f.backend.is_paused(&paused.parse().expect("id")), Some(true));
    let rows = f.rows("sandbox.pause").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].detail["cause"].as_str(), rows[0].key_id.as_deref()),
        (Some("timeout"), None)
    );
    let resumed = f.service.resume_sandbox(&f.a, &paused).await.expect("resume");
    assert!(
        !resumed.paused && resumed.expires_at.is_some(),
        "the timeout is armed again: {resumed:?}"
    );
    poll("the timeout to stop the other sandbox", || async {
        let info = f.service.get_sandbox(&f.a, &stopped).await.expect("get");
        (info.state == SandboxStateBody::Stopped).then_some(())
    })
    .await;
    let stop = f.rows("sandbox.stop").await;
    assert_eq!(stop[0].detail["cause"], "timeout");
    f.service.resume_sandbox(&f.a, &stopped).await.expect("resume");
    assert_eq!(f.sh(&f.a, &stopped, "cat /home/user/f").await, "survives\n");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_whose_agent_died_is_ended_as_lost() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let stream = f
        .service
        .exec(&f.a, &id, body(json!({"argv": ["sleep", "1000"]})))
        .await
        .expect("exec");
    assert!(f.backend.kill_agent(&id.parse().expect("id")));
    let lost = poll("the reaper to notice the dead agent", || async {
        let info = f.service.get_sandbox(&f.a, &id).await.expect("get");
        (info.state == SandboxStateBody::Failed).then_some(info)
    })
    .await;
    assert_eq!(lost.end_reason.as_deref(), Some("agent_lost"));
    let out = crate::fixture::collect(stream).await;
    assert_eq!(
        out.error.map(|e| e.0),
        Some(ErrorCode::SandboxNotRunning),
        "the stream says why it ended"
    );
    let rows = f.rows("sandbox.lost").await;
    assert_eq!((rows.len(), rows[0].outcome.as_str()), (1, "lost"));
    let exits = poll("the exit row of the lost process", || async {
        let rows = f.rows("process.exit").await;
        (!rows.is_empty()).then_some(rows)
    })
    .await;
    assert_eq!(exits[0].outcome, "lost");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_counts_the_files_and_reports_the_limits() {
    let f = Fixture::start().await;
    let id = f
        .create(&f.a, json!({"limits": {"memory": "512M", "disk": "1G"}}))
        .await
        .id;
    let before = f.service.sandbox_usage(&f.a, &id).await.expect("usage");
    assert_eq!(before.memory_limit_bytes, Some(512 << 20));
    assert_eq!(before.disk_limit_bytes, Some(1 << 30));
    assert!(before.pids >= 1, "{before:?}");
    f.service
        .write_file(
            &f.a,
            &id,
            "/home/user/blob",
            Default::default(),
            crate::fixture::bytes_body(&[7u8; 10_000]),
        )
        .await
        .expect("write");
    let after = f.service.sandbox_usage(&f.a, &id).await.expect("usage");
    assert_eq!(after.disk_bytes, before.disk_bytes + 10_000);
    assert_eq!(
        code(f.service.sandbox_usage(&f.b, &id).await),
        ErrorCode::SandboxNotFound
    );
    f.finish().await;
}
