//! A client of the in-process service's API with one key (or none), its answers, NDJSON streams,
//! WebSockets, and polling with a deadline.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use reqwest::Method;
use serde_json::{json, Value};

/// How long one plain (non-streaming) request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// An HTTP client acting with one API key (or none).
#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
    pub key: Option<String>,
    /// The key's id, when this harness created it.
    pub key_id: Option<String>,
    /// Every key handed out by [`Client::new_tenant`], for teardown.
    pub(super) registry: Arc<Mutex<Vec<String>>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// A complete (non-streamed) answer.
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Bytes,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = String::from_utf8_lossy(&self.body);
        let shown: String = text.chars().take(2000).collect();
        write!(f, "{} {} {shown}", self.status, self.content_type)
    }
}

impl Reply {
    /// The body as JSON (panics, showing it, if it is not).
    #[track_caller]
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }

    /// The error code of an error body (empty if there is none).
    pub fn code(&self) -> String {
        serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|v| v["code"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts the status and returns the body as JSON (or `null` for an empty body).
    #[track_caller]
    pub fn ok(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "unexpected answer: {self:?}");
        if self.body.is_empty() {
            Value::Null
        } else {
            self.json()
        }
    }

    /// Asserts an error answer: status and code. Returns the body.
    #[track_caller]
    pub fn err(&self, status: u16, code: &str) -> Value {
        assert_eq!(
            (self.status, self.code().as_str()),
            (status, code),
            "unexpected answer: {self:?}"
        );
        self.json()
    }
}

impl Client {
    /// A request with this client's key.
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let rb = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(key) => rb.bearer_auth(key),
            None => rb,
        }
    }

    /// Sends a request and reads the whole answer.
    pub async fn send(rb: reqwest::RequestBuilder) -> Reply {
        let response = rb
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .expect("the request is answered");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let body = response.bytes().await.expect("the answer's body");
        Reply {
            status,
            content_type,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        Self::send(self.request(Method::GET, path)).await
    }

    pub async fn get_q(&self, path: &str, query: &[(&str, &str)]) -> Reply {
        Self::send(self.request(Method::GET, path).query(query)).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Reply {
        Self::send(self.request(Method::POST, path).json(&body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Reply {
        Self::send(self.request(Method::PUT, path).json(&body)).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        Self::send(self.request(Method::DELETE, path)).await
    }

    pub async fn delete_q(&self, path: &str, query: &[(&str, &str)]) -> Reply {
        Self::send(self.request(Method::DELETE, path).query(query)).await
    }

    /// A new key for `tenant` (admin only), registered for teardown.
    pub async fn new_tenant(&self, tenant: &str) -> Client {
        self.new_tenant_with(tenant, json!({})).await
    }

    /// [`Self::new_tenant`] with a key made with `permissions` too (`{"approver": true}`).
    pub async fn new_tenant_with(&self, tenant: &str, permissions: Value) -> Client {
        let mut request = json!({"tenant": tenant, "name": format!("{tenant} key")});
        for (k, v) in permissions.as_object().expect("permissions are an object") {
            request[k] = v.clone();
        }
        let created = self.post("/v1/keys", request).await.ok(201);
        let key = created["key"].as_str().expect("key").to_owned();
        self.registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(key.clone());
        Client {
            key: Some(key),
            key_id: created["id"].as_str().map(str::to_owned),
            ..self.clone()
        }
    }

    /// Creates a sandbox; returns its id.
    #[track_caller]
    pub fn create_sandbox(&self, body: Value) -> impl std::future::Future<Output = String> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            let r = self.post("/v1/sandboxes", body).await;
            assert_eq!(r.status, 201, "create at {caller}: {r:?}");
            let info = r.json();
            assert_eq!(info["state"], "running", "{info}");
            info["id"].as_str().expect("id").to_owned()
        }
    }

    /// Runs `req` in the foreground and returns the collected result (`Accept: application/json`).
    pub async fn exec_json(&self, id: &str, req: Value) -> Value {
        let r = Self::send(
            self.request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
                .header("accept", "application/json")
                .json(&req),
        )
        .await;
        r.ok(200)
    }

    /// Runs a shell script; asserts it exits 0 and returns its stdout.
    #[track_caller]
    pub fn sh<'a>(&'a self, id: &'a str, script: &'a str) -> impl std::future::Future<Output = String> + 'a {
        let caller = std::panic::Location::caller();
        async move {
            let result = self.exec_json(id, json!({"shell": script})).await;
            assert_eq!(
                result["exit"]["exit_code"], 0,
                "script at {caller} failed: {script}\n{result:#}"
            );
            result["stdout"].as_str().unwrap_or_default().to_owned()
        }
    }

    /// Starts `req` in the foreground and returns the streaming answer.
    pub async fn exec_stream(&self, id: &str, req: Value, accept: &str) -> reqwest::Response {
        self.request(Method::POST, &format!("/v1/sandboxes/{id}/exec"))
            .header("accept", accept)
            .json(&req)
            .send()
            .await
            .expect("exec is answered")
    }

    /// Starts `req` in the background; returns its pid.
    pub async fn exec_background(&self, id: &str, mut req: Value) -> u32 {
        req["background"] = json!(true);
        let r = self.post(&format!("/v1/sandboxes/{id}/exec"), req).await;
        let v = r.ok(202);
        v["pid"].as_u64().expect("pid") as u32
    }

    pub async fn write_file(&self, id: &str, path: &str, data: impl Into<reqwest::Body>) -> Reply {
        Self::send(
            self.request(Method::PUT, &format!("/v1/sandboxes/{id}/files"))
                .query(&[("path", path)])
                .body(data),
        )
        .await
    }

    pub async fn read_file(&self, id: &str, path: &str) -> Reply {
        self.get_q(&format!("/v1/sandboxes/{id}/files"), &[("path", path)])
            .await
    }

    /// Every audit row this key may see matching `query`, paging through.
    pub async fn audit_rows(&self, query: &[(&str, &str)]) -> Vec<Value> {
        let mut rows = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let mut q: Vec<(&str, &str)> = query.to_vec();
            q.push(("limit", "1000"));
            if let Some(a) = &after {
                q.push(("after_seq", a));
            }
            let page = self.get_q("/v1/audit", &q).await.ok(200);
            rows.extend(page["records"].as_array().expect("records").iter().cloned());
            match page["next_after_seq"].as_u64() {
                Some(next) => after = Some(next.to_string()),
                None => return rows,
            }
        }
    }

    /// Kills every running sandbox of every registered key (and the admin's).
    pub(super) async fn kill_every_sandbox(&self) {
        let mut keys: Vec<String> = self
            .registry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        keys.extend(self.key.clone());
        for key in keys {
            let client = Client {
                key: Some(key),
                ..self.clone()
            };
            let Ok(response) = client
                .request(Method::GET, "/v1/sandboxes?limit=1000&state=all")
                .timeout(REQUEST_TIMEOUT)
                .send()
                .await
            else {
                continue;
            };
            let Ok(list) = response.json::<Value>().await else {
                continue;
            };
            for sb in list["sandboxes"].as_array().into_iter().flatten() {
                if let Some(id) = sb["id"].as_str() {
                    let _ = client
                        .request(Method::DELETE, &format!("/v1/sandboxes/{id}"))
                        .timeout(REQUEST_TIMEOUT)
                        .send()
                        .await;
                }
            }
        }
    }

    /// The WebSocket URL of `path`.
    pub fn ws_url(&self, path: &str) -> String {
        format!("{}{path}", self.base.replacen("http://", "ws://", 1))
    }

    /// Opens a WebSocket; `Err((status, body))` when the server answers the handshake with an HTTP
    /// error instead.
    pub async fn ws(&self, path: &str) -> Result<WsStream, (u16, Value)> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let mut request = self
            .ws_url(path)
            .into_client_request()
            .expect("a WebSocket request");
        if let Some(key) = &self.key {
            request.headers_mut().insert(
                "authorization",
                format!("Bearer {key}").parse().expect("header value"),
            );
        }
        match tokio_tungstenite::connect_async(request).await {
            Ok((stream, _)) => Ok(stream),
            Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
                let status = response.status().as_u16();
                let body = response
                    .body()
                    .as_deref()
                    .and_then(|b| serde_json::from_slice(b).ok())
                    .unwrap_or(Value::Null);
                Err((status, body))
            }
            Err(e) => panic!("WebSocket connection to {path} failed: {e}"),
        }
    }
}

pub type WsStream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Reads an NDJSON (or any newline-delimited) stream one JSON value at a time.
pub struct Lines {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl Lines {
    pub fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            buf: Vec::new(),
        }
    }

    /// The next value; `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let line = &line[..line.len() - 1];
                return Some(
                    serde_json::from_slice(line).unwrap_or_else(|e| {
                        panic!("not a JSON line ({e}): {}", String::from_utf8_lossy(line))
                    }),
                );
            }
            match self.response.chunk().await {
                Ok(Some(chunk)) => self.buf.extend_from_slice(&chunk),
                Ok(None) => {
                    assert!(
                        self.buf.is_empty(),
                        "stream ended inside a line: {}",
                        String::from_utf8_lossy(&self.buf)
                    );
                    return None;
                }
                Err(e) => panic!("the stream broke: {e}"),
            }
        }
    }

    /// The next value within `limit` (panics on a timeout).
    #[track_caller]
    pub fn next_within(&mut self, limit: Duration) -> impl std::future::Future<Output = Option<Value>> + '_ {
        let caller = std::panic::Location::caller();
        async move {
            tokio::time::timeout(limit, self.next())
                .await
                .unwrap_or_else(|_| panic!("no stream event within {limit:?} (at {caller})"))
        }
    }

    /// Every remaining value, within `limit`.
    pub async fn rest(mut self, limit: Duration) -> Vec<Value> {
        let mut out = Vec::new();
        let collect = async {
            while let Some(v) = self.next().await {
                out.push(v);
            }
        };
        tokio::time::timeout(limit, collect)
            .await
            .unwrap_or_else(|_| panic!("the stream did not end within {limit:?}"));
        out
    }
}

/// Waits (polling every 50 ms) until `cond` returns `Some`, or panics after `limit` saying `what`.
pub async fn poll<T, F, Fut>(limit: Duration, what: &str, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
