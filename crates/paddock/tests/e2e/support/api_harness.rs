//! The API in-process against a real service: a [`SandboxService`] over the native backend and a SQLite
//! store in this test's own state directory, started on a multi-threaded tokio runtime and served by
//! axum on `127.0.0.1:0`, plus a reqwest client per API key.
//!
//! Teardown (also when the test panics): every sandbox of every key the harness handed out is killed
//! through the API, the server and the service stop, the runtime shuts down, whatever is left (warm
//! pool sandboxes, which no tenant owns) is reclaimed by the backend's gc, and, unless the test is
//! already failing, [`TestEnv::assert_clean`] checks nothing was left behind.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use paddock_control::{SandboxService, ServiceConfig, TemplateConfig};
use paddock_runtime::native::NativeBackend;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use paddock_types::{Limits, RootfsSpec};
use reqwest::Method;
use serde_json::{json, Value};

use crate::support::TestEnv;

/// How long one plain (non-streaming) request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long teardown may spend killing sandboxes through the API.
const KILL_DEADLINE: Duration = Duration::from_secs(120);

/// How the service under test is configured.
#[derive(Debug, Clone)]
pub struct Options {
    /// Warm pool size of the `default` template.
    pub warm_pool: u32,
    /// The most a sandbox may ask for; `None` fields are derived from the host, as `paddock serve`
    /// does when its configuration sets no maximum.
    pub max_limits: Limits,
    /// Every tenant's quota where its own sets nothing (unlimited by default here).
    pub quotas: paddock_store::TenantQuota,
    /// How often the reaper runs.
    pub reaper_interval: Duration,
    /// The largest snapshot archive an import accepts.
    pub max_import_bytes: u64,
    /// The egress proxy (sandbox networks); none by default.
    pub network: Option<paddock_control::NetworkConfig>,
    /// The egress proxy's audit rows: aggregation, rates, retention.
    pub network_audit: paddock_control::NetworkAuditConfig,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            warm_pool: 0,
            max_limits: Limits {
                memory: None,
                cpus: None,
                pids: None,
                disk: None,
            },
            quotas: paddock_store::TenantQuota::default(),
            reaper_interval: Duration::from_millis(250),
            max_import_bytes: ServiceConfig::default().max_import_bytes,
            network: None,
            network_audit: paddock_control::NetworkAuditConfig::default(),
        }
    }
}

/// A running service, its HTTP server and the admin client.
pub struct Harness {
    env: Option<TestEnv>,
    rt: Option<tokio::runtime::Runtime>,
    /// The service itself, for what has no API (running retention now); set until drop.
    pub service: Option<SandboxService>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
    warm_pool: u32,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// A client with the bootstrap admin key.
    pub admin: Client,
}

impl Harness {
    /// A service with default options (a failure when not root: [`TestEnv::new`]).
    #[track_caller]
    pub fn start() -> Self {
        Self::with(Options::default())
    }

    /// A service configured by `options` (a failure when not root: [`TestEnv::new`]).
    #[track_caller]
    pub fn with(options: Options) -> Self {
        let env = TestEnv::new();
        let http = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("http client");
        let mut h = Self {
            env: Some(env),
            rt: None,
            service: None,
            stop: None,
            server: None,
            warm_pool: options.warm_pool,
            base: String::new(),
            admin: Client {
                base: String::new(),
                http,
                key: None,
                key_id: None,
                registry: Arc::new(Mutex::new(Vec::new())),
            },
        };
        // The backend first: it only takes over a state directory that is new, empty or its own, and
        // the database file would make the fresh directory look foreign.
        let backend = NativeBackend::open(h.env().native_config()).expect("open the native backend");
        let store = Store::open(&h.env().state().join("paddock.db")).expect("open the store");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .thread_name("api-test")
            .build()
            .expect("tokio runtime");
        let mut templates = std::collections::BTreeMap::new();
        templates.insert(
            "default".to_owned(),
            TemplateConfig {
                rootfs: RootfsSpec::Host,
                warm_pool_size: options.warm_pool,
            },
        );
        // Bounded by this host as `paddock serve` bounds them: unset maxima derived, the built-in
        // defaults lowered to fit (a 10G default disk in the tests' 8G pool).
        let host = backend.host_facts().expect("read the host's figures");
        let derived = host.max_limits();
        let configured = options.max_limits;
        let max_limits = Limits {
            memory: configured.memory.or(derived.memory),
            cpus: configured.cpus.or(derived.cpus),
            pids: configured.pids.or(derived.pids),
            disk: configured.disk.or(derived.disk),
        };
        let config = ServiceConfig {
            default_limits: paddock_types::clamp_limits(&Limits::default(), &max_limits),
            max_limits,
            quotas: options.quotas,
            default_timeout: Duration::from_secs(900),
            templates,
            reaper_interval: options.reaper_interval,
            max_import_bytes: options.max_import_bytes,
            network: options.network,
            network_audit: options.network_audit,
            ..ServiceConfig::default()
        };
        let service = rt.block_on(async {
            SandboxService::start(config, AnyBackend::Native(backend), store)
                .await
                .expect("the service starts")
        });
        h.service = Some(service.clone());
        let (admin_key, listener) = rt.block_on(async {
            let key = service
                .bootstrap_admin_key()
                .await
                .expect("bootstrap the admin key")
                .expect("a fresh store mints an admin key");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind 127.0.0.1:0");
            (key, listener)
        });
        let addr = listener.local_addr().expect("bound address");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let app = paddock_api::router(service);
        let server = rt.spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stop_rx.await;
                })
                .await;
            if let Err(e) = served {
                eprintln!("the API server failed: {e}");
            }
        });
        h.rt = Some(rt);
        h.stop = Some(stop_tx);
        h.server = Some(server);
        h.base = format!("http://{addr}");
        h.admin.base = h.base.clone();
        h.admin.key = Some(admin_key.key);
        h.admin.key_id = Some(admin_key.id);
        h
    }

    pub fn env(&self) -> &TestEnv {
        self.env.as_ref().expect("the environment lives until drop")
    }

    /// Runs the test's async body on the service's runtime (the server runs on its workers).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt
            .as_ref()
            .expect("the runtime lives until drop")
            .block_on(f)
    }

    /// A client without a key.
    pub fn anonymous(&self) -> Client {
        Client {
            key: None,
            key_id: None,
            ..self.admin.clone()
        }
    }

    /// A client with an arbitrary key (not registered for teardown).
    pub fn with_key(&self, key: &str) -> Client {
        Client {
            key: Some(key.to_owned()),
            key_id: None,
            ..self.admin.clone()
        }
    }

    fn teardown(&mut self) {
        if let Some(rt) = self.rt.take() {
            let service = self.service.take();
            let admin = self.admin.clone();
            let stop = self.stop.take();
            let server = self.server.take();
            rt.block_on(async {
                if tokio::time::timeout(KILL_DEADLINE, admin.kill_every_sandbox())
                    .await
                    .is_err()
                {
                    eprintln!("teardown: killing the sandboxes through the API timed out");
                }
                if let Some(stop) = stop {
                    let _ = stop.send(());
                }
                if let Some(mut server) = server {
                    // Graceful shutdown waits for open streams; a test that leaked one must not hang.
                    if tokio::time::timeout(Duration::from_secs(5), &mut server)
                        .await
                        .is_err()
                    {
                        server.abort();
                    }
                }
                if let Some(service) = &service {
                    service.shutdown().await;
                }
            });
            drop(service);
            rt.shutdown_timeout(Duration::from_secs(10));
        }
        if let Some(env) = &self.env {
            let reclaimed = reclaim_leftovers(env);
            if self.warm_pool == 0 && !reclaimed.is_empty() && !std::thread::panicking() {
                panic!("sandboxes were left running after every tenant's were killed: {reclaimed:?}");
            }
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.teardown();
        if let Some(env) = self.env.take() {
            if !std::thread::panicking() {
                env.assert_clean();
            }
            drop(env);
        }
    }
}

/// Reclaims what the service left running (warm sandboxes belong to no tenant, so no API call can
/// kill them) and reaps their inits, which are this process's children.
fn reclaim_leftovers(env: &TestEnv) -> Vec<String> {
    let reclaimed = match NativeBackend::open(env.native_config()) {
        Ok(backend) => backend.collect_garbage_now().unwrap_or_else(|e| {
            eprintln!("teardown: gc failed: {e}");
            Vec::new()
        }),
        Err(e) => {
            eprintln!("teardown: cannot open the backend for gc: {e}");
            Vec::new()
        }
    };
    // Only this environment's processes are reaped: other tests may share this process (`cargo
    // test`), and their children are theirs to wait for.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = env.processes();
        for (pid, _) in &left {
            if let Some(pid) = rustix::process::Pid::from_raw(*pid) {
                let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::NOHANG);
            }
        }
        if left.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    reclaimed
}

/// An HTTP client acting with one API key (or none).
#[derive(Clone)]
pub struct Client {
    pub base: String,
    pub http: reqwest::Client,
    pub key: Option<String>,
    /// The key's id, when this harness created it.
    pub key_id: Option<String>,
    /// Every key handed out by [`Client::new_tenant`], for teardown.
    registry: Arc<Mutex<Vec<String>>>,
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
        let created = self
            .post(
                "/v1/keys",
                json!({"tenant": tenant, "name": format!("{tenant} key")}),
            )
            .await
            .ok(201);
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
    async fn kill_every_sandbox(&self) {
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
