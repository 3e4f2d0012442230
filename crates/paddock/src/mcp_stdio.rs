//! `paddock mcp`: MCP (Model Context Protocol) on stdin/stdout, for an agent that starts paddock as
//! its tool server (Claude Desktop, an IDE, a custom loop). Two modes:
//!
//! - relay (the default): the client's messages go to a running server's `/mcp` (`PADDOCK_URL`,
//!   authenticated with `PADDOCK_API_KEY`), so the tools, tenancy, limits and audit are the
//!   server's;
//! - `--local`: the sandbox service runs in this process on this host's state directory (root, no
//!   `paddock serve` on it), for one user, tenant [`LOCAL_TENANT`]. The client's sandboxes are
//!   removed when it disconnects, unless `--keep-sandboxes`.
//!
//! What it does not do: write anything but protocol messages to stdout (diagnostics go to stderr),
//! listen on any port, or outlive stdin (it stops when the client closes it, or on SIGTERM/SIGINT).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use paddock_control::{Principal, SandboxService};
use paddock_mcp::{McpSettings, PaddockMcp};
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use paddock_types::api::ListSandboxesQuery;
use tokio::signal::unix::{signal, SignalKind};

use crate::client::ApiClient;
use crate::serve_config::ServeConfig;

/// The tenant of `paddock mcp --local`'s sandboxes.
pub const LOCAL_TENANT: &str = "local";
/// The name of the key `--local` acts with.
pub const LOCAL_KEY_NAME: &str = "paddock mcp --local";

/// Relays stdin/stdout to `client`'s server's `/mcp` until the client closes stdin.
pub fn relay(client: &ApiClient) -> anyhow::Result<ExitCode> {
    // An `https://` server: rustls with the same provider as the rest of paddock.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = client.url(&["mcp"]);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    let result = rt.block_on(async {
        let mut term = signal(SignalKind::terminate()).context("failed to install a signal handler")?;
        tokio::select! {
            relayed = paddock_mcp::stdio::relay(url.as_str(), client.key()) => relayed.map_err(anyhow::Error::new),
            _ = term.recv() => Ok(()),
        }
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    result.map(|()| ExitCode::SUCCESS)
}

/// Serves MCP on stdin/stdout from a service embedded in this process.
pub fn local(config: &ServeConfig, keep_sandboxes: bool) -> anyhow::Result<ExitCode> {
    if !rustix::process::geteuid().is_root() {
        anyhow::bail!(
            "paddock mcp --local must run as root (it runs the sandbox service on this host); without \
             --local it relays to a server (PADDOCK_URL, PADDOCK_API_KEY)"
        );
    }
    let (_lock, store, backend) = crate::serve::open_state(config)?;
    let rt = crate::serve::service_runtime("paddock-mcp")?;
    let result = rt.block_on(local_async(config, backend, store, keep_sandboxes));
    rt.shutdown_timeout(Duration::from_secs(1));
    result.map(|()| ExitCode::SUCCESS)
}

async fn local_async(
    config: &ServeConfig,
    backend: AnyBackend,
    store: Store,
    keep_sandboxes: bool,
) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("failed to install a signal handler")?;
    let mut int = signal(SignalKind::interrupt()).context("failed to install a signal handler")?;
    let principal = local_principal(&store)?;
    let service = crate::serve::start_service(config, backend, store).await?;
    service.recovered().await;
    // No HTTP here: no URL for a port to hand out.
    let server = PaddockMcp::new(service.clone(), principal.clone(), McpSettings::default());
    let served = tokio::select! {
        served = paddock_mcp::stdio::serve(server) => served.map_err(anyhow::Error::new),
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    };
    if !keep_sandboxes {
        remove_sandboxes(&service, &principal).await;
    }
    service.shutdown().await;
    served
}

/// The caller of `--local`: tenant [`LOCAL_TENANT`] through its key [`LOCAL_KEY_NAME`], made on
/// the first run (the key's text is never shown: nothing but this process acts with it), so audit
/// rows name a key and the tenant exists like any other.
fn local_principal(store: &Store) -> anyhow::Result<Principal> {
    let keys = store
        .list_api_keys(Some(LOCAL_TENANT))
        .context("failed to read the local tenant's keys")?;
    let record = match keys
        .into_iter()
        .find(|k| k.name == LOCAL_KEY_NAME && !k.is_revoked())
    {
        Some(record) => record,
        None => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            store
                .create_api_key(LOCAL_TENANT, LOCAL_KEY_NAME, false, now)
                .context("failed to make the local tenant's key")?
                .0
        }
    };
    Ok(Principal {
        tenant: record.tenant,
        key_id: record.id,
        admin: false,
        change_network: record.change_network,
        approver: record.approver,
    })
}

/// Removes the local tenant's sandboxes (the client that made them is gone).
async fn remove_sandboxes(service: &SandboxService, principal: &Principal) {
    let listed = match service
        .list_sandboxes(principal, ListSandboxesQuery::default())
        .await
    {
        Ok(listed) => listed,
        Err(e) => {
            tracing::warn!(error = %e.message, "cannot list the session's sandboxes to remove them");
            return;
        }
    };
    for sandbox in listed.sandboxes {
        let Ok(id) = sandbox.id.parse() else { continue };
        if let Err(e) = service.kill_sandbox(principal, &id).await {
            tracing::warn!(sandbox = %sandbox.id, error = %e.message, "cannot remove a sandbox");
        }
    }
}
