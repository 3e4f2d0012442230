//! E2B's control plane in-process over the fake backend: the shapes of its answers are a contract
//! with E2B's SDKs, so each route's status and JSON shape (field names and value types, not values)
//! is compared with `tests/golden/control_shapes.json`. Regenerate with
//! `UPDATE_GOLDEN=1 cargo test -p paddock-e2b --test control` and review the diff. Also: every
//! E2B path paddock does not serve answers in E2B's error shape (an integer `code`), never in
//! `/v1`'s.

use std::collections::BTreeMap;
use std::path::Path;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::any;
use axum::Router;
use http_body_util::BodyExt as _;
use paddock_control::{SandboxService, ServiceConfig};
use paddock_e2b::tokens::{TokenKey, KEY_BYTES};
use paddock_e2b::{front, E2bConfig};
use paddock_runtime::fake::FakeBackend;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use serde_json::{json, Value};
use tower::ServiceExt as _;

const V1_MARKER: &str = "the /v1 router";

struct Setup {
    router: Router,
    key: String,
}

async fn setup() -> Setup {
    let backend = FakeBackend::new().expect("fake backend");
    let store = Store::open_in_memory().expect("store");
    let service = SandboxService::start(ServiceConfig::default(), AnyBackend::Fake(backend), store)
        .await
        .expect("service");
    service.recovered().await;
    let admin = service
        .bootstrap_admin_key()
        .await
        .expect("bootstrap")
        .expect("a key");
    let admin = service.authenticate(&admin.key).await.expect("admin");
    let created = service
        .create_key(
            &admin,
            serde_json::from_value(json!({"tenant": "t"})).expect("request"),
        )
        .await
        .expect("key");
    let config = E2bConfig {
        token_key: TokenKey::new([5; KEY_BYTES]),
        domain: Some("sandbox.test".into()),
        internet_access: false,
    };
    let v1 = Router::new().fallback(any(|| async { V1_MARKER }));
    Setup {
        router: front(service, v1, config),
        key: created.e2b_key.clone().expect("an E2B spelling"),
    }
}

impl Setup {
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        key: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1:3000");
        if let Some(k) = key {
            req = req.header("x-api-key", k);
        }
        let body = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Body::from(b.to_string())
            }
            None => Body::empty(),
        };
        let resp = self
            .router
            .clone()
            .oneshot(req.body(body).expect("request"))
            .await
            .expect("answer");
        let status = resp.status();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, value)
    }

    async fn keyed(&self, method: &str, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let key = self.key.clone();
        self.call(method, path, body, Some(&key)).await
    }
}

/// A JSON value with every leaf replaced by its type's name; an array by its first element's shape.
fn shape(v: &Value) -> Value {
    match v {
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(_) => json!("number"),
        Value::String(_) => json!("string"),
        Value::Array(a) => Value::Array(a.first().map(shape).into_iter().collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
    }
}

/// E2B's error shape: `{code: <the status as an integer>, message: <non-empty>}`.
fn assert_e2b_error(what: &str, status: StatusCode, body: &Value) {
    assert_eq!(
        body["code"].as_u64(),
        Some(u64::from(status.as_u16())),
        "{what}: {body}"
    );
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{what}: {body}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn every_route_answers_the_golden_shape() {
    let s = setup().await;
    let mut shapes = BTreeMap::new();
    fn record(shapes: &mut BTreeMap<String, Value>, name: &str, status: StatusCode, body: &Value) {
        shapes.insert(
            name.to_owned(),
            json!({"status": status.as_u16(), "shape": shape(body)}),
        );
    }

    let create = json!({
        "templateID": "base",
        "timeout": 300,
        "metadata": {"suite": "golden"},
        "envVars": {"A": "1"},
        "secure": true,
        "autoPause": false,
    });
    let (status, created) = s.keyed("POST", "/sandboxes", Some(create.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    record(&mut shapes, "POST /sandboxes", status, &created);
    let id = created["sandboxID"].as_str().expect("sandboxID").to_owned();
    let (status, body) = s.keyed("POST", "/v2/sandboxes", Some(create)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    record(&mut shapes, "POST /v2/sandboxes", status, &body);

    for (method, path, body) in [
        ("GET", format!("/sandboxes/{id}"), None),
        ("GET", "/sandboxes".to_owned(), None),
        (
            "GET",
            "/v2/sandboxes?state=running&metadata=suite%3Dgolden&limit=1".to_owned(),
            None,
        ),
        (
            "POST",
            format!("/sandboxes/{id}/connect"),
            Some(json!({"timeout": 300})),
        ),
        (
            "POST",
            format!("/sandboxes/{id}/timeout"),
            Some(json!({"timeout": 600})),
        ),
        ("GET", format!("/sandboxes/{id}/metrics"), None),
        ("POST", format!("/sandboxes/{id}/snapshots"), Some(json!({}))),
        ("GET", "/snapshots".to_owned(), None),
        ("GET", format!("/sandboxes/{id}/logs"), None),
        ("POST", format!("/sandboxes/{id}/pause"), None),
        (
            "POST",
            format!("/sandboxes/{id}/resume"),
            Some(json!({"timeout": 300})),
        ),
        ("DELETE", format!("/sandboxes/{id}"), None),
        ("GET", format!("/sandboxes/{id}"), None),
    ] {
        let path_name = path.replace(&id, "{id}");
        let path_name = path_name.split('?').next().unwrap_or_default().to_owned();
        let (status, answer) = s.keyed(method, &path, body).await;
        let name = format!("{method} {path_name}");
        // The second GET after the kill: a missing sandbox.
        let name = if shapes.contains_key(&name) {
            format!("{name} (killed)")
        } else {
            name
        };
        if status.is_client_error() || status.is_server_error() {
            assert_e2b_error(&name, status, &answer);
        }
        record(&mut shapes, &name, status, &answer);
    }

    // Refusals, each in E2B's shape.
    for (name, method, path, body, key) in [
        ("no key", "GET", "/sandboxes", None, None),
        (
            "a bad key",
            "GET",
            "/sandboxes",
            None,
            Some("e2b_".to_owned() + &"0".repeat(76)),
        ),
        (
            "a malformed body",
            "POST",
            "/sandboxes",
            Some(json!("not an object")),
            Some(s.key.clone()),
        ),
        (
            "an unknown template",
            "POST",
            "/sandboxes",
            Some(json!({"templateID": "no-such-template"})),
            Some(s.key.clone()),
        ),
        (
            "a missing sandbox",
            "GET",
            "/sandboxes/sb-00000000000000ff",
            None,
            Some(s.key.clone()),
        ),
        (
            "a malformed sandbox id",
            "GET",
            "/sandboxes/..%2F..",
            None,
            Some(s.key.clone()),
        ),
        ("a wrong method", "PATCH", "/sandboxes", None, Some(s.key.clone())),
    ] {
        let (status, answer) = s.call(method, path, body, key.as_deref()).await;
        assert!(status.is_client_error(), "{name}: {status} {answer}");
        assert_e2b_error(name, status, &answer);
        record(&mut shapes, name, status, &answer);
    }

    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/control_shapes.json");
    let mut actual = serde_json::to_string_pretty(&shapes).expect("serialize");
    actual.push('\n');
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &actual).expect("write the golden file");
        return;
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_else(|e| {
        panic!(
            "read {}: {e} (create it with UPDATE_GOLDEN=1 cargo test -p paddock-e2b --test control)",
            golden.display()
        )
    });
    let expected: Value = serde_json::from_str(&expected).expect("golden JSON");
    let actual: Value = serde_json::from_str(&actual).expect("actual JSON");
    if expected != actual {
        let (e, a) = (
            expected.as_object().expect("object"),
            actual.as_object().expect("object"),
        );
        let differing: Vec<_> = e
            .keys()
            .chain(a.keys())
            .filter(|k| e.get(*k) != a.get(*k))
            .collect();
        panic!(
            "E2B's control-plane answers differ from {} for {differing:?}: golden {:#} actual {:#}. If the \
             change is intended, regenerate with UPDATE_GOLDEN=1 and review the diff.",
            golden.display(),
            json!(differing.iter().map(|k| e.get(*k)).collect::<Vec<_>>()),
            json!(differing.iter().map(|k| a.get(*k)).collect::<Vec<_>>()),
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn e2b_paths_paddock_does_not_serve_answer_in_e2b_shape() {
    let s = setup().await;
    for (method, path) in [
        ("GET", "/secrets"),
        ("POST", "/secrets/abc"),
        ("GET", "/volumes"),
        ("DELETE", "/volumes/abc"),
        ("POST", "/v3/templates"),
        ("POST", "/v2/templates/abc/builds/def"),
        ("GET", "/templates/aliases/base"),
        ("GET", "/teams"),
        ("GET", "/sandboxes/sb-00000000000000ff/nope"),
    ] {
        let (status, body) = s.keyed(method, path, None).await;
        assert!(
            status == StatusCode::NOT_FOUND || status == StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {status} {body}"
        );
        assert_e2b_error(&format!("{method} {path}"), status, &body);
    }
    // Everything else is /v1's (and paths merely starting like an E2B one are not E2B's).
    for path in ["/v1/sandboxes", "/metrics", "/secretsx", "/sandboxesfoo", "/"] {
        let (status, body) = s.keyed("GET", path, None).await;
        assert_eq!((status, body), (StatusCode::OK, json!(V1_MARKER)), "{path}");
    }
}
