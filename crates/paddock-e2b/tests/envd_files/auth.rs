//! Who may use `/files`: the envd token, or a URL signature for one path, operation and user; and
//! what a sandbox that cannot be reached answers.

use axum::body::Body;
use axum::http::{Method, StatusCode};
use paddock_e2b::tokens::{file_signature, FileOperation};
use serde_json::json;

use crate::fixture::{envd, multipart, multipart_type, query, Env};

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_url_opens_one_path_for_one_operation_until_it_expires() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a, json!({})).await;
    let token = env.token(&id);
    let sign = |path: &str, op, user: &str, expires| file_signature(path, op, user, &token, expires);

    // A signed upload, as `upload_url()` makes it: no token header.
    let later = now() + 600;
    let signature = sign("signed.txt", FileOperation::Write, "user", Some(later));
    let uri = format!(
        "/files{}",
        query(&[
            ("path", "signed.txt"),
            ("username", "user"),
            ("signature", &signature),
            ("signature_expiration", &later.to_string()),
        ])
    );
    let upload = envd(&id, Method::POST, &uri)
        .header("content-type", multipart_type())
        .body(Body::from(multipart(&[("file", Some("signed.txt"), b"signed")])))
        .expect("request");
    let reply = env.send(upload).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);

    let get = |params: Vec<(&'static str, String)>, token: Option<String>| {
        let pairs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut req = envd(&id, Method::GET, &format!("/files{}", query(&pairs)));
        if let Some(t) = token {
            req = req.header("x-access-token", t);
        }
        req.body(Body::empty()).expect("request")
    };
    let read = |expires: Option<i64>| sign("signed.txt", FileOperation::Read, "user", expires);
    let p = |v: &str| ("path", v.to_owned());
    let u = ("username", "user".to_owned());

    // Signed reads, without and with an expiry.
    let ok = env
        .send(get(
            vec![p("signed.txt"), u.clone(), ("signature", read(None))],
            None,
        ))
        .await;
    assert_eq!((ok.status, &ok.body[..]), (StatusCode::OK, b"signed".as_slice()));
    let ok = env
        .send(get(
            vec![
                p("signed.txt"),
                u.clone(),
                ("signature", read(Some(later))),
                ("signature_expiration", later.to_string()),
            ],
            None,
        ))
        .await;
    assert_eq!(ok.status, StatusCode::OK);

    let refused = |reply: crate::fixture::Reply, message: &str| {
        assert_eq!(reply.error(), (StatusCode::UNAUTHORIZED, message.to_owned()));
    };
    // Expired: E2B's exact words.
    let past = now() - 5;
    refused(
        env.send(get(
            vec![
                p("signed.txt"),
                u.clone(),
                ("signature", read(Some(past))),
                ("signature_expiration", past.to_string()),
            ],
            None,
        ))
        .await,
        "signature is already expired",
    );
    // An expiry the signature does not cover.
    refused(
        env.send(get(
            vec![
                p("signed.txt"),
                u.clone(),
                ("signature", read(None)),
                ("signature_expiration", later.to_string()),
            ],
            None,
        ))
        .await,
        "invalid signature",
    );
    // The write signature does not read; another path's, another user's, a garbled one neither.
    for bad in [
        sign("signed.txt", FileOperation::Write, "user", None),
        sign("other.txt", FileOperation::Read, "user", None),
        sign("signed.txt", FileOperation::Read, "", None),
        "v1_garbage".to_owned(),
    ] {
        refused(
            env.send(get(vec![p("signed.txt"), u.clone(), ("signature", bad)], None))
                .await,
            "invalid signature",
        );
    }
    // The path is signed as written: the absolute spelling of the same file is another path.
    refused(
        env.send(get(
            vec![p("/home/user/signed.txt"), u.clone(), ("signature", read(None))],
            None,
        ))
        .await,
        "invalid signature",
    );
    // Neither token nor signature.
    refused(
        env.send(get(vec![p("signed.txt"), u.clone()], None)).await,
        "missing signature query parameter",
    );
    // A wrong token is refused even with a valid signature (as envd does).
    refused(
        env.send(get(
            vec![p("signed.txt"), u.clone(), ("signature", read(None))],
            Some("0".repeat(64)),
        ))
        .await,
        "access token present in header but does not match",
    );
    // The token alone needs no signature.
    let ok = env.send(get(vec![p("signed.txt")], Some(token.clone()))).await;
    assert_eq!(ok.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_that_cannot_be_reached_answer_as_e2bs_proxy_and_tokens_open_one_sandbox() {
    let env = Env::start().await;
    let mine = env.sandbox(&env.a, json!({})).await;
    let theirs = env.sandbox(&env.b, json!({})).await;
    let paused = env.sandbox(&env.a, json!({})).await;
    let killed = env.sandbox(&env.a, json!({})).await;
    env.service.pause_sandbox(&env.a, &paused).await.expect("pause");
    env.service.kill_sandbox(&env.a, &killed).await.expect("kill");
    let missing: paddock_types::SandboxId = "sb-00000000000000ff".parse().expect("an id");

    for id in [&paused, &killed, &missing] {
        let get = envd(id, Method::GET, "/files?path=a")
            .header("x-access-token", env.token(id))
            .body(Body::empty())
            .expect("request");
        let reply = env.send(get).await;
        assert_eq!(reply.status, StatusCode::BAD_GATEWAY, "{id}");
        assert_eq!(
            reply.json(),
            json!({"sandboxId": id.as_str(), "message": "The sandbox was not found", "code": 502})
        );
    }

    // One sandbox's token opens no other sandbox, of its tenant or another: the request is
    // refused before anything is read or written.
    for (id, token) in [(&theirs, env.token(&mine)), (&mine, env.token(&theirs))] {
        let upload = envd(id, Method::POST, "/files?path=x.txt")
            .header("x-access-token", token)
            .header("content-type", "application/octet-stream")
            .body(Body::from("x"))
            .expect("request");
        let reply = env.send(upload).await;
        assert_eq!(reply.error().0, StatusCode::UNAUTHORIZED);
    }
    for (p, id) in [(&env.a, &mine), (&env.b, &theirs)] {
        let missing = env.service.stat_file(p, id, "/home/user/x.txt").await;
        assert!(missing.is_err(), "nothing was written");
    }
    // Nor does a signature made with another sandbox's token.
    let forged = file_signature("a", FileOperation::Read, "", &env.token(&mine), None);
    let get = envd(
        &theirs,
        Method::GET,
        &format!("/files{}", query(&[("path", "a"), ("signature", &forged)])),
    )
    .body(Body::empty())
    .expect("request");
    assert_eq!(
        env.send(get).await.error(),
        (StatusCode::UNAUTHORIZED, "invalid signature".to_owned())
    );
}
