//! Ids are parsed once, at the edge: every route with a sandbox id (`{id}`) or a snapshot id
//! (`{snapshot_id}`) in its path, as listed by the OpenAPI document (the router's own table), answers
//! a malformed id exactly as it answers a well-formed id that names nothing, so an id's shape tells a
//! caller nothing a lookup would not. Runs the real router over a service on the fake backend.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt as _;
use paddock_control::{SandboxService, ServiceConfig};
use paddock_runtime::fake::FakeBackend;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use serde_json::Value;
use tower::ServiceExt as _;

/// Well-formed ids that name nothing.
const MISSING_SANDBOX: &str = "sb-00000000000000ff";
const MISSING_SNAPSHOT: &str = "sn-00000000000000ff";

/// Ids no sandbox or snapshot can have: upper case, a character outside the alphabet, a leading
/// dash, a dot-dot segment (percent-encoded, as a client must send it), one character too many.
fn malformed() -> Vec<(String, String)> {
    let long = "a".repeat(41);
    vec![
        ("Sb-UPPER".into(), "Sb-UPPER".into()),
        ("sb_under".into(), "sb_under".into()),
        ("-sb".into(), "-sb".into()),
        ("%2E%2E".into(), "..".into()),
        (long.clone(), long),
    ]
}

async fn service() -> (SandboxService, String) {
    let backend = FakeBackend::new().expect("the fake backend starts");
    let store = Store::open_in_memory().expect("an in-memory store");
    let service = SandboxService::start(ServiceConfig::default(), AnyBackend::Fake(backend), store)
        .await
        .expect("the service starts");
    service.recovered().await;
    let admin = service
        .bootstrap_admin_key()
        .await
        .expect("bootstrap")
        .expect("a fresh store makes an admin key");
    (service, admin.key)
}

/// Every (method, path template) of the OpenAPI document whose path has `param`.
fn routes_with(param: &str) -> Vec<(Method, String)> {
    let doc: Value = serde_json::from_str(&paddock_api::openapi().to_json().expect("json")).expect("parse");
    let mut routes = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        if !path.contains(param) {
            continue;
        }
        for method in ["get", "put", "post", "delete", "patch"] {
            if item.get(method).is_some() {
                routes.push((method.to_uppercase().parse().expect("method"), path.clone()));
            }
        }
    }
    routes
}

/// A query and a body each route accepts, so that what is left to refuse is the id.
fn valid_request(method: &Method, template: &str) -> (&'static str, &'static str) {
    let files =
        template.contains("/files") && !template.ends_with("/mkdir") && !template.ends_with("/rename");
    if files {
        return ("?path=/home/user", "{}");
    }
    let body = match (method.as_str(), template.rsplit('/').next().unwrap_or_default()) {
        ("POST", "exec") => r#"{"argv": ["true"]}"#,
        ("POST", "code") => r#"{"code": "1"}"#,
        ("POST", "mkdir") => r#"{"path": "/home/user/d"}"#,
        ("POST", "rename") => r#"{"from": "/home/user/a", "to": "/home/user/b"}"#,
        ("POST", "fork") => r#"{"count": 1}"#,
        ("POST", "resize") => r#"{"rows": 10, "cols": 20}"#,
        ("POST", "signal") => r#"{"signal": "TERM"}"#,
        ("POST", "timeout") => r#"{"timeout_secs": 60}"#,
        ("PUT", "policy") => r#"{"policy": {"default": "allow"}}"#,
        _ => "{}",
    };
    ("", body)
}

/// WebSocket routes refuse a plain request before they look at the id (there is no connection to
/// upgrade here), so for them only the equality of the two answers is checked.
fn is_websocket(template: &str) -> bool {
    template.ends_with("/ws") || template.ends_with("/pty") || template.ends_with("/tcp")
}

/// The answer's status, code and message with `id` replaced by `<id>`.
async fn answer(
    router: &axum::Router,
    key: &str,
    method: &Method,
    uri: &str,
    id: &str,
) -> (StatusCode, String, String) {
    let template_body = valid_request(method, uri).1;
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(paddock_api::API_KEY_HEADER, key);
    let body = if matches!(*method, Method::POST | Method::PUT | Method::PATCH) {
        request = request.header("content-type", "application/json");
        Body::from(template_body)
    } else {
        Body::empty()
    };
    let response = router
        .clone()
        .oneshot(request.body(body).expect("request"))
        .await
        .expect("the router answers");
    let status = response.status();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "{method} {uri}: not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    let message = body["message"].as_str().unwrap_or_default().replace(id, "<id>");
    (
        status,
        body["code"].as_str().unwrap_or_default().to_owned(),
        message,
    )
}

async fn check(param: &str, missing: &str, expected_code: &str) {
    let (service, key) = service().await;
    let router = paddock_api::router(service.clone());
    let routes = routes_with(param);
    assert!(!routes.is_empty(), "no route has {param}");
    for (method, template) in &routes {
        let query = valid_request(method, template).0;
        let uri = |id: &str| {
            format!(
                "{}{query}",
                template
                    .replace(param, id)
                    .replace("{pid}", "1")
                    .replace("{port}", "8080")
                    .replace("{path}", "x")
            )
        };
        let reference = answer(&router, &key, method, &uri(missing), missing).await;
        if !is_websocket(template) {
            assert_eq!(
                reference.0,
                StatusCode::NOT_FOUND,
                "{method} {template}: {reference:?}"
            );
            assert_eq!(reference.1, expected_code, "{method} {template}");
        }
        for (sent, decoded) in malformed() {
            let got = answer(&router, &key, method, &uri(&sent), &decoded).await;
            assert_eq!(got, reference, "{method} {template} with id {decoded:?}");
        }
    }
    service.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_sandbox_id_answers_as_a_missing_sandbox_on_every_route() {
    check("{id}", MISSING_SANDBOX, "sandbox_not_found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_snapshot_id_answers_as_a_missing_snapshot_on_every_route() {
    check("{snapshot_id}", MISSING_SNAPSHOT, "snapshot_not_found").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pid_that_is_not_a_number_is_still_named() {
    let (service, key) = service().await;
    let router = paddock_api::router(service.clone());
    for id in [MISSING_SANDBOX, "Sb-UPPER"] {
        let uri = format!("/v1/sandboxes/{id}/processes/abc/kill");
        let (status, code, message) = answer(&router, &key, &Method::POST, &uri, id).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri}: {message}");
        assert_eq!(code, "invalid_request", "{uri}: {message}");
    }
    service.shutdown().await;
}
