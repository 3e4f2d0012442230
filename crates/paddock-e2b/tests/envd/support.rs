//! The fixture: the E2B front-end over a `SandboxService` on the fake backend, sandboxes of two
//! tenants, and clients for envd's Connect calls (unary, server streams read envelope by
//! envelope, client streams) driven through `tower::ServiceExt::oneshot`.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt as _;
use paddock_control::{Principal, SandboxService, ServiceConfig};
use paddock_e2b::tokens::{TokenKey, TokenKind};
use paddock_e2b::E2bConfig;
use paddock_runtime::fake::FakeBackend;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use paddock_types::api::CreateKeyRequest;
use paddock_types::SandboxId;
use serde_json::Value;
use tower::ServiceExt as _;

/// How long anything may take.
pub const DEADLINE: Duration = Duration::from_secs(15);

pub struct Env {
    pub router: Router,
    pub service: SandboxService,
    pub key: TokenKey,
    pub a: Principal,
    pub b: Principal,
    _backend: FakeBackend,
}

impl Env {
    pub async fn start() -> Self {
        let backend = FakeBackend::new().expect("the fake backend starts");
        let store = Store::open_in_memory().expect("an in-memory store");
        let service =
            SandboxService::start(ServiceConfig::default(), AnyBackend::Fake(backend.clone()), store)
                .await
                .expect("the service starts");
        service.recovered().await;
        let admin_key = service
            .bootstrap_admin_key()
            .await
            .expect("bootstrap")
            .expect("a fresh store makes an admin key");
        let admin = service.authenticate(&admin_key.key).await.expect("admin");
        let tenant = |name: &'static str| {
            let (service, admin) = (service.clone(), admin.clone());
            async move {
                let key = service
                    .create_key(
                        &admin,
                        CreateKeyRequest {
                            tenant: name.into(),
                            name: None,
                            admin: false,
                            change_network: true,
                            approver: false,
                        },
                    )
                    .await
                    .expect("a key");
                service.authenticate(&key.key).await.expect("the key works")
            }
        };
        let (a, b) = (tenant("tenant-a").await, tenant("tenant-b").await);
        let key = TokenKey::new([7; 32]);
        let config = E2bConfig {
            token_key: key.clone(),
            domain: None,
            internet_access: false,
        };
        let router = paddock_e2b::front(service.clone(), Router::new(), config);
        Self {
            router,
            service,
            key,
            a,
            b,
            _backend: backend,
        }
    }

    /// A new sandbox of `p`'s tenant.
    pub async fn sandbox(&self, p: &Principal) -> SandboxId {
        let info = self
            .service
            .create_sandbox(p, serde_json::from_value(serde_json::json!({})).expect("body"))
            .await
            .expect("created");
        info.id.parse().expect("an id")
    }

    pub fn token(&self, id: &SandboxId) -> String {
        self.key.token(TokenKind::Envd, id)
    }

    /// A request to envd of sandbox `id` with its token and `headers`.
    pub fn request(
        &self,
        id: &str,
        path: &str,
        content_type: &str,
        body: Body,
        headers: &[(&str, &str)],
    ) -> Request<Body> {
        let mut builder = Request::post(path)
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", "49983")
            .header("content-type", content_type);
        if let Ok(sid) = id.parse::<SandboxId>() {
            builder = builder.header("X-Access-Token", self.token(&sid));
        }
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(body).expect("a request")
    }

    pub async fn send(&self, req: Request<Body>) -> axum::response::Response {
        tokio::time::timeout(DEADLINE, self.router.clone().oneshot(req))
            .await
            .expect("answered in time")
            .expect("infallible")
    }

    /// A unary JSON call: status and JSON body.
    pub async fn unary(
        &self,
        id: &SandboxId,
        method: &str,
        body: Value,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let req = self.request(
            id.as_str(),
            method,
            "application/json",
            Body::from(body.to_string()),
            headers,
        );
        let resp = self.send(req).await;
        let status = resp.status();
        (status, json_body(resp).await)
    }

    /// A server-streaming JSON call, its response's envelopes read as they come.
    pub async fn stream(
        &self,
        id: &SandboxId,
        method: &str,
        body: Value,
        headers: &[(&str, &str)],
    ) -> Frames {
        let req = self.request(
            id.as_str(),
            method,
            "application/connect+json",
            Body::from(envelope(0, body.to_string().as_bytes())),
            headers,
        );
        let resp = self.send(req).await;
        assert_eq!(resp.status(), StatusCode::OK, "a stream answers 200");
        assert_eq!(
            resp.headers()["content-type"],
            "application/connect+json",
            "the stream's content type"
        );
        Frames {
            body: resp.into_body(),
            buf: BytesMut::new(),
        }
    }
}

pub async fn json_body(resp: axum::response::Response) -> Value {
    let bytes = tokio::time::timeout(DEADLINE, resp.into_body().collect())
        .await
        .expect("the body in time")
        .expect("a body")
        .to_bytes();
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
}

pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(payload.len() + 5);
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.into()
}

/// A response's envelopes, read one at a time.
pub struct Frames {
    body: Body,
    buf: BytesMut,
}

/// One envelope: its flags and JSON payload.
#[derive(Debug, Clone)]
pub struct Frame {
    pub flags: u8,
    pub json: Value,
}

impl Frame {
    pub fn is_end(&self) -> bool {
        self.flags & 0x02 != 0
    }

    /// `start`, `data`, `end` or `keepalive` (of `{"event": {...}}` or a watch message).
    pub fn kind(&self) -> String {
        let inner = self.json.get("event").unwrap_or(&self.json);
        inner
            .as_object()
            .and_then(|o| o.keys().next().cloned())
            .unwrap_or_default()
    }

    pub fn event(&self) -> &Value {
        let inner = self.json.get("event").unwrap_or(&self.json);
        &inner[self.kind()]
    }
}

impl Frames {
    /// The next envelope (`None` at the end of the body).
    pub async fn next(&mut self) -> Option<Frame> {
        tokio::time::timeout(DEADLINE, self.next_inner())
            .await
            .expect("the next envelope in time")
    }

    async fn next_inner(&mut self) -> Option<Frame> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if self.buf.len() >= 5 + len {
                    let flags = self.buf[0];
                    self.buf.advance(5);
                    let payload = self.buf.split_to(len);
                    let json = serde_json::from_slice(&payload).expect("a JSON payload");
                    return Some(Frame { flags, json });
                }
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => panic!("the body failed: {e}"),
                None => {
                    assert!(self.buf.is_empty(), "the body ended inside an envelope");
                    return None;
                }
            }
        }
    }

    /// Every envelope up to the end of the stream (asserting there is an end envelope, last).
    pub async fn all(mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        assert!(
            frames.last().is_some_and(Frame::is_end),
            "ends with an end-stream envelope: {frames:?}"
        );
        frames
    }

    /// Envelopes until the first one of `kind` (or the end), skipping keepalives; returns it.
    pub async fn until(&mut self, kind: &str) -> Frame {
        loop {
            let frame = self.next().await.expect("more envelopes");
            if frame.is_end() || frame.kind() == kind {
                return frame;
            }
        }
    }
}

/// The stdout of a finished stream's data events.
pub fn stdout_of(frames: &[Frame]) -> String {
    use base64::Engine as _;
    frames
        .iter()
        .filter(|f| f.kind() == "data")
        .filter_map(|f| f.event()["stdout"].as_str().or_else(|| f.event()["pty"].as_str()))
        .map(|b| {
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .expect("base64"),
            )
            .expect("utf-8")
        })
        .collect()
}

/// The end envelope's error code, if the stream ended with one.
pub fn end_error(frames: &[Frame]) -> Option<(String, String)> {
    let end = frames.last().filter(|f| f.is_end())?;
    let error = end.json.get("error")?;
    Some((
        error["code"].as_str().unwrap_or_default().to_owned(),
        error["message"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// `cmd` as E2B's SDK starts it.
pub fn start_body(cmd: &str) -> Value {
    serde_json::json!({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}, "stdin": false})
}

impl From<axum::response::Response> for Frames {
    fn from(resp: axum::response::Response) -> Self {
        Self {
            body: resp.into_body(),
            buf: BytesMut::new(),
        }
    }
}
