//! Snapshots (create, get, list, delete), step transactions (checkpoint, rollback, commit), forks,
//! creating from a snapshot, diffs, export and import; with their rows and error codes.

use futures_util::StreamExt;
use paddock_control::ExportOptions;
use paddock_runtime::RuntimeError;
use paddock_types::api::{ChangeBody, ErrorCode, ListSnapshotsQuery, SnapshotKindBody};
use serde_json::json;

use crate::fixture::{body, bytes_body, code, collect, error, poll, sid, snap_id, Fixture, DEADLINE};

fn no_space(what: &'static str) -> RuntimeError {
    RuntimeError::Pool {
        what,
        path: "/pool".into(),
        source: std::io::Error::from_raw_os_error(libc::ENOSPC),
    }
}

async fn export(f: &Fixture, snapshot: &str, keep_setid: bool) -> Vec<u8> {
    let mut stream = f
        .service
        .export_snapshot(&f.a, &snap_id(snapshot), ExportOptions { keep_setid })
        .await
        .expect("export");
    let mut out = Vec::new();
    while let Some(chunk) = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("in time")
    {
        out.extend_from_slice(&chunk.expect("export bytes"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_is_rolled_back_to_exactly_or_committed_away() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    f.sh(
        &f.a,
        &id,
        "cd /home/user && echo one > f && mkdir d && echo keep > d/k && chmod 600 f && ln -s f link",
    )
    .await;
    let cp = f.service.checkpoint(&f.a, &id).await.expect("checkpoint");
    assert_eq!(cp.kind, SnapshotKindBody::Checkpoint);
    assert_eq!(f.backend.stats().snapshots, 1);
    let running = f
        .service
        .exec(&f.a, &id, body(json!({"argv": ["sleep", "1000"]})))
        .await
        .expect("a process across the rollback");
    f.sh(
        &f.a,
        &id,
        "cd /home/user && echo two > f && rm -r d && chmod 644 f && echo new > g",
    )
    .await;
    let rolled = f
        .service
        .rollback(&f.a, &id, body(json!({})))
        .await
        .expect("rollback");
    assert_eq!(rolled.id, id, "the id stays");
    assert_eq!(
        f.sh(&f.a, &id, "cat /home/user/f /home/user/d/k").await,
        "one\nkeep\n"
    );
    assert_eq!(
        f.sh(&f.a, &id, "test -e /home/user/g || echo gone").await,
        "gone\n"
    );
    let stat = f
        .service
        .stat_file(&f.a, &id, "/home/user/f")
        .await
        .expect("stat");
    assert_eq!(stat.mode, 0o600);
    let link = f
        .service
        .stat_file(&f.a, &id, "/home/user/link")
        .await
        .expect("stat");
    assert_eq!(link.symlink_target.as_deref(), Some("f"));
    // Its processes did not survive: the stream of the one that ran says the sandbox ended under it.
    let out = collect(running).await;
    assert_eq!(
        out.error.map(|e| e.0),
        Some(ErrorCode::SandboxNotRunning),
        "{:?}",
        out.kinds
    );
    let processes = f.service.list_processes(&f.a, &id).await.expect("processes");
    assert!(processes.processes.iter().all(|p| !p.running), "{processes:?}");
    // The rollback consumed the checkpoint.
    assert_eq!(
        code(f.service.rollback(&f.a, &id, body(json!({}))).await),
        ErrorCode::SnapshotNotFound
    );
    let rollback = &f.rows("sandbox.rollback").await[0];
    assert_eq!(
        (
            rollback.detail["snapshot"].as_str(),
            rollback.detail["consumed"].as_bool()
        ),
        (Some(cp.id.as_str()), Some(true))
    );
    assert_eq!(f.rows("snapshot.consume").await.len(), 1);

    // Commit drops the newest checkpoint and keeps the step.
    f.service.checkpoint(&f.a, &id).await.expect("checkpoint");
    f.sh(&f.a, &id, "echo kept > /home/user/step").await;
    let committed = f.service.commit(&f.a, &id).await.expect("commit");
    assert_eq!(committed.kind, SnapshotKindBody::Checkpoint);
    assert_eq!(
        code(f.service.commit(&f.a, &id).await),
        ErrorCode::SnapshotNotFound
    );
    assert_eq!(f.sh(&f.a, &id, "cat /home/user/step").await, "kept\n");
    poll("the committed checkpoint's storage to go", || async {
        (f.backend.stats().snapshots == 0).then_some(())
    })
    .await;
    let lifecycle: Vec<String> = f
        .actions_but_exits(&id)
        .await
        .into_iter()
        .filter(|a| !a.starts_with("process."))
        .collect();
    assert_eq!(
        lifecycle,
        [
            "sandbox.create",
            "sandbox.checkpoint",
            "sandbox.rollback",
            "snapshot.consume",
            "sandbox.checkpoint",
            "sandbox.commit"
        ]
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diff_lists_what_changed_since_a_checkpoint() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    assert_eq!(
        code(f.service.diff_sandbox(&f.a, &id, body(json!({}))).await),
        ErrorCode::SnapshotNotFound,
        "no checkpoint yet"
    );
    f.sh(
        &f.a,
        &id,
        "cd /home/user && echo kept > step && echo x > f && ln -s f link",
    )
    .await;
    f.service.checkpoint(&f.a, &id).await.expect("checkpoint");
    f.sh(
        &f.a,
        &id,
        "cd /home/user && echo changed > step && rm link && echo fresh > added",
    )
    .await;
    let diff = f
        .service
        .diff_sandbox(&f.a, &id, body(json!({"text": true})))
        .await
        .expect("diff");
    let change = |path: &str| diff.entries.iter().find(|e| e.path == path).map(|e| e.change);
    assert_eq!(change("/home/user/step"), Some(ChangeBody::Modified));
    assert_eq!(change("/home/user/link"), Some(ChangeBody::Deleted));
    assert_eq!(change("/home/user/added"), Some(ChangeBody::Added));
    assert_eq!(change("/home/user/f"), None, "an unchanged file is not listed");
    let step = diff
        .entries
        .iter()
        .find(|e| e.path == "/home/user/step")
        .expect("step");
    let unified = step.unified.as_deref().expect("a text diff");
    assert!(
        unified.contains("-kept") && unified.contains("+changed"),
        "{unified}"
    );
    assert_eq!((diff.added, diff.modified, diff.deleted), (1, 1, 1));
    let rows = f.rows("sandbox.diff").await;
    assert_eq!(rows[0].detail["entries"], 3);
    // Against a named snapshot, and a paused sandbox can be diffed.
    let named = f
        .service
        .create_snapshot(&f.a, &id, body(json!({"name": "now"})))
        .await
        .expect("snapshot");
    f.service.pause_sandbox(&f.a, &id).await.expect("pause");
    let none = f
        .service
        .diff_sandbox(&f.a, &id, body(json!({"snapshot": named.id})))
        .await
        .expect("diff");
    assert!(none.entries.is_empty(), "{none:?}");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_snapshots_forks_and_sandboxes_made_from_snapshots_are_independent() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({"labels": {"origin": "parent"}})).await.id;
    f.sh(&f.a, &id, "echo one > /home/user/f").await;
    let snap = f
        .service
        .create_snapshot(&f.a, &id, body(json!({"name": "base", "labels": {"x": "1"}})))
        .await
        .expect("snapshot");
    let got = f
        .service
        .get_snapshot(&f.a, &snap_id(&snap.id))
        .await
        .expect("get");
    assert_eq!(got.name.as_deref(), Some("base"));
    assert!(got.referenced_bytes.is_some_and(|b| b > 0), "{got:?}");
    let forks = f
        .service
        .fork_sandbox(&f.a, &id, body(json!({"count": 3})))
        .await
        .expect("fork");
    assert_eq!(forks.sandboxes.len(), 3);
    for (i, copy) in forks.sandboxes.iter().enumerate() {
        assert_ne!(copy.id, id);
        assert_eq!(copy.labels["origin"], "parent", "a fork keeps the labels");
        assert_eq!(f.sh(&f.a, &sid(&copy.id), "cat /home/user/f").await, "one\n");
        f.sh(&f.a, &sid(&copy.id), &format!("echo {i} > /home/user/mine"))
            .await;
    }
    for (i, copy) in forks.sandboxes.iter().enumerate() {
        assert_eq!(
            f.sh(&f.a, &sid(&copy.id), "cat /home/user/mine").await,
            format!("{i}\n")
        );
    }
    assert_eq!(
        f.sh(&f.a, &id, "test -e /home/user/mine || echo absent").await,
        "absent\n"
    );
    f.sh(&f.a, &id, "echo parent > /home/user/parent-only").await;
    let from_snap = f.create(&f.a, json!({"snapshot": snap.id})).await.id;
    assert_eq!(
        f.sh(
            &f.a,
            &from_snap,
            "cat /home/user/f; test -e /home/user/parent-only || echo absent"
        )
        .await,
        "one\nabsent\n"
    );
    // A fork takes no snapshot of its own: the named one is the sandbox's only one.
    let mine = f
        .service
        .list_snapshots(
            &f.a,
            ListSnapshotsQuery {
                sandbox: Some(id.to_string()),
                ..ListSnapshotsQuery::default()
            },
        )
        .await
        .expect("list");
    assert_eq!(
        mine.snapshots.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [snap.id.as_str()]
    );
    f.service
        .delete_snapshot(&f.a, &snap_id(&snap.id))
        .await
        .expect("delete");
    assert_eq!(
        code(f.service.get_snapshot(&f.a, &snap_id(&snap.id)).await),
        ErrorCode::SnapshotNotFound
    );
    assert_eq!(
        code(f.service.delete_snapshot(&f.a, &snap_id(&snap.id)).await),
        ErrorCode::SnapshotNotFound
    );
    assert_eq!(f.sh(&f.a, &from_snap, "cat /home/user/f").await, "one\n");
    poll("every snapshot's storage to go", || async {
        (f.backend.stats().snapshots == 0).then_some(())
    })
    .await;
    let fork = f.rows("sandbox.fork").await;
    assert_eq!(
        (fork.len(), fork[0].sandbox_id.as_deref()),
        (1, Some(id.as_str()))
    );
    let creates = f.rows("sandbox.create").await;
    assert_eq!(
        creates.len(),
        5,
        "the parent, three copies and the one from the snapshot"
    );
    let deletes = f.rows("snapshot.delete").await;
    assert_eq!(deletes.len(), 1, "the named snapshot: {deletes:?}");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_round_trips_through_export_and_import() {
    let f = Fixture::with(|c| c.max_import_bytes = 64 << 10).await;
    let id = f.create(&f.a, json!({})).await.id;
    f.sh(
        &f.a,
        &id,
        "echo exported > /home/user/f; echo tool > /home/user/suid; chmod 4755 /home/user/suid",
    )
    .await;
    let snap = f
        .service
        .create_snapshot(&f.a, &id, body(json!({})))
        .await
        .expect("snapshot");
    let archive = export(&f, &snap.id, false).await;
    let import = f
        .service
        .import_snapshot(
            &f.a,
            Some("imported".into()),
            Default::default(),
            bytes_body(&archive),
        )
        .await
        .expect("import");
    assert_eq!(
        (import.sandbox_id.as_deref(), import.name.as_deref()),
        (None, Some("imported"))
    );
    let copy = f.create(&f.a, json!({"snapshot": import.id})).await.id;
    assert_eq!(f.sh(&f.a, &copy, "cat /home/user/f").await, "exported\n");
    let suid = f
        .service
        .stat_file(&f.a, &copy, "/home/user/suid")
        .await
        .expect("stat");
    assert_eq!(suid.mode, 0o755, "the setuid bit was cleared on export");
    let exported = &f.rows("snapshot.export").await[0];
    assert_eq!(exported.detail["bytes_out"], archive.len() as u64);
    assert_eq!(exported.detail["setid_cleared"], 1);
    assert_eq!(exported.sandbox_id.as_deref(), Some(id.as_str()));
    let kept = export(&f, &snap.id, true).await;
    assert!(!kept.is_empty());

    // Hostile and oversized archives are refused, recorded, and leave nothing.
    let before = f.backend.stats().snapshots;
    let mut hostile = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(1);
    h.set_mode(0o644);
    h.as_old_mut().name[..9].copy_from_slice(b"../escape");
    h.set_cksum();
    hostile.append(&h, &b"x"[..]).expect("member");
    let hostile = hostile.into_inner().expect("archive");
    let e = error(
        f.service
            .import_snapshot(&f.a, None, Default::default(), bytes_body(&hostile))
            .await,
    );
    assert_eq!(e.code, ErrorCode::InvalidArchive, "{e:?}");
    let big = vec![0u8; 128 << 10];
    let e = error(
        f.service
            .import_snapshot(&f.a, None, Default::default(), bytes_body(&big))
            .await,
    );
    assert_eq!(e.code, ErrorCode::PayloadTooLarge, "{e:?}");
    f.backend
        .fail_next("import_snapshot", no_space("create the staging subvolume"));
    let e = error(
        f.service
            .import_snapshot(&f.a, None, Default::default(), bytes_body(&archive))
            .await,
    );
    assert_eq!(e.code, ErrorCode::NoSpace, "{e:?}");
    assert_eq!(f.backend.stats().snapshots, before);
    let outcomes: Vec<String> = f
        .rows("snapshot.import")
        .await
        .into_iter()
        .map(|r| r.outcome)
        .collect();
    assert_eq!(
        outcomes,
        ["ok", "invalid_archive", "payload_too_large", "no_space"]
    );
    assert_eq!(
        code(
            f.service
                .export_snapshot(&f.b, &snap_id(&snap.id), ExportOptions::default())
                .await
        ),
        ErrorCode::SnapshotNotFound
    );
    f.finish().await;
}

/// The copies of a fork are recorded together, then booted together: one that cannot boot fails the
/// whole fork, and no copy is left running, recorded as running, or held by the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_whose_copy_cannot_boot_leaves_no_copy() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    f.backend
        .fail_next("create_sandbox", no_space("snapshot a volume into"));
    assert_eq!(
        code(f.service.fork_sandbox(&f.a, &id, body(json!({"count": 4}))).await),
        ErrorCode::NoSpace
    );
    assert_eq!(f.backend.sandbox_ids(), [sid(&id)], "copies left on the backend");
    let listed = f
        .service
        .list_sandboxes(&f.a, body(json!({"state": "all"})))
        .await
        .expect("list");
    let others: Vec<_> = listed
        .sandboxes
        .iter()
        .filter(|s| s.id != id)
        .map(|s| (s.id.clone(), s.state))
        .collect();
    assert_eq!(others.len(), 4, "every copy was recorded: {others:?}");
    assert!(
        others.iter().all(|(_, state)| !matches!(
            state,
            paddock_types::api::SandboxStateBody::Running | paddock_types::api::SandboxStateBody::Creating
        )),
        "a copy of a failed fork is still live: {others:?}"
    );
    let snapshots = f
        .service
        .list_snapshots(&f.a, ListSnapshotsQuery::default())
        .await
        .expect("list");
    assert!(snapshots.snapshots.is_empty(), "a fork left a snapshot");
    // The source is thawed and unharmed, and forks again.
    f.sh(&f.a, &id, "true").await;
    let forks = f
        .service
        .fork_sandbox(&f.a, &id, body(json!({"count": 2})))
        .await
        .expect("fork");
    assert_eq!(forks.sandboxes.len(), 2);
    f.finish().await;
}

/// A fork freezes its sandbox for as long as its copies are made from it, and no longer; a paused
/// sandbox is not forked, and one that cannot be frozen is not either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_thaws_its_sandbox_after() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let sb = sid(&id);
    f.sh(&f.a, &id, "echo one > /home/user/f").await;
    f.service
        .fork_sandbox(&f.a, &sb, body(json!({"count": 2})))
        .await
        .expect("fork");
    assert_eq!(
        f.backend.is_paused(&sb),
        Some(false),
        "a fork left its sandbox frozen"
    );
    f.sh(&f.a, &id, "true").await;

    // A paused sandbox is not forked (its agent cannot answer), and stays paused.
    f.service.pause_sandbox(&f.a, &sb).await.expect("pause");
    assert_eq!(
        code(f.service.fork_sandbox(&f.a, &sb, body(json!({"count": 1}))).await),
        ErrorCode::SandboxNotRunning
    );
    assert_eq!(f.backend.is_paused(&sb), Some(true));
    f.service.resume_sandbox(&f.a, &sb).await.expect("resume");

    f.backend.fail_next(
        "freeze_sandbox",
        RuntimeError::Setup("the freezer did not answer".into()),
    );
    assert!(f
        .service
        .fork_sandbox(&f.a, &sb, body(json!({"count": 3})))
        .await
        .is_err());
    assert_eq!(
        f.backend.sandbox_ids().len(),
        3,
        "the sandbox and two earlier copies"
    );
    assert_eq!(f.rows("sandbox.fork").await.len(), 1);
    assert_eq!(f.backend.is_paused(&sb), Some(false));
    f.sh(&f.a, &id, "true").await;
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_answers_no_space_and_records_nothing() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    f.backend.fail_next("snapshot_sandbox", no_space("snapshot"));
    assert_eq!(code(f.service.checkpoint(&f.a, &id).await), ErrorCode::NoSpace);
    // A fork's copy is snapshotted from the sandbox in its create.
    f.backend
        .fail_next("create_sandbox", no_space("snapshot a volume into"));
    assert_eq!(
        code(f.service.fork_sandbox(&f.a, &id, body(json!({"count": 1}))).await),
        ErrorCode::NoSpace
    );
    assert!(f.rows("sandbox.fork").await.is_empty());
    let listed = f
        .service
        .list_snapshots(&f.a, ListSnapshotsQuery::default())
        .await
        .expect("list");
    assert!(listed.snapshots.is_empty());
    assert!(f.rows("sandbox.checkpoint").await.is_empty());
    // The sandbox is unharmed.
    f.sh(&f.a, &id, "true").await;
    f.finish().await;
}
