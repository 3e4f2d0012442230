//! filesystem.Filesystem: Stat (files, directories, symlinks), ListDir with depth, MakeDir, Move,
//! Remove, the WatchDir stream and the bounded polling watchers.

use axum::http::StatusCode;
use bytes::Bytes;
use paddock_control::WriteFileOptions;
use paddock_types::SandboxId;
use serde_json::{json, Value};

use crate::support::{end_error, start_body, Env};

const FS: &str = "/filesystem.Filesystem";

async fn write(env: &Env, id: &SandboxId, path: &str, data: &'static [u8]) {
    let body: paddock_control::ByteStream =
        Box::pin(futures_util::stream::once(
            async move { Ok(Bytes::from_static(data)) },
        ));
    let options = WriteFileOptions {
        mode: Some(0o644),
        user: Some("user".into()),
        parents: false,
        approval_id: None,
    };
    env.service
        .write_file(&env.a, id, path, options, body)
        .await
        .expect("written");
}

async fn call(env: &Env, id: &SandboxId, method: &str, body: Value) -> (StatusCode, Value) {
    env.unary(id, &format!("{FS}/{method}"), body, &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stat_reports_envds_entry_info() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    write(&env, &id, "/home/user/test.txt", b"test").await;
    let (status, body) = call(&env, &id, "Stat", json!({"path": "test.txt"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let entry = &body["entry"];
    assert_eq!(entry["name"], "test.txt");
    assert_eq!(entry["type"], "FILE_TYPE_FILE");
    assert_eq!(entry["path"], "/home/user/test.txt");
    assert_eq!(entry["size"], "4", "int64 as a string");
    assert_eq!(entry["mode"], 0o644);
    assert_eq!(entry["permissions"], "-rw-r--r--");
    assert_eq!(entry["owner"], "user");
    assert_eq!(entry["group"], "user");
    assert!(
        entry["modifiedTime"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{entry}"
    );
    assert!(entry.get("isSymlink").is_none());

    let (status, _) = call(&env, &id, "MakeDir", json!({"path": "test_dir"})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call(&env, &id, "Stat", json!({"path": "test_dir"})).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["entry"]["mode"], 0o755);
    assert_eq!(body["entry"]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(body["entry"]["permissions"], "drwxr-xr-x");
    assert!(
        body["entry"].get("size").is_none(),
        "a directory's size is 0: {body}"
    );

    let (status, body) = call(&env, &id, "Stat", json!({"path": "missing.txt"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (status, body) = call(&env, &id, "Stat", json!({"path": "~nobody/x"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_argument"))
    );

    // The calling user picks the home; an unknown user is refused.
    let (_, body) = env
        .unary(
            &id,
            &format!("{FS}/Stat"),
            json!({"path": "~"}),
            &[("authorization", "Basic cm9vdDo=")],
        )
        .await;
    assert_eq!(body["entry"]["path"], "/root");
    let (status, body) = env
        .unary(
            &id,
            &format!("{FS}/Stat"),
            json!({"path": "~"}),
            &[("authorization", "Basic Z2hvc3Q6")],
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthenticated"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinks_report_their_target() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    write(&env, &id, "/home/user/target.txt", b"x").await;
    let frames = env
        .stream(
            &id,
            "/process.Process/Start",
            start_body("ln -s target.txt link; ln -s /nowhere dangling"),
            &[],
        )
        .await
        .all()
        .await;
    assert!(end_error(&frames).is_none(), "{frames:?}");
    let (status, body) = call(&env, &id, "Stat", json!({"path": "link"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["entry"]["type"], "FILE_TYPE_FILE", "the target's type");
    assert_eq!(body["entry"]["symlinkTarget"], "/home/user/target.txt");
    assert_eq!(body["entry"]["isSymlink"], true);
    assert_eq!(body["entry"]["path"], "/home/user/link");
    let (_, body) = call(&env, &id, "Stat", json!({"path": "dangling"})).await;
    assert_eq!(body["entry"]["type"], "FILE_TYPE_SYMLINK");
    assert_eq!(body["entry"]["symlinkTarget"], "/nowhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_dir_walks_depth_first_in_lexical_order() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    for dir in ["t/b/deep", "t/a"] {
        let (status, _) = call(&env, &id, "MakeDir", json!({"path": dir})).await;
        assert_eq!(status, StatusCode::OK);
    }
    write(&env, &id, "/home/user/t/c.txt", b"c").await;
    write(&env, &id, "/home/user/t/b/f.txt", b"f").await;
    let paths = |body: &Value| -> Vec<String> {
        body["entries"]
            .as_array()
            .expect("entries")
            .iter()
            .map(|e| e["path"].as_str().expect("path").to_owned())
            .collect()
    };
    let (status, body) = call(&env, &id, "ListDir", json!({"path": "t"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        paths(&body),
        ["/home/user/t/a", "/home/user/t/b", "/home/user/t/c.txt"]
    );
    let (_, body) = call(&env, &id, "ListDir", json!({"path": "/home/user/t/", "depth": 2})).await;
    assert_eq!(
        paths(&body),
        [
            "/home/user/t/a",
            "/home/user/t/b",
            "/home/user/t/b/deep",
            "/home/user/t/b/f.txt",
            "/home/user/t/c.txt"
        ]
    );
    let (_, body) = call(&env, &id, "ListDir", json!({"path": "t", "depth": 9})).await;
    assert_eq!(paths(&body).len(), 5);
    let (status, body) = call(&env, &id, "ListDir", json!({"path": "t/c.txt"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_argument"))
    );
    let (status, body) = call(&env, &id, "ListDir", json!({"path": "nope"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn make_dir_move_and_remove() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let (status, body) = call(&env, &id, "MakeDir", json!({"path": "x/y/z"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["entry"]["path"], "/home/user/x/y/z");
    assert_eq!(body["entry"]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(body["entry"]["owner"], "user");
    let (status, body) = call(&env, &id, "MakeDir", json!({"path": "x/y/z"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_exists"))
    );
    write(&env, &id, "/home/user/file", b"data").await;
    let (status, body) = call(&env, &id, "MakeDir", json!({"path": "file"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_argument"))
    );

    // Move creates the destination's parents and answers the destination's entry.
    let (status, body) = call(
        &env,
        &id,
        "Move",
        json!({"source": "file", "destination": "new/dir/moved"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["entry"]["path"], "/home/user/new/dir/moved");
    assert_eq!(body["entry"]["size"], "4");
    let (status, _) = call(&env, &id, "Stat", json!({"path": "file"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = call(&env, &id, "Move", json!({"source": "gone", "destination": "b"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );

    // Remove is rm -rf: a tree goes, a missing path is fine.
    let (status, body) = call(&env, &id, "Remove", json!({"path": "x"})).await;
    assert_eq!((status, body), (StatusCode::OK, json!({})));
    let (status, _) = call(&env, &id, "Stat", json!({"path": "x"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(&env, &id, "Remove", json!({"path": "x"})).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_dir_streams_events_relative_to_the_directory() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let (status, _) = call(&env, &id, "MakeDir", json!({"path": "w/sub"})).await;
    assert_eq!(status, StatusCode::OK);
    let body = json!({"path": "w", "recursive": true, "includeEntry": true});
    let mut stream = env.stream(&id, &format!("{FS}/WatchDir"), body, &[]).await;
    let first = stream.next().await.expect("the start message");
    assert_eq!(first.json, json!({"start": {}}));
    write(&env, &id, "/home/user/w/sub/f.txt", b"hello").await;
    let event = stream.until("filesystem").await;
    let fs_event = &event.json["filesystem"];
    assert_eq!(fs_event["name"], "sub/f.txt", "{fs_event}");
    assert!(fs_event["type"]
        .as_str()
        .is_some_and(|t| t.starts_with("EVENT_TYPE_")));
    assert_eq!(fs_event["entry"]["path"], "/home/user/w/sub/f.txt");

    // Not a directory, or missing: refused in the stream's end message.
    for (path, code) in [("w/sub/f.txt", "invalid_argument"), ("nope", "not_found")] {
        let frames = env
            .stream(&id, &format!("{FS}/WatchDir"), json!({"path": path}), &[])
            .await
            .all()
            .await;
        assert_eq!(end_error(&frames).map(|e| e.0).as_deref(), Some(code), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_watchers_buffer_events_and_are_bounded() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let (status, body) = call(
        &env,
        &id,
        "CreateWatcher",
        json!({"path": "/home/user", "recursive": false}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let watcher = body["watcherId"].as_str().expect("an id").to_owned();
    write(&env, &id, "/home/user/polled.txt", b"x").await;
    // The events arrive through the watcher's task: poll until they are there.
    let deadline = tokio::time::Instant::now() + crate::support::DEADLINE;
    let events = loop {
        let (status, body) = call(&env, &id, "GetWatcherEvents", json!({"watcherId": watcher})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        if let Some(events) = body["events"].as_array().filter(|e| !e.is_empty()) {
            break events.clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no events in time");
        tokio::task::yield_now().await;
    };
    assert!(events.iter().all(|e| e["name"] == "polled.txt"), "{events:?}");
    // Another sandbox does not see this watcher.
    let other = env.sandbox(&env.a).await;
    let (status, _) = call(&env, &other, "GetWatcherEvents", json!({"watcherId": watcher})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = call(&env, &id, "RemoveWatcher", json!({"watcherId": watcher})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = call(&env, &id, "GetWatcherEvents", json!({"watcherId": watcher})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );

    // At most 8 per sandbox.
    for _ in 0..8 {
        let (status, body) = call(&env, &id, "CreateWatcher", json!({"path": "/tmp"})).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (status, body) = call(&env, &id, "CreateWatcher", json!({"path": "/tmp"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("resource_exhausted"))
    );
    let (status, body) = call(&env, &id, "CreateWatcher", json!({"path": "/nope"})).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    let (status, body) = call(&env, &other, "CreateWatcher", json!({"path": "/nope"})).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
}
