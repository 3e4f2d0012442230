//! Validation: a bad field is refused naming the field (`ServiceError.field`), before anything is
//! created or booted on the backend; refused creates are recorded.

use paddock_control::WriteFileOptions;
use paddock_types::api::{
    AuditQuery, CreateKeyRequest, ErrorCode, KillRequest, ListSandboxesQuery, ListSnapshotsQuery,
    ListVolumesQuery, SetTimeoutRequest, SignalRequest,
};
use paddock_types::CpuQuota;
use serde_json::{json, Value};

use crate::fixture::{body, bytes_body, error, Fixture};

/// Asserts an `invalid_request` (or `code`) naming `field`.
#[track_caller]
fn refused<T>(result: Result<T, paddock_control::ServiceError>, code: ErrorCode, field: &str) {
    let e = error(result);
    assert_eq!((e.code, e.field.as_deref()), (code, Some(field)), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_with_a_bad_field_names_it_boots_nothing_and_is_recorded() {
    let f = Fixture::with(|c| c.max_limits.cpus = CpuQuota::try_from(2.0).ok()).await;
    let many_labels: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let cases = [
        (json!({"limits": {"memory": "8G"}}), "limits.memory"),
        (json!({"limits": {"memory": "1M"}}), "limits.memory"),
        (json!({"limits": {"pids": 0}}), "limits.pids"),
        (json!({"limits": {"pids": 5000}}), "limits.pids"),
        (json!({"limits": {"cpus": 4}}), "limits.cpus"),
        (json!({"limits": {"disk": "20G"}}), "limits.disk"),
        (json!({"timeout_secs": 0}), "timeout_secs"),
        (json!({"timeout_secs": 1_000_000}), "timeout_secs"),
        (json!({"template": "nope"}), "template"),
        (json!({"workdir": "relative/dir"}), "workdir"),
        (json!({"user": "no such user!"}), "user"),
        (json!({"labels": {"a=b": "x"}}), "labels.a=b"),
        (json!({"labels": many_labels}), "labels"),
        (json!({"env": {"A=B": "x"}}), "env.A=B"),
        (json!({"env": {"": "x"}}), "env."),
    ];
    for (request, field) in &cases {
        refused(
            f.try_create(&f.a, request.clone()).await,
            ErrorCode::InvalidRequest,
            field,
        );
    }
    // Not this server's: no network without an egress proxy; a snapshot that is not the tenant's.
    let e = error(
        f.try_create(&f.a, json!({"network": {"allow": [{"domain": "example.com"}]}}))
            .await,
    );
    assert_eq!(e.code, ErrorCode::Unsupported);
    refused(
        f.try_create(&f.a, json!({"snapshot": "sn-00000000000000ff"}))
            .await,
        ErrorCode::SnapshotNotFound,
        "snapshot",
    );
    assert_eq!(f.backend.stats().created, 0, "nothing was booted");
    let all = ListSandboxesQuery {
        state: Some("all".into()),
        ..ListSandboxesQuery::default()
    };
    assert!(f
        .service
        .list_sandboxes(&f.a, all)
        .await
        .expect("list")
        .sandboxes
        .is_empty());
    let rows = f.rows("sandbox.create").await;
    assert_eq!(rows.len(), cases.len() + 2, "every refused create is recorded");
    let expected = cases
        .iter()
        .map(|(_, field)| ("invalid_request", Some(*field)))
        .chain([("unsupported", None), ("snapshot_not_found", Some("snapshot"))]);
    for (row, expected) in rows.iter().zip(expected) {
        assert_eq!((row.outcome.as_str(), row.detail["field"].as_str()), expected);
        assert_eq!(row.sandbox_id, None);
    }
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_requests_name_their_bad_field() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let exec = |request: Value| {
        let (f, id) = (&f, id.clone());
        async move { f.exec(&f.a, &id, request).await }
    };
    for (request, field) in [
        (json!({}), "argv"),
        (json!({"argv": []}), "argv"),
        (json!({"argv": [""]}), "argv"),
        (json!({"argv": ["true"], "shell": "true"}), "argv"),
        (json!({"argv": ["a\u{0}b"]}), "argv"),
        (json!({"shell": "a\u{0}b"}), "shell"),
        (json!({"argv": ["true"], "cwd": "relative"}), "cwd"),
        (json!({"argv": ["true"], "pty": {"rows": 0, "cols": 80}}), "pty"),
        (json!({"argv": ["true"], "env": {"": "x"}}), "env."),
        (json!({"argv": ["true"], "tag": "t".repeat(300)}), "tag"),
        // Refused by the agent, mapped to the field.
        (json!({"argv": ["/nonexistent/program"]}), "argv"),
        (json!({"argv": ["true"], "cwd": "/nonexistent"}), "cwd"),
        (json!({"argv": ["true"], "user": "ghost"}), "user"),
    ] {
        refused(exec(request).await, ErrorCode::InvalidRequest, field);
    }
    // A command too long for one request of the agent's protocol: refused as too large, not as an
    // internal error, and nothing started.
    let e = error(exec(json!({"shell": format!("echo {}", "x".repeat(70 * 1024))})).await);
    assert_eq!(e.code, ErrorCode::PayloadTooLarge, "{e:?}");
    assert!(e.message.contains("write a long script to a file"), "{e:?}");
    let s = &f.service;
    refused(
        s.set_timeout(&f.a, &id, SetTimeoutRequest { timeout_secs: 0 })
            .await,
        ErrorCode::InvalidRequest,
        "timeout_secs",
    );
    refused(
        s.set_timeout(
            &f.a,
            &id,
            SetTimeoutRequest {
                timeout_secs: 10_000_000,
            },
        )
        .await,
        ErrorCode::InvalidRequest,
        "timeout_secs",
    );
    refused(
        s.signal_process(
            &f.a,
            &id,
            2,
            SignalRequest {
                signal: json!("BOGUS"),
            },
        )
        .await,
        ErrorCode::InvalidRequest,
        "signal",
    );
    refused(
        s.signal_process(&f.a, &id, 2, SignalRequest { signal: json!(99) })
            .await,
        ErrorCode::InvalidRequest,
        "signal",
    );
    refused(
        s.kill_process(
            &f.a,
            &id,
            2,
            KillRequest {
                signal: Some(json!("nope")),
            },
        )
        .await,
        ErrorCode::InvalidRequest,
        "signal",
    );
    refused(
        s.fork_sandbox(&f.a, &id, body(json!({"count": 0}))).await,
        ErrorCode::InvalidRequest,
        "count",
    );
    refused(
        s.fork_sandbox(&f.a, &id, body(json!({"count": 101}))).await,
        ErrorCode::InvalidRequest,
        "count",
    );
    refused(
        s.create_snapshot(&f.a, &id, body(json!({"name": "n".repeat(300)})))
            .await,
        ErrorCode::InvalidRequest,
        "name",
    );
    refused(
        s.create_snapshot(&f.a, &id, body(json!({"labels": {"": "v"}})))
            .await,
        ErrorCode::InvalidRequest,
        "labels.",
    );
    let other = f.create(&f.a, json!({})).await.id;
    let foreign = s
        .create_snapshot(&f.a, &other, body(json!({})))
        .await
        .expect("snapshot");
    refused(
        s.rollback(&f.a, &id, body(json!({"snapshot": foreign.id}))).await,
        ErrorCode::InvalidRequest,
        "snapshot",
    );
    assert_eq!(f.backend.stats().created, 2, "no fork was booted");
    assert_eq!(f.backend.stats().snapshots, 1);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_list_and_admin_requests_name_their_bad_field() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let s = &f.service;
    refused(
        s.read_file(&f.a, &id, "relative").await,
        ErrorCode::InvalidPath,
        "path",
    );
    refused(
        s.list_dir(&f.a, &id, "a\u{0}b").await,
        ErrorCode::InvalidPath,
        "path",
    );
    refused(
        s.write_file(
            &f.a,
            &id,
            "/tmp/x",
            WriteFileOptions {
                mode: Some(0o10000),
                user: None,
                parents: false,
                approval_id: None,
            },
            bytes_body(b"x"),
        )
        .await,
        ErrorCode::InvalidRequest,
        "mode",
    );
    refused(
        s.make_dir(&f.a, &id, body(json!({"path": "/tmp/d", "mode": 0o10000})))
            .await,
        ErrorCode::InvalidRequest,
        "mode",
    );
    refused(
        s.remove_file(&f.a, &id, "/", true, None).await,
        ErrorCode::InvalidPath,
        "path",
    );
    refused(
        s.rename_file(&f.a, &id, body(json!({"from": "/tmp/a", "to": "b"})))
            .await,
        ErrorCode::InvalidPath,
        "to",
    );
    refused(
        s.list_sandboxes(&f.a, body(json!({"state": "bogus"}))).await,
        ErrorCode::InvalidRequest,
        "state",
    );
    refused(
        s.list_sandboxes(&f.a, body(json!({"label": "nokv"}))).await,
        ErrorCode::InvalidRequest,
        "label",
    );
    refused(
        s.list_sandboxes(&f.a, body(json!({"limit": 0}))).await,
        ErrorCode::InvalidRequest,
        "limit",
    );
    refused(
        s.list_snapshots(
            &f.a,
            ListSnapshotsQuery {
                kind: Some("bogus".into()),
                ..ListSnapshotsQuery::default()
            },
        )
        .await,
        ErrorCode::InvalidRequest,
        "kind",
    );
    refused(
        s.list_volumes(
            &f.a,
            ListVolumesQuery {
                limit: Some(1001),
                ..ListVolumesQuery::default()
            },
        )
        .await,
        ErrorCode::InvalidRequest,
        "limit",
    );
    for (query, field) in [
        (json!({"limit": 0}), "limit"),
        (json!({"since": "yesterday"}), "since"),
        (json!({"until": "soon"}), "until"),
    ] {
        let query: AuditQuery = body(query);
        refused(s.query_audit(&f.a, query).await, ErrorCode::InvalidRequest, field);
    }
    refused(
        s.create_key(
            &f.admin,
            CreateKeyRequest {
                tenant: "Not A Tenant".into(),
                name: None,
                admin: false,
                change_network: true,
                approver: false,
            },
        )
        .await,
        ErrorCode::InvalidRequest,
        "tenant",
    );
    refused(
        s.set_tenant_quota(&f.admin, "Bad Name", body(json!({"max_sandboxes": 1})))
            .await,
        ErrorCode::InvalidRequest,
        "name",
    );
    for (request, field) in [
        (json!({"name": "Bad Name!"}), "name"),
        (json!({"name": "ok", "size": 0}), "size"),
        (json!({"name": "ok", "size": "20G"}), "size"),
        (json!({"name": "ok", "labels": {"": "v"}}), "labels."),
    ] {
        refused(
            s.create_volume(&f.a, body(request)).await,
            ErrorCode::InvalidRequest,
            field,
        );
    }
    refused(
        s.import_snapshot(&f.a, Some("n".repeat(300)), Default::default(), bytes_body(b""))
            .await,
        ErrorCode::InvalidRequest,
        "name",
    );
    let stats = f.backend.stats();
    assert_eq!(
        (stats.created, stats.snapshots, stats.volumes),
        (1, 0, 0),
        "nothing was made"
    );
    f.finish().await;
}
