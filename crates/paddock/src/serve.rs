//! `paddock serve`: the control plane. One server per state directory (an exclusive `flock` on
//! `<state>/serve.lock`), the store and the native backend opened once, the service started (it re-adopts
//! the sandboxes a previous server left running), the first admin key written to `<state>/admin.key`,
//! then the HTTP API until SIGTERM or SIGINT. Sandboxes outlive the server: the next start re-adopts them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use paddock_control::SandboxService;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use tokio::signal::unix::{signal, SignalKind};

use crate::serve_config::{HttpSettings, ServeConfig, API_FD_OVERHEAD};

/// Below this many descriptors beyond the API's reserve, the server warns at start.
const MIN_SANDBOX_FDS: u64 = 1024;

/// How long open streams (exec output, WebSockets) get to finish after a shutdown signal.
const STREAM_GRACE: Duration = Duration::from_secs(5);

/// Runs the server until SIGTERM/SIGINT.
pub fn serve(config: &ServeConfig) -> anyhow::Result<ExitCode> {
    if !rustix::process::geteuid().is_root() {
        anyhow::bail!(
            "paddock serve must run as root (it maps sandbox users to an unprivileged uid range, manages \
             cgroups and the storage pool)"
        );
    }
    let (_lock, store, backend) = open_state(config)?;
    let rt = service_runtime("paddock-serve")?;
    let result = rt.block_on(serve_async(config, backend, store));
    // Blocking tasks (store calls, reads of streams) must not hold the exit up.
    rt.shutdown_timeout(Duration::from_secs(1));
    result.map(|()| ExitCode::SUCCESS)
}

/// How long an idle blocking thread (store calls, backend work) waits for work before it exits.
/// Tokio wakes its idle blocking threads oldest first, so a steady trickle of blocking calls (the
/// reaper's two store reads a second, an execution's polls) keeps `rate × keep-alive` of them
/// alive. With tokio's 10 s, a server that had a burst of load kept about twenty idle threads for
/// good; with 2 s it keeps a few, and a burst still finds its threads warm.
const BLOCKING_KEEP_ALIVE: Duration = Duration::from_secs(2);

/// The multi-threaded runtime a sandbox service (`serve`, `mcp --local`) runs on.
pub(crate) fn service_runtime(name: &str) -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(name)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()
        .context("failed to start the async runtime")
}

/// What a service on this host needs, opened once: the state directory's lock (held until the
/// returned file is dropped, so no server or `paddock mcp --local` shares it), the store and the
/// native backend. Raises the descriptor limit first.
pub(crate) fn open_state(config: &ServeConfig) -> anyhow::Result<(File, Store, AnyBackend)> {
    let lock = lock_state_dir(&config.state_dir)?;
    raise_fd_limit(&config.http);
    let store = Store::open(&config.database_path())
        .with_context(|| format!("failed to open the database {}", config.database_path().display()))?;
    let backend = config.runtime_config().open_backend(false)?;
    Ok((lock, store, AnyBackend::Native(backend)))
}

/// Starts the service as the configuration describes (it re-adopts the sandboxes a previous run
/// left), and the builds of the templates the configuration names, in the background.
pub(crate) async fn start_service(
    config: &ServeConfig,
    backend: AnyBackend,
    store: Store,
) -> anyhow::Result<SandboxService> {
    let mut service_config = config.service_config()?;
    service_config.network = config.network_config()?;
    let service = SandboxService::start(service_config, backend, store)
        .await
        .context("failed to start the sandbox service")?;
    service.ensure_configured_templates();
    crate::serve_webhook::start(&service, &config.approvals)?;
    if config.executions.backend == crate::serve_config::ExecutionBackend::KubernetesJob {
        // Refuse to serve rather than run approved executions somewhere other than configured.
        let executor = paddock_kube::KubernetesJobExecutor::connect(config.executions.kubernetes.clone())
            .await
            .context("executions.backend is kubernetes-job, but no cluster is configured (KUBECONFIG or in-cluster)")?;
        service.set_executor(std::sync::Arc::new(executor));
    }
    Ok(service)
}

async fn serve_async(config: &ServeConfig, backend: AnyBackend, store: Store) -> anyhow::Result<()> {
    // Installed before anything slow, so that a signal during startup still shuts down cleanly.
    let mut term = signal(SignalKind::terminate()).context("failed to install a signal handler")?;
    let mut int = signal(SignalKind::interrupt()).context("failed to install a signal handler")?;
    let service = start_service(config, backend, store).await?;
    match serve_http(config, &service, &mut term, &mut int).await {
        Ok(()) => {
            service.shutdown().await;
            tracing::info!("stopped; sandboxes keep running and are re-adopted on the next start");
            Ok(())
        }
        Err(e) => {
            service.shutdown().await;
            Err(e)
        }
    }
}

async fn serve_http(
    config: &ServeConfig,
    service: &SandboxService,
    term: &mut tokio::signal::unix::Signal,
    int: &mut tokio::signal::unix::Signal,
) -> anyhow::Result<()> {
    if let Some(key) = service
        .bootstrap_admin_key()
        .await
        .context("failed to create the first admin key")?
    {
        let path = config.admin_key_path();
        write_secret(&path, &key.key)?;
        eprintln!("paddock: admin API key written to {}", path.display());
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("failed to listen on {}", config.listen))?;
    let addr = listener
        .local_addr()
        .context("failed to read the bound address")?;
    let mut v1 = paddock_api::router(service.clone());
    if config.mcp.enabled {
        v1 = v1.merge(crate::serve_mcp::router(service.clone(), config, addr));
    }
    let app = if config.e2b.enabled {
        let e2b = paddock_e2b::E2bConfig {
            token_key: e2b_token_key(&config.e2b_key_path())?,
            domain: config.e2b.domain.clone(),
            internet_access: config.e2b.internet_access,
        };
        paddock_e2b::front(service.clone(), v1, e2b)
    } else {
        v1
    };
    let tls = tls_acceptor(&config.http)?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let http = config.http.clone();
    let mut server = tokio::spawn(async move {
        crate::serve_http::serve_api(listener, app, &http, tls, async {
            let _ = stop_rx.await;
        })
        .await;
    });
    eprintln!("paddock: listening on {scheme}://{addr}");
    tracing::info!(%addr, "listening");
    // Sandboxes from before the restart are recovered while the API serves (those not yet recovered
    // answer `sandbox_recovering`); this line says when every one is done.
    let recovered = service.clone();
    tokio::spawn(async move {
        recovered.recovered().await;
        eprintln!("paddock: recovery done");
    });
    let signal_name = tokio::select! {
        result = &mut server => {
            // The accept loop only ends on shutdown; a panic is the only other way out.
            return match result {
                Ok(()) => Ok(()),
                Err(e) => Err(anyhow::Error::new(e).context("the HTTP server task failed")),
            };
        }
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(signal = signal_name, "shutting down: no new connections");
    let _ = stop_tx.send(());
    match tokio::time::timeout(STREAM_GRACE, &mut server).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(error = %e, "the HTTP server task failed while shutting down"),
        Err(_) => {
            tracing::warn!(
                grace_secs = STREAM_GRACE.as_secs(),
                "streams still open after the grace period; closing them"
            );
            server.abort();
        }
    }
    Ok(())
}

/// Takes the exclusive lock that makes this the only server on the state directory; held until the
/// returned file is dropped (or the process dies).
fn lock_state_dir(state: &Path) -> anyhow::Result<File> {
    use rustix::fs::{flock, FlockOperation};
    std::fs::create_dir_all(state)
        .with_context(|| format!("failed to create the state directory {}", state.display()))?;
    // The backend only takes over (and re-permissions) a directory that is new, empty or marked as
    // paddock's; the lock file must not make a new directory look foreign, so mark it first.
    let marker = state.join(".paddock-state");
    if !marker.exists() {
        let mut entries = std::fs::read_dir(state)
            .with_context(|| format!("failed to read the state directory {}", state.display()))?;
        if entries.next().is_some() {
            anyhow::bail!(
                "state directory {} is not empty and was not created by paddock; choose a new or empty directory",
                state.display()
            );
        }
        std::fs::write(&marker, "paddock state directory\n")
            .with_context(|| format!("failed to write {}", marker.display()))?;
    }
    let path = state.join("serve.lock");
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("failed to open {}", path.display()))?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            let holder = holder.trim();
            let by = if holder.is_empty() {
                String::new()
            } else {
                format!(" (pid {holder})")
            };
            anyhow::bail!(
                "another paddock serve or paddock mcp --local{by} is already running on state directory {}",
                state.display()
            );
        }
        Err(e) => {
            return Err(std::io::Error::from(e)).with_context(|| format!("failed to lock {}", path.display()))
        }
    }
    file.set_len(0)
        .and_then(|()| writeln!(file, "{}", std::process::id()))
        .with_context(|| format!("failed to write {}", path.display()))?;
    Ok(file)
}

/// Raises the soft limit on open files to the hard limit, and says so: every live sandbox holds a few
/// descriptors (its agent connection, its lock, pidfds), the egress proxy one or two per connection,
/// and the API one per connection. The API's reserve is `[http] max_connections` plus
/// [`API_FD_OVERHEAD`]; sandboxes and the egress proxy are budgeted against what is left
/// (ARCHITECTURE.md, "Descriptor budget"), and a limit that leaves them little is warned about.
fn raise_fd_limit(http: &HttpSettings) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let limit = getrlimit(Resource::Nofile);
    let mut current = limit.current;
    if limit.current != limit.maximum {
        let raised = rustix::process::Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                current = limit.maximum;
                tracing::info!(
                    from = limit
                        .current
                        .map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
                    to = limit
                        .maximum
                        .map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
                    "raised the open-file limit (RLIMIT_NOFILE) to its hard limit"
                );
            }
            Err(e) => tracing::warn!(error = %e, "failed to raise the open-file limit"),
        }
    }
    let reserve = http.api_fd_reserve();
    let Some(n) = current else { return };
    let rest = n.saturating_sub(reserve);
    if rest < MIN_SANDBOX_FDS {
        tracing::warn!(
            limit = n,
            api_reserve = reserve,
            "the open-file limit leaves fewer than {MIN_SANDBOX_FDS} descriptors beyond the API's reserve \
             ([http] max_connections + {API_FD_OVERHEAD}) for sandboxes and the egress proxy: raise the \
             hard limit (LimitNOFILE=) or lower max_connections"
        );
    } else {
        tracing::info!(
            limit = n,
            api_reserve = reserve,
            sandboxes_and_egress = rest,
            "open-file budget"
        );
    }
}

/// Writes a secret to `path`, mode 0600, replacing any previous file atomically (a temporary file in
/// the same directory, then a rename), so the file is never readable by others, not even briefly.
/// The listener's TLS configuration from `[http] tls_cert` and `tls_key` (PEM), offering HTTP/1.1
/// only; `None` for plain HTTP.
fn tls_acceptor(
    http: &crate::serve_config::HttpSettings,
) -> anyhow::Result<Option<tokio_rustls::TlsAcceptor>> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (Some(cert), Some(key)) = (&http.tls_cert, &http.tls_key) else {
        return Ok(None);
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("failed to read the certificate chain {}", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("{} holds no PEM certificate", cert.display());
    }
    let key_der = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("failed to read the private key {}", key.display()))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .with_context(|| {
            format!(
                "the key {} does not fit the certificate {}",
                key.display(),
                cert.display()
            )
        })?;
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server))))
}

/// The E2B token key at `path`, made (32 random bytes, hex, mode 0600) when there is none. Replacing
/// the file revokes every sandbox's access tokens at the next start.
fn e2b_token_key(path: &Path) -> anyhow::Result<paddock_e2b::tokens::TokenKey> {
    use std::io::Read as _;
    const N: usize = paddock_e2b::tokens::KEY_BYTES;
    let parse = |text: &str| -> Option<[u8; N]> {
        let mut key = [0u8; N];
        hex::decode_to_slice(text.trim(), &mut key).ok()?;
        Some(key)
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let key = parse(&text).with_context(|| {
                format!(
                    "{} does not hold {N} bytes of hex; remove it to make a new key",
                    path.display()
                )
            })?;
            return Ok(paddock_e2b::tokens::TokenKey::new(key));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(anyhow::Error::new(e).context(format!("failed to read {}", path.display()))),
    }
    let mut key = [0u8; N];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .context("failed to read /dev/urandom")?;
    write_secret(path, &hex::encode(key))?;
    Ok(paddock_e2b::tokens::TokenKey::new(key))
}

fn write_secret(path: &Path, secret: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("key.tmp");
    let _ = std::fs::remove_file(&tmp);
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(secret.as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow::Error::new(e).context(format!("failed to write the key file {}", path.display()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_is_private_and_replaced() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.key");
        std::fs::write(&path, "old\n").expect("write");
        write_secret(&path, "pdk_new").expect("writes");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "pdk_new\n");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!dir.path().join("admin.key.tmp").exists());
    }

    #[test]
    fn second_lock_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let held = lock_state_dir(&state).expect("first lock");
        let e = lock_state_dir(&state).expect_err("second lock refused");
        let msg = e.to_string();
        assert!(msg.contains("already running"), "{msg}");
        assert!(msg.contains(&std::process::id().to_string()), "{msg}");
        drop(held);
        lock_state_dir(&state).expect("lock again once released");
    }

    #[test]
    fn foreign_state_dir_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("something"), "x").expect("write");
        let e = lock_state_dir(dir.path()).expect_err("refused");
        assert!(e.to_string().contains("not created by paddock"), "{e}");
        assert!(!dir.path().join("serve.lock").exists());
    }
}
