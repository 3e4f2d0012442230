//! Files: read, write, list, stat, mkdir, remove, rename, tar download and upload, watches; their
//! error codes and the `file.*` rows.

use futures_util::StreamExt;
use paddock_control::{ByteStream, WriteFileOptions};
use paddock_types::api::{ErrorCode, FileKindBody, WatchEventKind};
use serde_json::json;

use crate::fixture::{body, bytes_body, code, error, Fixture, DEADLINE};

async fn bytes_of(mut stream: ByteStream) -> Result<Vec<u8>, std::io::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = tokio::time::timeout(DEADLINE, stream.next())
        .await
        .expect("in time")
    {
        out.extend_from_slice(&chunk?);
    }
    Ok(out)
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, *data).expect("tar member");
    }
    b.into_inner().expect("tar")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_operations_record_their_rows_and_answer_the_agents_errors() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let s = &f.service;
    let written = s
        .write_file(
            &f.a,
            &id,
            "/home/user/a.txt",
            WriteFileOptions::default(),
            bytes_body(b"abcdef"),
        )
        .await
        .expect("write");
    assert_eq!(written.bytes, 6);
    let download = s.read_file(&f.a, &id, "/home/user/a.txt").await.expect("read");
    assert_eq!(download.size, Some(6));
    assert_eq!(bytes_of(download.stream).await.expect("bytes"), b"abcdef");
    let listed = s.list_dir(&f.a, &id, "/home/user").await.expect("list");
    assert_eq!(listed.entries.len(), 1);
    assert_eq!(
        (listed.entries[0].path.as_str(), listed.entries[0].size),
        ("/home/user/a.txt", 6)
    );
    let stat = s.stat_file(&f.a, &id, "/home/user/a.txt").await.expect("stat");
    assert_eq!(
        (stat.kind, stat.mode, stat.uid),
        (FileKindBody::File, 0o644, 1000)
    );
    let dir = s
        .make_dir(
            &f.a,
            &id,
            body(json!({"path": "/home/user/d/e", "parents": true})),
        )
        .await
        .expect("mkdir");
    assert_eq!(dir.kind, FileKindBody::Dir);
    let moved = s
        .rename_file(
            &f.a,
            &id,
            body(json!({"from": "/home/user/a.txt", "to": "/home/user/d/a.txt"})),
        )
        .await
        .expect("rename");
    assert_eq!(moved.path, "/home/user/d/a.txt");
    s.remove_file(&f.a, &id, "/home/user/d/a.txt", false, None)
        .await
        .expect("remove");
    let private = WriteFileOptions {
        mode: Some(0o600),
        user: Some("root".into()),
        parents: false,
        approval_id: None,
    };
    s.write_file(&f.a, &id, "/tmp/p", private, bytes_body(b"x"))
        .await
        .expect("write");
    let stat = s.stat_file(&f.a, &id, "/tmp/p").await.expect("stat");
    assert_eq!((stat.mode, stat.uid), (0o600, 0));

    // The agent's errors, as the API's codes.
    assert_eq!(
        code(s.read_file(&f.a, &id, "/home/user/missing").await),
        ErrorCode::FileNotFound
    );
    assert_eq!(
        code(s.read_file(&f.a, &id, "/home/user").await),
        ErrorCode::IsADirectory
    );
    assert_eq!(
        code(s.list_dir(&f.a, &id, "/tmp/p").await),
        ErrorCode::NotADirectory
    );
    assert_eq!(
        code(s.make_dir(&f.a, &id, body(json!({"path": "/home/user/d"}))).await),
        ErrorCode::AlreadyExists
    );
    assert_eq!(
        code(s.remove_file(&f.a, &id, "/home/user/d", false, None).await),
        ErrorCode::DirectoryNotEmpty
    );
    assert_eq!(
        code(
            s.write_file(
                &f.a,
                &id,
                "/home/user/d",
                WriteFileOptions::default(),
                bytes_body(b"x")
            )
            .await
        ),
        ErrorCode::IsADirectory
    );
    assert_eq!(
        code(
            s.rename_file(&f.a, &id, body(json!({"from": "/nope", "to": "/tmp/x"})))
                .await
        ),
        ErrorCode::FileNotFound
    );
    let ghost = WriteFileOptions {
        mode: None,
        user: Some("ghost".into()),
        parents: false,
        approval_id: None,
    };
    let e = error(s.write_file(&f.a, &id, "/tmp/g", ghost, bytes_body(b"x")).await);
    assert_eq!(
        (e.code, e.field.as_deref()),
        (ErrorCode::InvalidRequest, Some("user"))
    );
    s.remove_file(&f.a, &id, "/home/user/d", true, None)
        .await
        .expect("remove -r");

    let rows: Vec<String> = f
        .actions(&id)
        .await
        .into_iter()
        .filter(|a| a.starts_with("file."))
        .collect();
    assert_eq!(
        rows,
        [
            "file.write",
            "file.read",
            "file.list",
            "file.mkdir",
            "file.rename",
            "file.remove",
            "file.write",
            "file.remove"
        ]
    );
    let write = &f.rows("file.write").await[0];
    assert_eq!(
        (write.detail["path"].as_str(), write.detail["bytes_in"].as_u64()),
        (Some("/home/user/a.txt"), Some(6))
    );
    let remove = f.rows("file.remove").await;
    assert_eq!(remove[1].detail["recursive"], true);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_with_parents_creates_the_missing_directories_owned_by_its_user() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    let s = &f.service;
    let as_root = WriteFileOptions {
        user: Some("root".into()),
        parents: true,
        ..WriteFileOptions::default()
    };
    s.write_file(&f.a, &id, "/home/user/new/deep/a.txt", as_root, bytes_body(b"x"))
        .await
        .expect("write with parents");
    for path in [
        "/home/user/new",
        "/home/user/new/deep",
        "/home/user/new/deep/a.txt",
    ] {
        assert_eq!(s.stat_file(&f.a, &id, path).await.expect("stat").uid, 0, "{path}");
    }
    // Existing parents are kept as they are; without `parents` a missing one is an error.
    assert_eq!(
        s.stat_file(&f.a, &id, "/home/user").await.expect("stat").uid,
        1000
    );
    assert_eq!(
        code(
            s.write_file(
                &f.a,
                &id,
                "/home/user/other/a.txt",
                WriteFileOptions::default(),
                bytes_body(b"x")
            )
            .await
        ),
        ErrorCode::FileNotFound
    );
    // A parent that is a file is refused.
    let with_parents = WriteFileOptions {
        parents: true,
        ..WriteFileOptions::default()
    };
    assert_eq!(
        code(
            s.write_file(
                &f.a,
                &id,
                "/home/user/new/deep/a.txt/b",
                with_parents,
                bytes_body(b"x")
            )
            .await
        ),
        ErrorCode::NotADirectory
    );
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_disk_limit_refuses_writes_past_it_with_no_space() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({"limits": {"disk": "16M"}})).await.id;
    let big = vec![1u8; 17 << 20];
    let e = error(
        f.service
            .write_file(
                &f.a,
                &id,
                "/home/user/big",
                WriteFileOptions::default(),
                bytes_body(&big),
            )
            .await,
    );
    assert_eq!(e.code, ErrorCode::NoSpace, "{e:?}");
    // Below the limit it fits.
    f.service
        .write_file(
            &f.a,
            &id,
            "/home/user/big",
            WriteFileOptions::default(),
            bytes_body(&big[..1 << 20]),
        )
        .await
        .expect("a smaller file fits");
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tar_downloads_and_uploads_run_tar_in_the_sandbox() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    f.sh(
        &f.a,
        &id,
        "mkdir -p /home/user/src/sub; echo one > /home/user/src/a; echo two > /home/user/src/sub/b",
    )
    .await;
    let archive = bytes_of(
        f.service
            .download_tar(&f.a, &id, "/home/user/src")
            .await
            .expect("download"),
    )
    .await
    .expect("the archive");
    f.service
        .upload_tar(&f.a, &id, "/tmp/copy", None, bytes_body(&archive))
        .await
        .expect("upload");
    assert_eq!(
        f.sh(&f.a, &id, "cat /tmp/copy/a /tmp/copy/sub/b").await,
        "one\ntwo\n"
    );
    f.service
        .upload_tar(
            &f.a,
            &id,
            "/tmp/more",
            None,
            bytes_body(&tar_of(&[("x.txt", b"x")])),
        )
        .await
        .expect("upload");
    assert_eq!(f.sh(&f.a, &id, "cat /tmp/more/x.txt").await, "x");
    let e = error(
        f.service
            .upload_tar(
                &f.a,
                &id,
                "/tmp/bad",
                None,
                bytes_body(b"not a tar archive at all"),
            )
            .await,
    );
    assert_eq!(e.code, ErrorCode::InvalidRequest, "{e:?}");
    assert_eq!(
        code(f.service.download_tar(&f.a, &id, "/etc/passwd").await),
        ErrorCode::NotADirectory
    );
    let uploads = f.rows("file.tar_upload").await;
    assert_eq!(
        uploads.iter().map(|r| r.outcome.as_str()).collect::<Vec<_>>(),
        ["ok", "ok", "invalid_request"]
    );
    assert_eq!(f.rows("file.tar_download").await.len(), 1);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reports_changes_made_through_the_api_and_ends_with_its_directory() {
    let f = Fixture::start().await;
    let id = f.create(&f.a, json!({})).await.id;
    f.sh(&f.a, &id, "mkdir /home/user/w").await;
    let mut watch = f
        .service
        .watch_dir(&f.a, &id, "/home/user/w", true)
        .await
        .expect("watch");
    f.service
        .write_file(
            &f.a,
            &id,
            "/home/user/w/a.txt",
            WriteFileOptions::default(),
            bytes_body(b"hi"),
        )
        .await
        .expect("write");
    f.service
        .make_dir(&f.a, &id, body(json!({"path": "/home/user/w/d"})))
        .await
        .expect("mkdir");
    f.service
        .rename_file(
            &f.a,
            &id,
            body(json!({"from": "/home/user/w/a.txt", "to": "/home/user/w/d/b.txt"})),
        )
        .await
        .expect("rename");
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let event = tokio::time::timeout(DEADLINE, watch.recv())
            .await
            .expect("events in time")
            .expect("the watch goes on");
        seen.push((event.path, event.kind));
    }
    assert_eq!(
        seen,
        [
            ("/home/user/w/a.txt".to_owned(), WatchEventKind::Create),
            ("/home/user/w/a.txt".to_owned(), WatchEventKind::Modify),
            ("/home/user/w/d".to_owned(), WatchEventKind::Create),
            ("/home/user/w/a.txt".to_owned(), WatchEventKind::RenameFrom),
            ("/home/user/w/d/b.txt".to_owned(), WatchEventKind::RenameTo),
        ]
    );
    f.service
        .remove_file(&f.a, &id, "/home/user/w", true, None)
        .await
        .expect("rm -r");
    let last = loop {
        let event = tokio::time::timeout(DEADLINE, watch.recv())
            .await
            .expect("events in time")
            .expect("an end event");
        if event.kind == WatchEventKind::Ended {
            break event;
        }
    };
    assert_eq!(last.path, "/home/user/w");
    assert_eq!(
        code(f.service.watch_dir(&f.a, &id, "/nope", false).await),
        ErrorCode::FileNotFound
    );
    let rows = f.rows("file.watch").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (
            rows[0].detail["path"].as_str(),
            rows[0].detail["recursive"].as_bool()
        ),
        (Some("/home/user/w"), Some(true))
    );
    f.finish().await;
}
