//! `snapshot_create`, `snapshot_list`, `snapshot_delete`, `commit` and `sandbox_fork`: a named snapshot kept through
//! a rollback to it, a step committed (its checkpoint dropped, its changes kept), copies that start
//! from the source's files, and another tenant's calls answered as for a missing sandbox.

use serde_json::{json, Value};

use crate::support::{call, connect, failed, service, structured};

/// The content of `path` in sandbox `id`.
async fn content(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    id: &str,
    path: &str,
) -> Value {
    let read = structured(&call(client, "file_read", json!({"sandbox_id": id, "path": path})).await);
    read["content"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_commits_and_forks_keep_and_copy_a_sandboxs_files() {
    let (service, a, b) = service().await;
    let client = connect(&service, a).await;
    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    let write = |text: &str| json!({"sandbox_id": id, "path": "/home/user/v.txt", "content": text});
    structured(&call(&client, "file_write", write("one")).await);

    // A named snapshot.
    let snap = structured(
        &call(
            &client,
            "snapshot_create",
            json!({"sandbox_id": id, "name": "v1"}),
        )
        .await,
    );
    let snap_id = snap["snapshot_id"].as_str().expect("a snapshot id").to_owned();
    assert_eq!(
        (&snap["sandbox_id"], &snap["kind"], &snap["name"]),
        (&json!(id), &json!("snapshot"), &json!("v1")),
        "{snap}"
    );
    assert!(snap["created_at"].is_string(), "{snap}");

    // A step committed: the checkpoint goes, the change stays; without one, commit fails.
    let none = failed(&call(&client, "commit", json!({"sandbox_id": id})).await);
    assert!(none.starts_with("snapshot_not_found:"), "{none}");
    let saved = structured(&call(&client, "checkpoint", json!({"sandbox_id": id})).await);
    structured(&call(&client, "file_write", write("two")).await);
    let committed = structured(&call(&client, "commit", json!({"sandbox_id": id})).await);
    assert_eq!(
        committed,
        json!({"sandbox_id": id, "checkpoint_id": saved["checkpoint_id"]}),
        "{committed}"
    );
    assert_eq!(content(&client, &id, "/home/user/v.txt").await, "two");
    let again = failed(&call(&client, "commit", json!({"sandbox_id": id})).await);
    assert!(again.starts_with("snapshot_not_found:"), "{again}");
    let listed = structured(&call(&client, "snapshot_list", json!({"sandbox_id": id})).await);
    assert_eq!(listed["truncated"], false, "{listed}");
    let ids: Vec<&Value> = listed["snapshots"]
        .as_array()
        .expect("snapshots")
        .iter()
        .map(|s| &s["snapshot_id"])
        .collect();
    assert_eq!(ids, [&json!(snap_id)], "only the snapshot is left: {listed}");
    let malformed = failed(&call(&client, "snapshot_list", json!({"sandbox_id": "not an id"})).await);
    assert!(malformed.starts_with("invalid_request:"), "{malformed}");

    // Rolling back to the named snapshot restores its files and keeps it.
    structured(
        &call(
            &client,
            "rollback",
            json!({"sandbox_id": id, "checkpoint_id": snap_id}),
        )
        .await,
    );
    assert_eq!(content(&client, &id, "/home/user/v.txt").await, "one");
    let listed = structured(&call(&client, "snapshot_list", json!({})).await);
    assert_eq!(
        listed["snapshots"][0]["snapshot_id"],
        snap_id.as_str(),
        "{listed}"
    );

    // Forks: new sandboxes with the source's files, each its own.
    structured(&call(&client, "file_write", write("three")).await);
    let forked = structured(&call(&client, "sandbox_fork", json!({"sandbox_id": id, "count": 2})).await);
    let copies: Vec<String> = forked["sandboxes"]
        .as_array()
        .expect("sandboxes")
        .iter()
        .map(|s| {
            assert_eq!(s["state"], "running", "{forked}");
            assert!(s["expires_at"].is_string(), "{forked}");
            s["sandbox_id"].as_str().expect("an id").to_owned()
        })
        .collect();
    assert_eq!(copies.len(), 2, "{forked}");
    assert!(copies[0] != copies[1] && !copies.contains(&id), "{forked}");
    structured(
        &call(
            &client,
            "file_write",
            json!({"sandbox_id": copies[0], "path": "/home/user/v.txt", "content": "mine"}),
        )
        .await,
    );
    assert_eq!(content(&client, &copies[1], "/home/user/v.txt").await, "three");
    assert_eq!(content(&client, &id, "/home/user/v.txt").await, "three");
    let zero = failed(&call(&client, "sandbox_fork", json!({"sandbox_id": id, "count": 0})).await);
    assert!(zero.starts_with("invalid_request:"), "{zero}");

    // Another tenant: nothing of it is there.
    let other = connect(&service, b).await;
    for (tool, args) in [
        ("snapshot_create", json!({"sandbox_id": id})),
        ("commit", json!({"sandbox_id": id})),
        ("sandbox_fork", json!({"sandbox_id": id})),
    ] {
        let refused = failed(&call(&other, tool, args).await);
        assert!(refused.starts_with("sandbox_not_found:"), "{tool}: {refused}");
    }
    let theirs = structured(&call(&other, "snapshot_list", json!({})).await);
    assert_eq!(theirs["snapshots"], json!([]), "{theirs}");
    let theirs = structured(&call(&other, "snapshot_list", json!({"sandbox_id": id})).await);
    assert_eq!(theirs["snapshots"], json!([]), "{theirs}");

    // Deleting a snapshot: not another tenant's; then gone, and a rollback to it fails.
    let refused = failed(&call(&other, "snapshot_delete", json!({"snapshot_id": snap_id})).await);
    assert!(refused.starts_with("snapshot_not_found:"), "{refused}");
    let malformed = failed(&call(&client, "snapshot_delete", json!({"snapshot_id": "../x"})).await);
    assert!(malformed.starts_with("invalid_request:"), "{malformed}");
    let deleted = structured(&call(&client, "snapshot_delete", json!({"snapshot_id": snap_id})).await);
    assert_eq!(deleted, json!({"snapshot_id": snap_id}));
    let listed = structured(&call(&client, "snapshot_list", json!({})).await);
    assert_eq!(listed["snapshots"], json!([]), "{listed}");
    let gone = failed(
        &call(
            &client,
            "rollback",
            json!({"sandbox_id": id, "checkpoint_id": snap_id}),
        )
        .await,
    );
    assert!(gone.starts_with("snapshot_not_found:"), "{gone}");

    for sandbox in copies.iter().chain([&id]) {
        structured(&call(&client, "sandbox_kill", json!({"sandbox_id": sandbox})).await);
    }
    client.cancel().await.expect("closed");
    other.cancel().await.expect("closed");
    service.shutdown().await;
}
