//! Uploads (multipart, raw, gzip) and downloads (plain, gzip) of the same files; `/envs`.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use serde_json::json;

use crate::fixture::{envd, gunzip, gzip, multipart, multipart_type, query, Env};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multipart_upload_writes_a_file_that_downloads_read_back() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a, json!({})).await;
    let token = env.token(&id);
    let data = b"hello from the sdk\n".as_slice();
    // As the SDKs write one file: `path` in the query, the same path as the part's filename; a
    // relative path starts at the user's home, and missing directories are made.
    let upload = envd(
        &id,
        Method::POST,
        &format!("/files{}", query(&[("path", "notes/a.txt")])),
    )
    .header("x-access-token", &token)
    .header("content-type", multipart_type())
    .body(Body::from(multipart(&[("file", Some("notes/a.txt"), data)])))
    .expect("request");
    let reply = env.send(upload).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(
        reply.json(),
        json!([{"path": "/home/user/notes/a.txt", "name": "a.txt", "type": "file"}])
    );
    // The default user's: the file and the directory made for it.
    assert_eq!(env.uid(&env.a, &id, "/home/user/notes").await, 1000);
    assert_eq!(env.uid(&env.a, &id, "/home/user/notes/a.txt").await, 1000);

    for path in ["notes/a.txt", "~/notes/a.txt", "/home/user/notes/a.txt"] {
        let get = envd(&id, Method::GET, &format!("/files{}", query(&[("path", path)])))
            .header("x-access-token", &token)
            .body(Body::empty())
            .expect("request");
        let reply = env.send(get).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        assert_eq!(&reply.body[..], data);
        assert_eq!(reply.header("content-type"), Some("text/plain; charset=utf-8"));
        assert_eq!(
            reply.header("content-disposition"),
            Some("inline; filename=\"a.txt\"")
        );
        assert_eq!(reply.header("content-length"), Some("19"));
        assert_eq!(reply.header("content-encoding"), None);
    }

    // httpx asks for gzip by default: the body comes compressed, and says so.
    let get = envd(&id, Method::GET, "/files?path=notes%2Fa.txt&username=user")
        .header("x-access-token", &token)
        .header("accept-encoding", "gzip, deflate")
        .body(Body::empty())
        .expect("request");
    let reply = env.send(get).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    assert_eq!(reply.header("vary"), Some("Accept-Encoding"));
    assert_eq!(gunzip(&reply.body), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_upload_writes_many_files_each_named_by_its_part() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a, json!({})).await;
    let body = multipart(&[
        ("file", Some("x.txt"), b"x"),
        ("comment", None, b"not a file: ignored"),
        ("file", Some("/tmp/deep/y.bin"), b"yy"),
        ("file", Some("~/sub/z"), b"zzz"),
    ]);
    // As root: relative paths start at /root, and what is made is root's.
    let upload = envd(&id, Method::POST, "/files?username=root")
        .header("x-access-token", env.token(&id))
        .header("content-type", multipart_type())
        .body(Body::from(body))
        .expect("request");
    let reply = env.send(upload).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(
        reply.json(),
        json!([
            {"path": "/root/x.txt", "name": "x.txt", "type": "file"},
            {"path": "/tmp/deep/y.bin", "name": "y.bin", "type": "file"},
            {"path": "/root/sub/z", "name": "z", "type": "file"},
        ])
    );
    assert_eq!(env.file(&env.a, &id, "/root/x.txt").await, b"x");
    assert_eq!(env.file(&env.a, &id, "/tmp/deep/y.bin").await, b"yy");
    assert_eq!(env.file(&env.a, &id, "/root/sub/z").await, b"zzz");
    assert_eq!(env.uid(&env.a, &id, "/tmp/deep").await, 0);
    assert_eq!(env.uid(&env.a, &id, "/root/sub/z").await, 0);

    // Uploading again overwrites.
    let again = envd(&id, Method::POST, "/files?username=root")
        .header("x-access-token", env.token(&id))
        .header("content-type", multipart_type())
        .body(Body::from(multipart(&[("file", Some("x.txt"), b"second")])))
        .expect("request");
    assert_eq!(env.send(again).await.status, StatusCode::OK);
    assert_eq!(env.file(&env.a, &id, "/root/x.txt").await, b"second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_gzip_bodies_upload_and_large_files_download_whole() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a, json!({})).await;
    let token = env.token(&id);
    // Larger than one agent frame (1 MiB), so the write and the read each take several.
    let big: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|i: u32| (i % 253) as u8).collect();

    let raw = envd(&id, Method::POST, "/files?path=raw.bin")
        .header("x-access-token", &token)
        .header("content-type", "application/octet-stream")
        .body(Body::from(big.clone()))
        .expect("request");
    let reply = env.send(raw).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!([{"path": "/home/user/raw.bin", "name": "raw.bin", "type": "file"}])
    );

    // The Python SDK's `gzip=True`: a raw body, gzip-encoded.
    let packed = envd(&id, Method::POST, "/files?path=%2Ftmp%2Fpacked.bin")
        .header("x-access-token", &token)
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(Body::from(gzip(&big)))
        .expect("request");
    assert_eq!(env.send(packed).await.status, StatusCode::OK);
    assert_eq!(env.file(&env.a, &id, "/tmp/packed.bin").await, big);

    // A gzip-encoded multipart body.
    let form = multipart(&[("file", Some("/tmp/form.txt"), b"in a gzip form")]);
    let packed_form = envd(&id, Method::POST, "/files")
        .header("x-access-token", &token)
        .header("content-type", multipart_type())
        .header("content-encoding", "gzip")
        .body(Body::from(gzip(&form)))
        .expect("request");
    let reply = env.send(packed_form).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(env.file(&env.a, &id, "/tmp/form.txt").await, b"in a gzip form");

    for (accept, gzipped) in [(None, false), (Some("gzip"), true)] {
        let mut get = envd(&id, Method::GET, "/files?path=raw.bin").header("x-access-token", &token);
        if let Some(accept) = accept {
            get = get.header("accept-encoding", accept);
        }
        let reply = env.send(get.body(Body::empty()).expect("request")).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("content-type"), Some("application/octet-stream"));
        let body = if gzipped {
            assert!(reply.header("content-length").is_none());
            gunzip(&reply.body)
        } else {
            assert_eq!(
                reply.header("content-length"),
                Some(big.len().to_string().as_str())
            );
            reply.body.to_vec()
        };
        assert!(body == big, "the download differs (gzip: {gzipped})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_507_even_to_a_small_body_that_inflates() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a, json!({"limits": {"disk": "16M"}})).await;
    let token = env.token(&id);
    // 64 MiB of zeros in about 64 KiB: it inflates into the write until the disk limit stops it.
    let bomb = gzip(&vec![0u8; 64 * 1024 * 1024]);
    assert!(bomb.len() < 256 * 1024);
    let upload = envd(&id, Method::POST, "/files?path=bomb")
        .header("x-access-token", &token)
        .header("content-type", "application/octet-stream")
        .header("content-encoding", "gzip")
        .body(Body::from(bomb.clone()))
        .expect("request");
    let reply = env.send(upload).await;
    assert_eq!(
        reply.error().0,
        StatusCode::INSUFFICIENT_STORAGE,
        "{:?}",
        reply.body
    );
    // What was written before the disk filled stays (as envd's); with it gone, the same inside a
    // multipart body.
    env.service
        .remove_file(&env.a, &id, "/home/user/bomb", false, None)
        .await
        .expect("remove");
    let form = gzip(&multipart(&[(
        "file",
        Some("bomb2"),
        &vec![0u8; 32 * 1024 * 1024],
    )]));
    let upload = envd(&id, Method::POST, "/files")
        .header("x-access-token", &token)
        .header("content-type", multipart_type())
        .header("content-encoding", "gzip")
        .body(Body::from(form))
        .expect("request");
    let reply = env.send(upload).await;
    assert_eq!(
        reply.error().0,
        StatusCode::INSUFFICIENT_STORAGE,
        "{:?}",
        reply.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envs_lists_the_sandbox_variables_to_the_token_alone() {
    let env = Env::start().await;
    let id = env
        .sandbox(&env.a, json!({"env": {"FOO": "bar", "SECRETISH": "s3cr3t"}}))
        .await;
    let get = envd(&id, Method::GET, "/envs")
        .header("x-access-token", env.token(&id))
        .body(Body::empty())
        .expect("request");
    let reply = env.send(get).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    assert_eq!(reply.json(), json!({"FOO": "bar", "SECRETISH": "s3cr3t"}));

    for token in [None, Some("wrong")] {
        let mut get = envd(&id, Method::GET, "/envs");
        if let Some(token) = token {
            get = get.header("x-access-token", token);
        }
        let reply = env.send(get.body(Body::empty()).expect("request")).await;
        assert_eq!(
            reply.error(),
            (
                StatusCode::UNAUTHORIZED,
                "unauthorized access, please provide a valid access token or method signing if supported"
                    .to_owned()
            )
        );
    }
}
