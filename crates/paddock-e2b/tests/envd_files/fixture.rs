//! A front-end over a service on the fake backend, two tenants, and helpers to build envd requests
//! (routing headers, multipart and gzip bodies) and read envd's answers.

use std::io::{Read as _, Write as _};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use paddock_control::{Principal, SandboxService, ServiceConfig};
use paddock_e2b::tokens::{TokenKey, TokenKind};
use paddock_e2b::E2bConfig;
use paddock_runtime::fake::FakeBackend;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use paddock_types::api::CreateKeyRequest;
use paddock_types::{ByteSize, Limits, SandboxId};
use serde_json::Value;
use tower::ServiceExt as _;

/// How long any one request may take.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The front-end and what is behind it.
pub struct Env {
    pub app: Router,
    pub service: SandboxService,
    pub key: TokenKey,
    pub admin: Principal,
    pub a: Principal,
    pub b: Principal,
}

impl Env {
    pub async fn start() -> Self {
        let backend = FakeBackend::new().expect("the fake backend starts");
        let store = Store::open_in_memory().expect("an in-memory store");
        let config = ServiceConfig {
            max_limits: Limits {
                memory: Some(ByteSize::gib(4)),
                cpus: None,
                pids: Some(4096),
                disk: Some(ByteSize::gib(10)),
            },
            ..ServiceConfig::default()
        };
        let service = SandboxService::start(config, AnyBackend::Fake(backend), store)
            .await
            .expect("the service starts");
        tokio::time::timeout(DEADLINE, service.recovered())
            .await
            .expect("recovery finishes");
        let admin_key = service
            .bootstrap_admin_key()
            .await
            .expect("bootstrap")
            .expect("a fresh store makes an admin key");
        let admin = service
            .authenticate(&admin_key.key)
            .await
            .expect("the admin key works");
        let key = TokenKey::new([42; paddock_e2b::tokens::KEY_BYTES]);
        let app = paddock_e2b::front(
            service.clone(),
            Router::new(),
            E2bConfig {
                token_key: key.clone(),
                domain: None,
                internet_access: false,
            },
        );
        let mut env = Self {
            app,
            service,
            key,
            a: admin.clone(),
            b: admin.clone(),
            admin,
        };
        env.a = env.tenant("tenant-a").await;
        env.b = env.tenant("tenant-b").await;
        env
    }

    async fn tenant(&self, tenant: &str) -> Principal {
        let key = self
            .service
            .create_key(
                &self.admin,
                CreateKeyRequest {
                    tenant: tenant.into(),
                    name: None,
                    admin: false,
                    change_network: true,
                    approver: false,
                },
            )
            .await
            .expect("create a key");
        self.service.authenticate(&key.key).await.expect("the key works")
    }

    /// A running sandbox of `p`'s tenant, from a `/v1` create body.
    pub async fn sandbox(&self, p: &Principal, request: Value) -> SandboxId {
        let request = serde_json::from_value(request).expect("a create request");
        let info = self
            .service
            .create_sandbox(p, request)
            .await
            .expect("the sandbox is created");
        info.id.parse().expect("a sandbox id")
    }

    /// The sandbox's envd access token.
    pub fn token(&self, id: &SandboxId) -> String {
        self.key.token(TokenKind::Envd, id)
    }

    /// Sends a request through the front-end and reads the whole answer.
    pub async fn send(&self, req: Request<Body>) -> Reply {
        let resp = tokio::time::timeout(DEADLINE, self.app.clone().oneshot(req))
            .await
            .expect("answered in time")
            .expect("the router never fails");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = tokio::time::timeout(DEADLINE, resp.into_body().collect())
            .await
            .expect("the body in time")
            .expect("a body")
            .to_bytes();
        Reply {
            status,
            headers,
            body,
        }
    }

    /// A file's bytes, read through the service (not through envd).
    pub async fn file(&self, p: &Principal, id: &SandboxId, path: &str) -> Vec<u8> {
        use futures_util::StreamExt as _;
        let mut download = self
            .service
            .read_file(p, id, path)
            .await
            .expect("the file exists");
        let mut out = Vec::new();
        while let Some(chunk) = download.stream.next().await {
            out.extend_from_slice(&chunk.expect("readable"));
        }
        out
    }

    /// Owner uid of a path.
    pub async fn uid(&self, p: &Principal, id: &SandboxId, path: &str) -> u32 {
        self.service.stat_file(p, id, path).await.expect("stat").uid
    }
}

/// An answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: not JSON: {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// envd's error: the status, also the body's `code`, and the body's `message`.
    pub fn error(&self) -> (StatusCode, String) {
        let body = self.json();
        assert_eq!(
            body["code"].as_u64(),
            Some(u64::from(self.status.as_u16())),
            "{body}"
        );
        (
            self.status,
            body["message"].as_str().expect("a message").to_owned(),
        )
    }
}

/// A request to envd in sandbox `id`, routed as the SDKs route it.
pub fn envd(id: &SandboxId, method: Method, uri: &str) -> axum::http::request::Builder {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "127.0.0.1:3000")
        .header("e2b-sandbox-id", id.as_str())
        .header("e2b-sandbox-port", "49983")
}

/// `?k=v&...` with the values percent-encoded.
pub fn query(pairs: &[(&str, &str)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        q.append_pair(k, v);
    }
    format!("?{}", q.finish())
}

/// The multipart boundary the tests use.
pub const BOUNDARY: &str = "paddock-test-boundary";

/// The Content-Type of a multipart body built by [`multipart`].
pub fn multipart_type() -> String {
    format!("multipart/form-data; boundary={BOUNDARY}")
}

/// A `multipart/form-data` body: (field name, file name, data) per part.
pub fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, file_name, data) in parts {
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        let mut disposition = format!("Content-Disposition: form-data; name=\"{name}\"");
        if let Some(f) = file_name {
            disposition.push_str(&format!("; filename=\"{f}\""));
        }
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(b"\r\nContent-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    body
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).expect("compress");
    encoder.finish().expect("compress")
}

pub fn gunzip(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(data)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}
