//! The API in-process against a real service: a [`SandboxService`] over the native backend and a SQLite
//! store in this test's own state directory, started on a multi-threaded tokio runtime and served by
//! axum on `127.0.0.1:0`, plus a reqwest client per API key.
//!
//! Teardown (also when the test panics): every sandbox of every key the harness handed out is killed
//! through the API, the server and the service stop, the runtime shuts down, whatever is left (warm
//! pool sandboxes, which no tenant owns) is reclaimed by the backend's gc, and, unless the test is
//! already failing, [`TestEnv::assert_clean`] checks nothing was left behind.

mod client;

pub use client::{poll, Client, Lines, Reply, WsStream};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paddock_control::{SandboxService, ServiceConfig, TemplateConfig};
use paddock_runtime::native::NativeBackend;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use paddock_types::{Limits, RootfsSpec};

use super::TestEnv;

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
    /// Template builds from images (the pull directory defaults to `<state>/pulls`).
    pub images: paddock_control::ImagesConfig,
    /// More configured templates than `default` (built ones are built at start).
    pub templates: Vec<(String, TemplateConfig)>,
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
            images: paddock_control::ImagesConfig::default(),
            templates: Vec::new(),
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
            // Every template's pool: warm sandboxes are reclaimed at teardown, not killed through the API.
            warm_pool: options.warm_pool
                + options
                    .templates
                    .iter()
                    .map(|(_, t)| t.warm_pool_size)
                    .sum::<u32>(),
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
                image: None,
                recipe: None,
                debian: None,
                kernels: Vec::new(),
                build: Default::default(),
            },
        );
        templates.extend(options.templates.clone());
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
            images: paddock_control::ImagesConfig {
                pull_dir: Some(
                    options
                        .images
                        .pull_dir
                        .clone()
                        .unwrap_or_else(|| h.env().state().join("pulls")),
                ),
                ..options.images
            },
            ..ServiceConfig::default()
        };
        let service = rt.block_on(async {
            SandboxService::start(config, AnyBackend::Native(backend), store)
                .await
                .expect("the service starts")
        });
        rt.block_on(async { service.ensure_configured_templates() });
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

/// Sandbox networks with nothing reachable: for tests whose sandboxes only need a link (its
/// proxy, CA and variables), not an outside world.
pub fn unreachable_network() -> paddock_control::NetworkConfig {
    paddock_control::NetworkConfig {
        ports: paddock_types::EgressPorts::default(),
        egress: paddock_egress::EgressConfig {
            operator: paddock_egress::policy::OperatorPolicy {
                host_addresses: paddock_egress::host_addresses().expect("host addresses"),
                ..Default::default()
            },
            system_resolver: false,
            public_roots: false,
            ..Default::default()
        },
        conntrack: Default::default(),
    }
}
