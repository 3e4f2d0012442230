//! The shared fixture: a `SandboxService` on a `FakeBackend` and an in-memory store, an admin and
//! two tenants' principals (with real keys), and helpers to run commands, read the audit log and
//! wait (with a deadline) for what the service does in the background.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use paddock_control::{
    ExecOutput, ExecStream, OutputStream, Principal, SandboxService, ServiceConfig, ServiceError,
};
use paddock_runtime::fake::FakeBackend;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use paddock_types::api::{
    AuditQuery, AuditRecord, CreateKeyRequest, CreateSandboxRequest, ErrorCode, ExecRequest, ExitInfo,
    SandboxInfo,
};
use paddock_types::{ByteSize, Limits, SandboxId, SnapshotId};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// How long anything the service does in the background may take.
pub const DEADLINE: Duration = Duration::from_secs(15);

/// A service on a fake backend.
pub struct Fixture {
    pub service: SandboxService,
    pub backend: FakeBackend,
    pub admin: Principal,
    pub a: Principal,
    pub b: Principal,
}

/// The service configuration the tests use: the defaults, bounded maxima and a fast reaper.
pub fn test_config() -> ServiceConfig {
    ServiceConfig {
        default_limits: Limits::default(),
        max_limits: Limits {
            memory: Some(ByteSize::gib(4)),
            cpus: None,
            pids: Some(4096),
            disk: Some(ByteSize::gib(10)),
        },
        default_timeout: Duration::from_secs(900),
        reaper_interval: Duration::from_millis(50),
        ..ServiceConfig::default()
    }
}

impl Fixture {
    /// A fresh service with the test configuration.
    pub async fn start() -> Self {
        Self::with(|_| {}).await
    }

    /// A fresh service with the test configuration changed by `adjust`.
    pub async fn with(adjust: impl FnOnce(&mut ServiceConfig)) -> Self {
        let backend = FakeBackend::new().expect("the fake backend starts");
        let store = Store::open_in_memory().expect("an in-memory store");
        let mut config = test_config();
        adjust(&mut config);
        Self::on(backend, store, config).await
    }

    /// A service on `backend` and `store` (a restart hands the same ones to a new service).
    pub async fn on(backend: FakeBackend, store: Store, config: ServiceConfig) -> Self {
        let service = SandboxService::start(config, AnyBackend::Fake(backend.clone()), store)
            .await
            .expect("the service starts");
        tokio::time::timeout(DEADLINE, service.recovered())
            .await
            .expect("recovery finishes");
        let admin = match service.bootstrap_admin_key().await.expect("bootstrap") {
            Some(key) => service.authenticate(&key.key).await.expect("the admin key works"),
            None => Principal {
                tenant: paddock_control::ADMIN_TENANT.into(),
                key_id: String::new(),
                admin: true,
                change_network: true,
                approver: true,
            },
        };
        let mut fixture = Self {
            service,
            backend,
            a: admin.clone(),
            b: admin.clone(),
            admin,
        };
        fixture.a = fixture.tenant("tenant-a").await;
        fixture.b = fixture.tenant("tenant-b").await;
        fixture
    }

    /// A principal of `tenant`, through a real key the admin made.
    pub async fn tenant(&self, tenant: &str) -> Principal {
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

    /// Creates a sandbox from a JSON request body.
    pub async fn create(&self, p: &Principal, request: Value) -> Sandbox {
        let info = self
            .service
            .create_sandbox(p, body(request))
            .await
            .expect("the sandbox is created");
        Sandbox {
            id: sid(&info.id),
            info,
        }
    }

    /// Tries to create a sandbox from a JSON request body.
    pub async fn try_create(&self, p: &Principal, request: Value) -> Result<SandboxInfo, ServiceError> {
        let request: CreateSandboxRequest = body(request);
        self.service.create_sandbox(p, request).await
    }

    /// Runs a foreground process from a JSON request body and collects it.
    pub async fn exec(&self, p: &Principal, id: &SandboxId, request: Value) -> Result<Output, ServiceError> {
        let request: ExecRequest = body(request);
        let stream = self.service.exec(p, id, request).await?;
        Ok(collect(stream).await)
    }

    /// Runs a shell script that must succeed; its stdout.
    pub async fn sh(&self, p: &Principal, id: &SandboxId, script: &str) -> String {
        let out = self
            .exec(p, id, serde_json::json!({ "shell": script }))
            .await
            .expect("the command starts");
        assert_eq!(out.exit.map(|e| e.exit_code), Some(0), "{script}: {out:?}");
        out.stdout
    }

    /// Every audit row the admin sees with `filter` (all pages), oldest first.
    pub async fn audit(&self, filter: AuditQuery) -> Vec<AuditRecord> {
        let mut rows = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .service
                .query_audit(
                    &self.admin,
                    AuditQuery {
                        after_seq: after,
                        limit: Some(1000),
                        ..filter.clone()
                    },
                )
                .await
                .expect("read the audit log");
            rows.extend(page.records);
            match page.next_after_seq {
                Some(next) => after = Some(next),
                None => return rows,
            }
        }
    }

    /// The actions of the audit rows about sandbox `id`, in order.
    pub async fn actions(&self, id: &str) -> Vec<String> {
        self.audit(AuditQuery {
            sandbox: Some(id.into()),
            ..AuditQuery::default()
        })
        .await
        .into_iter()
        .map(|r| r.action)
        .collect()
    }

    /// [`Fixture::actions`] without `process.exit` rows (a process's monitor writes those whenever
    /// the process ends, so their place among other rows is not fixed).
    pub async fn actions_but_exits(&self, id: &str) -> Vec<String> {
        let mut actions = self.actions(id).await;
        actions.retain(|a| a != "process.exit");
        actions
    }

    /// The rows of `action` (a prefix, as the API filters).
    pub async fn rows(&self, action: &str) -> Vec<AuditRecord> {
        self.audit(AuditQuery {
            action: Some(action.into()),
            ..AuditQuery::default()
        })
        .await
    }

    /// Checks the audit chain, then stops the service.
    pub async fn finish(self) {
        let verdict = self
            .service
            .verify_audit(&self.admin)
            .await
            .expect("verify the audit log");
        assert!(verdict.ok, "the audit chain is broken: {verdict:?}");
        assert!(verdict.first_broken.is_none(), "{verdict:?}");
        self.service.shutdown().await;
    }
}

/// A request or body type from JSON (as the REST layer would parse it).
pub fn body<T: DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("a well-formed request body")
}

/// A request body stream of one chunk.
pub fn bytes_body(data: &[u8]) -> paddock_control::ByteStream {
    let chunk: Result<Bytes, std::io::Error> = Ok(Bytes::copy_from_slice(data));
    Box::pin(futures_util::stream::iter(vec![chunk]))
}

/// What a process printed, and how it ended.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub pid: u32,
    pub stdout: String,
    pub stderr: String,
    pub exit: Option<ExitInfo>,
    /// The stream's error event, if it ended with one.
    pub error: Option<(ErrorCode, String)>,
    /// Events in order, as kinds (`started`, `stdout`, `stderr`, `pty`, `exit`, `error`).
    pub kinds: Vec<&'static str>,
}

/// Reads a process's stream to its end.
pub async fn collect(mut stream: ExecStream) -> Output {
    let mut out = Output {
        pid: stream.pid(),
        ..Output::default()
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        let event = tokio::time::timeout(DEADLINE, stream.recv())
            .await
            .expect("the process's events come in time");
        let Some(event) = event else { break };
        match event {
            ExecOutput::Started { .. } => out.kinds.push("started"),
            ExecOutput::Output { stream, data, .. } => {
                let (kind, bytes) = match stream {
                    OutputStream::Stdout => ("stdout", &mut stdout),
                    OutputStream::Pty => ("pty", &mut stdout),
                    OutputStream::Stderr => ("stderr", &mut stderr),
                };
                out.kinds.push(kind);
                bytes.extend_from_slice(&data);
            }
            ExecOutput::Exit(info) => {
                out.kinds.push("exit");
                out.exit = Some(info);
            }
            ExecOutput::Error { code, message } => {
                out.kinds.push("error");
                out.error = Some((code, message));
            }
        }
    }
    out.stdout = String::from_utf8_lossy(&stdout).into_owned();
    out.stderr = String::from_utf8_lossy(&stderr).into_owned();
    out
}

/// Polls `check` until it answers `Some`, failing after [`DEADLINE`].
pub async fn poll<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The error's code, or a panic if the operation succeeded.
#[track_caller]
pub fn code<T>(result: Result<T, ServiceError>) -> ErrorCode {
    error(result).code
}

/// The error, or a panic if the operation succeeded.
#[track_caller]
pub fn error<T>(result: Result<T, ServiceError>) -> ServiceError {
    match result {
        Ok(_) => panic!("expected an error, the operation succeeded"),
        Err(e) => e,
    }
}

/// The id of a sandbox that never existed.
pub const NO_SUCH_SANDBOX: &str = "sb-00000000000000ff";

/// A sandbox the fixture created: its typed id (what the service's operations take) and its body.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub id: SandboxId,
    pub info: SandboxInfo,
}

impl std::ops::Deref for Sandbox {
    type Target = SandboxInfo;
    fn deref(&self) -> &SandboxInfo {
        &self.info
    }
}

/// A sandbox id from its text (as an API caller's path would carry it).
pub fn sid(id: &str) -> SandboxId {
    id.parse().expect("a well-formed sandbox id")
}

/// A snapshot id from its text.
pub fn snap_id(id: &str) -> SnapshotId {
    id.parse().expect("a well-formed snapshot id")
}
