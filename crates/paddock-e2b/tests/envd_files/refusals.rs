//! What `/files` refuses, with envd's status and words, and that a refused upload loses nothing.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use bytes::Bytes;
use serde_json::json;

use crate::fixture::{envd, multipart, multipart_type, query, Env, BOUNDARY};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_paths_directories_missing_files_and_unsupported_requests() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a, json!({})).await;
    let token = env.token(&id);
    let get = |q: &str, accept: Option<&str>| {
        let mut req = envd(&id, Method::GET, &format!("/files{q}")).header("x-access-token", &token);
        if let Some(a) = accept {
            req = req.header("accept-encoding", a);
        }
        req.body(Body::empty()).expect("request")
    };
    let error = |status: StatusCode, message: &str| (status, message.to_owned());

    assert_eq!(
        env.send(get(&query(&[("path", "nope")]), None)).await.error(),
        error(StatusCode::NOT_FOUND, "path '/home/user/nope' does not exist")
    );
    assert_eq!(
        env.send(get(&query(&[("path", "/home/user")]), None))
            .await
            .error(),
        error(StatusCode::BAD_REQUEST, "path '/home/user' is a directory")
    );
    // No path at all is the user's home, a directory.
    assert_eq!(
        env.send(get("", None)).await.error(),
        error(StatusCode::BAD_REQUEST, "path '/home/user' is a directory")
    );
    assert_eq!(
        env.send(get(&query(&[("path", "~root/x")]), None)).await.error(),
        error(
            StatusCode::BAD_REQUEST,
            "failed to expand path '~root/x': cannot expand user-specific home dir"
        )
    );
    assert_eq!(
        env.send(get("?path=%2Ftmp%2Fa%00b", None)).await.error().0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        env.send(get(
            &query(&[("path", "x"), ("signature_expiration", "soon")]),
            None
        ))
        .await
        .error()
        .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        env.send(get(&query(&[("path", "x"), ("username", "a/b")]), None))
            .await
            .error()
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        env.send(get(&query(&[("path", "/etc/passwd")]), Some("br, identity;q=0")))
            .await
            .error(),
        error(
            StatusCode::NOT_ACCEPTABLE,
            "no acceptable encoding found, supported: [gzip]"
        )
    );

    let post = |q: &str, content_type: &str, extra: Option<(&str, &str)>, body: Vec<u8>| {
        let mut req = envd(&id, Method::POST, &format!("/files{q}"))
            .header("x-access-token", &token)
            .header("content-type", content_type);
        if let Some((k, v)) = extra {
            req = req.header(k, v);
        }
        req.body(Body::from(body)).expect("request")
    };
    let raw = "application/octet-stream";
    assert_eq!(
        env.send(post("?path=%2Fhome%2Fuser", raw, None, b"x".to_vec()))
            .await
            .error(),
        error(StatusCode::BAD_REQUEST, "path '/home/user' is a directory")
    );
    assert_eq!(
        env.send(post("", raw, None, b"x".to_vec())).await.error(),
        error(
            StatusCode::BAD_REQUEST,
            "path query parameter is required for raw body upload"
        )
    );
    assert_eq!(
        env.send(post("?path=a", "text/plain", None, b"x".to_vec()))
            .await
            .error()
            .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        env.send(post(
            "?path=a",
            raw,
            Some(("content-encoding", "br")),
            b"x".to_vec()
        ))
        .await
        .error()
        .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        env.send(post(
            "?path=a",
            raw,
            Some(("content-encoding", "gzip")),
            b"not gzip".to_vec()
        ))
        .await
        .error()
        .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        env.send(post(
            "?path=a",
            raw,
            Some(("x-metadata-owner", "me")),
            b"x".to_vec()
        ))
        .await
        .error(),
        error(
            StatusCode::BAD_REQUEST,
            "file metadata (X-Metadata-* headers) is not supported by this server"
        )
    );
    // A user the sandbox does not have.
    assert_eq!(
        env.send(post("?path=a&username=ghost", raw, None, b"x".to_vec()))
            .await
            .error()
            .0,
        StatusCode::UNAUTHORIZED
    );
    // A parent that is a file.
    assert_eq!(
        env.send(post("?path=%2Fetc%2Fpasswd%2Fx", raw, None, b"x".to_vec()))
            .await
            .error()
            .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        env.send(post("", "multipart/form-data", None, b"x".to_vec()))
            .await
            .error()
            .0,
        StatusCode::BAD_REQUEST
    );
    // None of these left a file behind.
    for path in ["/home/user/a", "/home/user/x"] {
        assert!(env.service.stat_file(&env.a, &id, path).await.is_err(), "{path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_multipart_bodies_are_refused_without_losing_anything() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a, json!({})).await;
    let token = env.token(&id);
    let upload = |body: Vec<u8>| {
        envd(&id, Method::POST, "/files")
            .header("x-access-token", &token)
            .header("content-type", multipart_type())
            .body(Body::from(body))
            .expect("request")
    };
    let keep = "/home/user/keep.txt";
    let reply = env
        .send(upload(multipart(&[("file", Some(keep), b"original")])))
        .await;
    assert_eq!(reply.status, StatusCode::OK);

    // Cut off in the middle of the part's data (no closing boundary).
    let mut truncated = multipart(&[("file", Some(keep), b"replacement that never ends")]);
    truncated.truncate(truncated.len() - 30);
    let reply = env.send(upload(truncated)).await;
    assert_eq!(reply.error().0, StatusCode::BAD_REQUEST);
    assert_eq!(env.file(&env.a, &id, keep).await, b"original");

    // Part headers that never end: one header line, sent in 64 KiB pieces as a socket brings
    // them, forever. The upload is refused once the parser has been handed its window.
    let start = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{keep}\"\r\nX-Pad: "
    );
    let endless = futures_util::stream::iter(
        std::iter::once(Bytes::from(start))
            .chain(std::iter::repeat_with(|| Bytes::from(vec![b'a'; 64 * 1024])))
            .map(Ok::<_, std::io::Error>),
    );
    let endless = envd(&id, Method::POST, "/files")
        .header("x-access-token", &token)
        .header("content-type", multipart_type())
        .body(Body::from_stream(endless))
        .expect("request");
    let reply = env.send(endless).await;
    let (status, message) = reply.error();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.contains("too large"), "{message}");
    assert_eq!(env.file(&env.a, &id, keep).await, b"original");

    // Part headers over their bound, though they end.
    let big_header = format!(
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{keep}\"\r\nX-Pad: {}\r\n\r\nnew\r\n--{BOUNDARY}--\r\n",
        "a".repeat(20 * 1024)
    );
    let reply = env.send(upload(big_header.into_bytes())).await;
    assert_eq!(reply.error().0, StatusCode::BAD_REQUEST);
    assert_eq!(env.file(&env.a, &id, keep).await, b"original");

    // More parts than allowed: refused before the file part at the end is reached.
    let mut many: Vec<(&str, Option<&str>, &[u8])> = vec![("other", None, b"x"); 1000];
    many.push(("file", Some(keep), b"too late"));
    let reply = env.send(upload(multipart(&many))).await;
    let (status, message) = reply.error();
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message.contains("too many parts"), "{message}");
    assert_eq!(env.file(&env.a, &id, keep).await, b"original");

    // A file part with no name to take its path from.
    let reply = env.send(upload(multipart(&[("file", None, b"nameless")]))).await;
    assert_eq!(reply.error().0, StatusCode::BAD_REQUEST);

    // The same path twice: the first is written, then the upload is refused with envd's words.
    let reply = env
        .send(upload(multipart(&[
            ("file", Some("dup.txt"), b"first"),
            ("file", Some("/home/user/dup.txt"), b"second"),
        ])))
        .await;
    assert_eq!(
        reply.error(),
        (
            StatusCode::BAD_REQUEST,
            "you cannot upload multiple files to the same path '/home/user/dup.txt' in one upload \
             request, only the first specified file was uploaded"
                .to_owned()
        )
    );
    assert_eq!(env.file(&env.a, &id, "/home/user/dup.txt").await, b"first");
    assert_eq!(env.file(&env.a, &id, keep).await, b"original");
}
