//! `file_stat`, `file_mkdir`, `file_move`, `file_remove` and `file_read`'s line ranges: each
//! tool's structured result, refusals as `isError` with the service's code, and another tenant's
//! calls answering as for a missing sandbox.

use bytes::Bytes;
use paddock_control::{Principal, SandboxService, WriteFileOptions};
use paddock_mcp::MAX_FILE_READ;
use paddock_types::SandboxId;
use serde_json::{json, Value};

use crate::support::{call, connect, failed, service, structured};

/// Puts `bytes` (any bytes: the tools write text only) at `path` through the service.
async fn plant(service: &SandboxService, p: &Principal, id: &str, path: &str, bytes: Vec<u8>) {
    let id: SandboxId = id.parse().expect("an id");
    let body = Bytes::from(bytes);
    let stream = futures_util::stream::once(async move { Ok::<_, std::io::Error>(body) });
    service
        .write_file(p, &id, path, WriteFileOptions::default(), Box::pin(stream))
        .await
        .expect("planted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_are_stated_made_moved_and_removed() {
    let (service, a, b) = service().await;
    let client = connect(&service, a).await;
    let tools = client.list_all_tools().await.expect("tools");
    let hints = |name: &str| {
        let t = tools.iter().find(|t| t.name == name).expect("tool");
        let a = t.annotations.clone().expect("annotations");
        (a.read_only_hint, a.destructive_hint)
    };
    assert_eq!(hints("file_stat").0, Some(true));
    assert_eq!(hints("file_mkdir"), (Some(false), Some(false)));
    assert_eq!(hints("file_remove"), (Some(false), Some(true)));
    assert_eq!(hints("file_move"), (Some(false), Some(true)));

    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    let path = |path: &str| json!({"sandbox_id": id, "path": path});

    // A directory with its parents; again, it is there; without parents, it exists already.
    let made = structured(&call(&client, "file_mkdir", path("/home/user/d/e")).await);
    assert_eq!(
        (
            made["path"].as_str(),
            made["kind"].as_str(),
            made["mode"].as_str()
        ),
        (Some("/home/user/d/e"), Some("dir"), Some("0755")),
        "{made}"
    );
    structured(&call(&client, "file_mkdir", path("/home/user/d/e")).await);
    let exists = failed(
        &call(
            &client,
            "file_mkdir",
            json!({"sandbox_id": id, "path": "/home/user/d/e", "parents": false}),
        )
        .await,
    );
    assert!(exists.starts_with("already_exists:"), "{exists}");

    // A file's metadata, then moved: there, and no longer where it was.
    structured(
        &call(
            &client,
            "file_write",
            json!({"sandbox_id": id, "path": "/home/user/d/e/a.txt", "content": "one\n"}),
        )
        .await,
    );
    let stat = structured(&call(&client, "file_stat", path("/home/user/d/e/a.txt")).await);
    assert_eq!(
        (
            stat["path"].as_str(),
            stat["kind"].as_str(),
            stat["size"].as_u64(),
            stat["mode"].as_str(),
            stat["symlink_target"].is_null()
        ),
        (
            Some("/home/user/d/e/a.txt"),
            Some("file"),
            Some(4),
            Some("0644"),
            true
        ),
        "{stat}"
    );
    assert!(stat["modified_at"].is_string(), "{stat}");
    let moved = structured(
        &call(
            &client,
            "file_move",
            json!({"sandbox_id": id, "from": "/home/user/d/e/a.txt", "to": "/home/user/d/b.txt"}),
        )
        .await,
    );
    assert_eq!(
        (
            moved["path"].as_str(),
            moved["kind"].as_str(),
            moved["size"].as_u64()
        ),
        (Some("/home/user/d/b.txt"), Some("file"), Some(4)),
        "{moved}"
    );
    let gone = failed(&call(&client, "file_stat", path("/home/user/d/e/a.txt")).await);
    assert!(gone.starts_with("file_not_found:"), "{gone}");
    let read = structured(&call(&client, "file_read", path("/home/user/d/b.txt")).await);
    assert_eq!(read["content"], "one\n", "{read}");
    let nowhere = failed(
        &call(
            &client,
            "file_move",
            json!({"sandbox_id": id, "from": "/home/user/nope", "to": "/home/user/x"}),
        )
        .await,
    );
    assert!(nowhere.starts_with("file_not_found:"), "{nowhere}");

    // Removing: a full directory only with recursive; the root never; relative paths never.
    let full = failed(&call(&client, "file_remove", path("/home/user/d")).await);
    assert!(full.starts_with("directory_not_empty:"), "{full}");
    let removed = structured(
        &call(
            &client,
            "file_remove",
            json!({"sandbox_id": id, "path": "/home/user/d", "recursive": true}),
        )
        .await,
    );
    assert_eq!(removed, json!({"path": "/home/user/d"}));
    let gone = failed(&call(&client, "file_stat", path("/home/user/d/b.txt")).await);
    assert!(gone.starts_with("file_not_found:"), "{gone}");
    let root = failed(
        &call(
            &client,
            "file_remove",
            json!({"sandbox_id": id, "path": "/", "recursive": true}),
        )
        .await,
    );
    assert!(root.starts_with("invalid_path:"), "{root}");
    let relative = failed(&call(&client, "file_stat", path("home/user")).await);
    assert!(relative.starts_with("invalid_path:"), "{relative}");
    let unknown = failed(
        &call(
            &client,
            "file_remove",
            json!({"sandbox_id": id, "path": "/home/user", "force": true}),
        )
        .await,
    );
    assert!(unknown.contains("force"), "{unknown}");

    // Another tenant: no such sandbox, whatever the tool; nothing of it was touched.
    let other = connect(&service, b).await;
    let calls = [
        ("file_stat", path("/home/user")),
        ("file_mkdir", path("/home/user/theirs")),
        ("file_remove", path("/home/user")),
        (
            "file_move",
            json!({"sandbox_id": id, "from": "/home/user", "to": "/tmp/user"}),
        ),
        (
            "file_read",
            json!({"sandbox_id": id, "path": "/etc/hostname", "start_line": 1}),
        ),
    ];
    for (tool, args) in calls {
        let refused = failed(&call(&other, tool, args).await);
        assert!(refused.starts_with("sandbox_not_found:"), "{tool}: {refused}");
    }
    let home = structured(&call(&client, "file_stat", path("/home/user")).await);
    assert_eq!(home["kind"], "dir", "{home}");
    let theirs = failed(&call(&client, "file_stat", path("/home/user/theirs")).await);
    assert!(theirs.starts_with("file_not_found:"), "{theirs}");

    client.cancel().await.expect("closed");
    other.cancel().await.expect("closed");
    service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_read_returns_line_ranges_of_text_and_refuses_them_for_binary() {
    let (service, a, _) = service().await;
    let client = connect(&service, a.clone()).await;
    let created = structured(&call(&client, "sandbox_create", json!({})).await);
    let id = created["sandbox_id"].as_str().expect("an id").to_owned();
    structured(
        &call(
            &client,
            "file_write",
            json!({"sandbox_id": id, "path": "/home/user/log.txt", "content": "one\ntwo\nthree\nfour"}),
        )
        .await,
    );
    let lines = |range: Value| {
        let mut args = json!({"sandbox_id": id, "path": "/home/user/log.txt"});
        for (k, v) in range.as_object().expect("an object") {
            args[k] = v.clone();
        }
        let client = &client;
        async move { call(client, "file_read", args).await }
    };
    let fields = |r: &Value| {
        (
            r["content"].as_str().map(str::to_owned),
            r["start_line"].as_u64(),
            r["end_line"].as_u64(),
            r["total_lines"].as_u64(),
            r["truncated"].as_bool(),
        )
    };
    let text = |s: &str| Some(s.to_owned());

    // Whole: its line count; a range: those lines, whole, and the count; past the end: none.
    let whole = structured(&lines(json!({})).await);
    assert_eq!(
        fields(&whole),
        (text("one\ntwo\nthree\nfour"), None, None, Some(4), Some(false))
    );
    let middle = structured(&lines(json!({"start_line": 2, "end_line": 3})).await);
    assert_eq!(
        fields(&middle),
        (text("two\nthree\n"), Some(2), Some(3), Some(4), Some(false))
    );
    let tail = structured(&lines(json!({"start_line": 4})).await);
    assert_eq!(
        fields(&tail),
        (text("four"), Some(4), Some(4), Some(4), Some(false))
    );
    let head = structured(&lines(json!({"end_line": 1})).await);
    assert_eq!(
        fields(&head),
        (text("one\n"), Some(1), Some(1), Some(4), Some(false))
    );
    let past = structured(&lines(json!({"start_line": 9, "end_line": 20})).await);
    assert_eq!(fields(&past), (text(""), Some(9), Some(8), Some(4), Some(false)));
    for bad in [json!({"start_line": 0}), json!({"start_line": 3, "end_line": 2})] {
        let refused = failed(&lines(bad.clone()).await);
        assert!(refused.starts_with("invalid_request:"), "{bad}: {refused}");
    }
    let missing = failed(
        &call(
            &client,
            "file_read",
            json!({"sandbox_id": id, "path": "/home/user/nope", "start_line": 1}),
        )
        .await,
    );
    assert!(missing.starts_with("file_not_found:"), "{missing}");

    // Binary: whole as base64; lines of it are refused.
    plant(&service, &a, &id, "/home/user/bin", vec![0xff, 0xfe, b'\n', 0]).await;
    let raw = structured(
        &call(
            &client,
            "file_read",
            json!({"sandbox_id": id, "path": "/home/user/bin"}),
        )
        .await,
    );
    assert_eq!(
        (
            raw["content"].as_str(),
            raw["encoding"].as_str(),
            raw["total_lines"].is_null()
        ),
        (Some("//4KAA=="), Some("base64"), true),
        "{raw}"
    );
    let refused = failed(
        &call(
            &client,
            "file_read",
            json!({"sandbox_id": id, "path": "/home/user/bin", "start_line": 1, "end_line": 1}),
        )
        .await,
    );
    assert!(
        refused.starts_with("invalid_request:") && refused.contains("not UTF-8"),
        "{refused}"
    );

    // Text longer than what is returned stays text, cut between characters (or lines).
    let long = format!("a{}\nlast\n", "é".repeat(MAX_FILE_READ / 2));
    plant(
        &service,
        &a,
        &id,
        "/home/user/long.txt",
        long.clone().into_bytes(),
    )
    .await;
    let read = |range: Value| {
        let mut args = json!({"sandbox_id": id, "path": "/home/user/long.txt"});
        for (k, v) in range.as_object().expect("an object") {
            args[k] = v.clone();
        }
        let client = &client;
        async move { structured(&call(client, "file_read", args).await) }
    };
    let cut = read(json!({})).await;
    let content = cut["content"].as_str().unwrap_or_default();
    assert_eq!(
        (
            cut["encoding"].as_str(),
            cut["truncated"].as_bool(),
            cut["total_lines"].is_null(),
            content.len()
        ),
        (Some("utf-8"), Some(true), true, MAX_FILE_READ - 1),
        "a cut long text"
    );
    assert!(long.starts_with(content));
    let first = read(json!({"start_line": 1, "end_line": 2})).await;
    assert_eq!(
        (
            first["content"].as_str().map(str::len),
            first["end_line"].as_u64(),
            first["truncated"].as_bool()
        ),
        (Some(MAX_FILE_READ - 1), Some(1), Some(true)),
        "a line longer than the cap"
    );
    let last = read(json!({"start_line": 2})).await;
    assert_eq!(
        fields(&last),
        (text("last\n"), Some(2), Some(2), Some(2), Some(false))
    );

    client.cancel().await.expect("closed");
    service.shutdown().await;
}
