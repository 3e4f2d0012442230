//! Tenancy on every id route: another tenant's sandbox, process, snapshot, volume or secret answers
//! exactly like a missing one (the route's not-found code, the same message), and nothing of the
//! owner's changes.

use paddock_control::{ExportOptions, ServiceError, WriteFileOptions};
use paddock_types::api::{
    AttachQuery, AuditQuery, ErrorCode, KillRequest, ListSandboxesQuery, ListSnapshotsQuery,
    ListVolumesQuery, PtySizeBody, SandboxStateBody, SetTimeoutRequest, SignalRequest,
};
use serde_json::json;

use crate::fixture::{body, bytes_body, code, collect, error, sid, snap_id, Fixture, NO_SUCH_SANDBOX};
use paddock_types::SandboxId;

/// Every operation that takes a sandbox id (its process routes with a pid of that sandbox).
const SANDBOX_ROUTES: [&str; 33] = [
    "get",
    "kill",
    "timeout",
    "usage",
    "exec",
    "exec_background",
    "attach",
    "stdin",
    "signal",
    "kill_process",
    "resize",
    "processes",
    "read",
    "write",
    "list",
    "stat",
    "mkdir",
    "remove",
    "rename",
    "tar_download",
    "tar_upload",
    "watch",
    "snapshot",
    "checkpoint",
    "commit",
    "rollback",
    "fork",
    "diff",
    "pause",
    "resume",
    "stop",
    "network",
    "set_network",
];

/// Runs sandbox route `route` as `f.b` on sandbox `id` (process `pid`).
async fn sandbox_route(f: &Fixture, route: &str, id: &SandboxId, pid: u32) -> Result<(), ServiceError> {
    let (s, p) = (&f.service, &f.b);
    match route {
        "get" => s.get_sandbox(p, id).await.map(drop),
        "kill" => s.kill_sandbox(p, id).await,
        "timeout" => s
            .set_timeout(p, id, SetTimeoutRequest { timeout_secs: 60 })
            .await
            .map(drop),
        "usage" => s.sandbox_usage(p, id).await.map(drop),
        "exec" => s
            .exec(p, id, body(json!({"shell": "echo leaked > /home/user/leaked"})))
            .await
            .map(drop),
        "exec_background" => s
            .exec(p, id, body(json!({"argv": ["true"], "background": true})))
            .await
            .map(drop),
        "attach" => s
            .attach_process(p, id, pid, AttachQuery::default())
            .await
            .map(drop),
        "stdin" => {
            s.write_stdin(p, id, pid, bytes::Bytes::from_static(b"from b\n"), true)
                .await
        }
        "signal" => {
            s.signal_process(
                p,
                id,
                pid,
                SignalRequest {
                    signal: json!("TERM"),
                },
            )
            .await
        }
        "kill_process" => s.kill_process(p, id, pid, KillRequest { signal: None }).await,
        "resize" => s.resize_pty(p, id, pid, PtySizeBody { rows: 10, cols: 20 }).await,
        "processes" => s.list_processes(p, id).await.map(drop),
        "read" => s.read_file(p, id, "/home/user/secret.txt").await.map(drop),
        "write" => s
            .write_file(
                p,
                id,
                "/home/user/secret.txt",
                WriteFileOptions::default(),
                bytes_body(b"overwritten"),
            )
            .await
            .map(drop),
        "list" => s.list_dir(p, id, "/home/user").await.map(drop),
        "stat" => s.stat_file(p, id, "/home/user/secret.txt").await.map(drop),
        "mkdir" => s
            .make_dir(p, id, body(json!({"path": "/home/user/b-dir", "parents": true})))
            .await
            .map(drop),
        "remove" => s.remove_file(p, id, "/home/user", true, None).await,
        "rename" => s
            .rename_file(
                p,
                id,
                body(json!({"from": "/home/user/secret.txt", "to": "/home/user/stolen.txt"})),
            )
            .await
            .map(drop),
        "tar_download" => s.download_tar(p, id, "/home/user").await.map(drop),
        "tar_upload" => s.upload_tar(p, id, "/home/user", None, bytes_body(b"")).await,
        "watch" => s.watch_dir(p, id, "/home/user", true).await.map(drop),
        "snapshot" => s
            .create_snapshot(p, id, body(json!({"name": "b's"})))
            .await
            .map(drop),
        "checkpoint" => s.checkpoint(p, id).await.map(drop),
        "commit" => s.commit(p, id).await.map(drop),
        "rollback" => s.rollback(p, id, body(json!({}))).await.map(drop),
        "fork" => s.fork_sandbox(p, id, body(json!({"count": 1}))).await.map(drop),
        "diff" => s.diff_sandbox(p, id, body(json!({"text": true}))).await.map(drop),
        "pause" => s.pause_sandbox(p, id).await.map(drop),
        "resume" => s.resume_sandbox(p, id).await.map(drop),
        "stop" => s.stop_sandbox(p, id).await.map(drop),
        "network" => s.get_network(p, id).await.map(drop),
        "set_network" => s
            .set_network(p, id, body(json!({"secrets": ["GH"]})))
            .await
            .map(drop),
        other => panic!("unknown route {other}"),
    }
}

/// The same error with the ids replaced (a foreign id and a missing one must read alike).
fn shape(e: ServiceError, ids: &[&str]) -> (ErrorCode, String, Option<String>) {
    let mut message = e.message;
    for id in ids {
        message = message.replace(id, "<id>");
    }
    (e.code, message, e.field)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_sandbox_answers_like_a_missing_one_on_every_route() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({"labels": {"owner": "a"}})).await.id;
    f.service
        .write_file(
            &f.a,
            &id,
            "/home/user/secret.txt",
            WriteFileOptions::default(),
            bytes_body(b"A's secret"),
        )
        .await
        .expect("write");
    let pid = f
        .service
        .exec(
            &f.a,
            &id,
            body(json!({"shell": "echo bg-ready; exec sleep 1000", "stdin_open": true, "tag": "a-bg", "background": true})),
        )
        .await
        .expect("background")
        .pid();
    f.service
        .checkpoint(&f.a, &id)
        .await
        .expect("a checkpoint B must not reach");
    let before = f.backend.stats();
    let rows_before = f.audit(AuditQuery::default()).await.len();

    for route in SANDBOX_ROUTES {
        let foreign = error(sandbox_route(&f, route, &id, pid).await);
        let missing = error(sandbox_route(&f, route, &sid(NO_SUCH_SANDBOX), pid).await);
        assert_eq!(foreign.code, ErrorCode::SandboxNotFound, "{route}: {foreign:?}");
        assert_eq!(
            shape(foreign, &[&id]),
            shape(missing, &[NO_SUCH_SANDBOX]),
            "{route}: a foreign sandbox and a missing one differ"
        );
    }
    // An ended sandbox of A's is just as invisible (A itself gets sandbox_not_running).
    let ended = f.create(&f.a, json!({})).await.id;
    f.service.kill_sandbox(&f.a, &ended).await.expect("kill");
    for route in ["get", "kill", "exec", "list"] {
        let foreign = error(sandbox_route(&f, route, &ended, 1).await);
        assert_eq!(foreign.code, ErrorCode::SandboxNotFound, "{route}");
    }
    assert_eq!(
        code(f.exec(&f.a, &ended, json!({"argv": ["true"]})).await),
        ErrorCode::SandboxNotRunning
    );
    // B lists nothing, in any state, and its audit view holds none of A's rows.
    for state in ["running", "all"] {
        let q = ListSandboxesQuery {
            state: Some(state.into()),
            ..ListSandboxesQuery::default()
        };
        assert!(f
            .service
            .list_sandboxes(&f.b, q)
            .await
            .expect("list")
            .sandboxes
            .is_empty());
    }
    let b_rows = f
        .service
        .query_audit(&f.b, AuditQuery::default())
        .await
        .expect("B's audit");
    assert!(
        b_rows
            .records
            .iter()
            .all(|r| r.tenant.as_deref() == Some("tenant-b")),
        "{b_rows:?}"
    );
    let mine = AuditQuery {
        tenant: Some("tenant-a".into()),
        ..AuditQuery::default()
    };
    assert_eq!(
        code(f.service.query_audit(&f.b, mine).await),
        ErrorCode::Forbidden
    );

    // Nothing of A's changed: the sandbox, its file, its process, its checkpoint; B's attempts
    // booted, stopped or snapshotted nothing and wrote no row.
    let info = f.service.get_sandbox(&f.a, &id).await.expect("get");
    assert_eq!((info.state, info.paused), (SandboxStateBody::Running, false));
    assert_eq!(f.sh(&f.a, &id, "cat /home/user/secret.txt").await, "A's secret");
    assert_eq!(f.sh(&f.a, &id, "ls /home/user").await, "secret.txt\n");
    let processes = f.service.list_processes(&f.a, &id).await.expect("processes");
    let bg = processes
        .processes
        .iter()
        .find(|p| p.pid == pid)
        .expect("A's process");
    assert!(bg.running && bg.tag.as_deref() == Some("a-bg"), "{bg:?}");
    let replay = AttachQuery {
        follow: Some(false),
        ..AttachQuery::default()
    };
    let out = collect(
        f.service
            .attach_process(&f.a, &id, pid, replay)
            .await
            .expect("attach"),
    )
    .await;
    assert_eq!(out.stdout, "bg-ready\n", "B's stdin never reached it");
    let after = f.backend.stats();
    assert_eq!(
        (after.created, after.snapshots, after.stopped),
        (before.created + 1, before.snapshots, 0)
    );
    let b_writes = f
        .audit(AuditQuery {
            tenant: Some("tenant-b".into()),
            ..AuditQuery::default()
        })
        .await;
    assert!(
        b_writes.is_empty(),
        "B's refused attempts wrote rows: {b_writes:?}"
    );
    assert!(f.audit(AuditQuery::default()).await.len() > rows_before);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_snapshot_volume_and_secret_answer_like_missing_ones() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    f.sh(&f.a, &id, "echo a > /home/user/f").await;
    let snap = f
        .service
        .create_snapshot(&f.a, &id, body(json!({})))
        .await
        .expect("snapshot");
    let vol = f
        .service
        .create_volume(&f.a, body(json!({"name": "a-data"})))
        .await
        .expect("volume");
    f.service
        .create_secret(
            &f.a,
            body(json!({"name": "GH", "value": "token", "hosts": ["api.github.com"]})),
        )
        .await
        .expect("secret");
    let b_box = f.create(&f.b, json!({})).await.id;
    let missing_snapshot = "sn-00000000000000ff";
    let s = &f.service;
    let pair = |foreign: Result<(), ServiceError>,
                missing: Result<(), ServiceError>,
                ids: [&str; 2],
                expected: ErrorCode| {
        let foreign = error(foreign);
        assert_eq!(foreign.code, expected, "{foreign:?}");
        assert_eq!(shape(foreign, &[ids[0]]), shape(error(missing), &[ids[1]]));
    };
    for (a, m) in [(snap.id.as_str(), missing_snapshot)] {
        let (a_id, m_id) = (snap_id(a), snap_id(m));
        pair(
            s.get_snapshot(&f.b, &a_id).await.map(drop),
            s.get_snapshot(&f.b, &m_id).await.map(drop),
            [a, m],
            ErrorCode::SnapshotNotFound,
        );
        pair(
            s.delete_snapshot(&f.b, &a_id).await,
            s.delete_snapshot(&f.b, &m_id).await,
            [a, m],
            ErrorCode::SnapshotNotFound,
        );
        pair(
            s.export_snapshot(&f.b, &a_id, ExportOptions::default())
                .await
                .map(drop),
            s.export_snapshot(&f.b, &m_id, ExportOptions::default())
                .await
                .map(drop),
            [a, m],
            ErrorCode::SnapshotNotFound,
        );
        pair(
            f.try_create(&f.b, json!({"snapshot": a})).await.map(drop),
            f.try_create(&f.b, json!({"snapshot": m})).await.map(drop),
            [a, m],
            ErrorCode::SnapshotNotFound,
        );
        pair(
            s.rollback(&f.b, &b_box, body(json!({"snapshot": a})))
                .await
                .map(drop),
            s.rollback(&f.b, &b_box, body(json!({"snapshot": m})))
                .await
                .map(drop),
            [a, m],
            ErrorCode::SnapshotNotFound,
        );
        pair(
            s.diff_sandbox(&f.b, &b_box, body(json!({"snapshot": a})))
                .await
                .map(drop),
            s.diff_sandbox(&f.b, &b_box, body(json!({"snapshot": m})))
                .await
                .map(drop),
            [a, m],
            ErrorCode::SnapshotNotFound,
        );
    }
    for (a, m) in [
        (vol.id.as_str(), "vol-00000000000000ff"),
        ("a-data", "no-such-volume"),
    ] {
        pair(
            s.get_volume(&f.b, a).await.map(drop),
            s.get_volume(&f.b, m).await.map(drop),
            [a, m],
            ErrorCode::VolumeNotFound,
        );
        pair(
            s.delete_volume(&f.b, a).await,
            s.delete_volume(&f.b, m).await,
            [a, m],
            ErrorCode::VolumeNotFound,
        );
        pair(
            f.try_create(&f.b, json!({"volumes": [{"volume": a, "path": "/data"}]}))
                .await
                .map(drop),
            f.try_create(&f.b, json!({"volumes": [{"volume": m, "path": "/data"}]}))
                .await
                .map(drop),
            [a, m],
            ErrorCode::VolumeNotFound,
        );
    }
    pair(
        s.delete_secret(&f.b, "GH").await,
        s.delete_secret(&f.b, "NOPE").await,
        ["GH", "NOPE"],
        ErrorCode::SecretNotFound,
    );
    // B lists none of them; A still has all of them.
    assert!(s
        .list_snapshots(&f.b, ListSnapshotsQuery::default())
        .await
        .expect("list")
        .snapshots
        .is_empty());
    assert!(s
        .list_volumes(&f.b, ListVolumesQuery::default())
        .await
        .expect("list")
        .volumes
        .is_empty());
    assert!(s.list_secrets(&f.b).await.expect("list").secrets.is_empty());
    s.get_snapshot(&f.a, &snap_id(&snap.id))
        .await
        .expect("A's snapshot");
    s.get_volume(&f.a, "a-data").await.expect("A's volume");
    assert_eq!(s.list_secrets(&f.a).await.expect("list").secrets.len(), 1);
    assert_eq!(f.backend.stats().created, 2, "B made nothing from A's things");
    f.finish().await;
}
