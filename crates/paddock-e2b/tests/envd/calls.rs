//! Who may call, and what the Connect layer refuses: tokens, gone sandboxes, unknown RPCs, wrong
//! methods and content types, malformed and oversized messages and envelopes, compression.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::json;

use crate::support::{end_error, envelope, json_body, Env, Frames};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_or_missing_token_is_401_and_a_gone_sandbox_502() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let list = "/process.Process/List";
    let other_token = env.token(&"sb-00000000000000aa".parse().expect("id"));
    for token in [None, Some("nope"), Some(other_token.as_str())] {
        let mut req = Request::post(list)
            .header("E2b-Sandbox-Id", id.as_str())
            .header("E2b-Sandbox-Port", "49983")
            .header("content-type", "application/json");
        if let Some(token) = &token {
            req = req.header("X-Access-Token", *token);
        }
        let resp = env.send(req.body(Body::from("{}")).expect("request")).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "token {token:?}");
    }
    // Another tenant's sandbox with this sandbox's token.
    let theirs = env.sandbox(&env.b).await;
    let req = Request::post(list)
        .header("E2b-Sandbox-Id", theirs.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .header("content-type", "application/json")
        .header("X-Access-Token", env.token(&id))
        .body(Body::from("{}"))
        .expect("request");
    assert_eq!(env.send(req).await.status(), StatusCode::UNAUTHORIZED);
    // A sandbox that never existed, or that ended: E2B's proxy answer, whatever the token.
    let missing: paddock_types::SandboxId = "sb-00000000000000aa".parse().expect("id");
    let (status, body) = env.unary(&missing, list, json!({}), &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(body["message"], "The sandbox was not found");
    env.service.kill_sandbox(&env.a, &id).await.expect("killed");
    let (status, body) = env.unary(&id, list, json!({}), &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(body["message"]
        .as_str()
        .unwrap_or_default()
        .contains("was not found"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_rpcs_wrong_methods_and_content_types_are_refused() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    for path in [
        "/process.Process/Nope",
        "/filesystem.Filesystem/Nope",
        "/other.Service/Method",
    ] {
        let (status, body) = env.unary(&id, path, json!({}), &[]).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::NOT_FOUND, Some("unimplemented")),
            "{path}"
        );
    }
    let get = Request::get("/process.Process/List")
        .header("E2b-Sandbox-Id", id.as_str())
        .header("E2b-Sandbox-Port", "49983")
        .header("X-Access-Token", env.token(&id))
        .body(Body::empty())
        .expect("request");
    let resp = env.send(get).await;
    assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(json_body(resp).await["code"], "unimplemented");
    // A stream's content type on a unary call, and the reverse.
    let req = env.request(
        id.as_str(),
        "/process.Process/List",
        "application/connect+json",
        Body::from("{}"),
        &[],
    );
    assert_eq!(env.send(req).await.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let req = env.request(
        id.as_str(),
        "/process.Process/Start",
        "application/json",
        Body::from("{}"),
        &[],
    );
    assert_eq!(env.send(req).await.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Compression is refused.
    let (status, body) = env
        .unary(
            &id,
            "/process.Process/List",
            json!({}),
            &[("content-encoding", "gzip")],
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_IMPLEMENTED, Some("unimplemented"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_messages_are_refused() {
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    let req = env.request(
        id.as_str(),
        "/filesystem.Filesystem/Stat",
        "application/json",
        Body::from("{nope"),
        &[],
    );
    let resp = env.send(req).await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_body(resp).await["code"], "invalid_argument");
    let huge = format!("{{\"path\": \"{}\"}}", "a".repeat(5 << 20));
    let req = env.request(
        id.as_str(),
        "/filesystem.Filesystem/Stat",
        "application/json",
        Body::from(huge),
        &[],
    );
    let resp = env.send(req).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(json_body(resp).await["code"], "resource_exhausted");

    // Streams: the refusal is the end message of a 200 stream.
    let stream_refusal = |body: Vec<u8>| {
        let req = env.request(
            id.as_str(),
            "/process.Process/Start",
            "application/connect+json",
            Body::from(body),
            &[],
        );
        async {
            let resp = env.send(req).await;
            assert_eq!(resp.status(), StatusCode::OK);
            let frames = Frames::from(resp).all().await;
            assert_eq!(frames.len(), 1, "only the end message");
            end_error(&frames).expect("an error").0
        }
    };
    let start = crate::support::start_body("true").to_string();
    assert_eq!(
        stream_refusal(envelope(0, start.as_bytes())[..7].to_vec()).await,
        "invalid_argument",
        "truncated"
    );
    assert_eq!(
        stream_refusal(vec![0, 0x00, 0x50, 0, 0]).await,
        "resource_exhausted",
        "oversized"
    );
    assert_eq!(
        stream_refusal(envelope(1, start.as_bytes()).to_vec()).await,
        "invalid_argument",
        "compressed"
    );
    assert_eq!(
        stream_refusal(envelope(0x40, start.as_bytes()).to_vec()).await,
        "invalid_argument",
        "flags"
    );
    assert_eq!(
        stream_refusal(envelope(0, b"[1]").to_vec()).await,
        "invalid_argument",
        "not a message"
    );
    assert_eq!(stream_refusal(Vec::new()).await, "invalid_argument", "no message");
    let two = [envelope(0, start.as_bytes()), envelope(0, start.as_bytes())].concat();
    assert_eq!(stream_refusal(two).await, "invalid_argument", "two messages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_codec_works_too() {
    use prost::Message as _;
    let env = Env::start().await;
    let id = env.sandbox(&env.a).await;
    // StatRequest { path = 1 } for "/tmp".
    let body = [&[0x0a, 4][..], b"/tmp"].concat();
    let req = env.request(
        id.as_str(),
        "/filesystem.Filesystem/Stat",
        "application/proto",
        Body::from(body),
        &[],
    );
    let resp = env.send(req).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "application/proto");
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    let stat =
        paddock_e2b::envd::proto::filesystem::StatResponse::decode(&bytes[..]).expect("a StatResponse");
    let entry = stat.entry.expect("an entry");
    assert_eq!((entry.path.as_str(), entry.r#type), ("/tmp", 2));
}
