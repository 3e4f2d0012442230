//! A sandbox the service holds: its backend handle, its agent connection, who owns it and the
//! defaults its processes get.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use paddock_egress::SecretName;
use paddock_runtime::agent_client::AgentClient;
use paddock_runtime::SandboxHandle;
use paddock_types::{Limits, NetworkLink, SandboxId, VolumeMount};
use serde::{Deserialize, Serialize};

/// What the store keeps of a sandbox's request (`spec_json`), enough to rebuild a [`LiveSandbox`]
/// after a restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StoredSpec {
    pub(crate) template: String,
    /// The image template it is made from (`tp-...`), when `template` names one built through
    /// `/v1/templates` (the store finds its users by this field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) template_id: Option<String>,
    /// Its template's start command (resolved), run at every boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) start: Option<paddock_types::api::TemplateStart>,
    pub(crate) limits: Limits,
    #[serde(default)]
    pub(crate) env: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) workdir: Option<String>,
    pub(crate) user: String,
    #[serde(default)]
    pub(crate) on_timeout: paddock_types::api::OnTimeout,
    #[serde(default)]
    pub(crate) audit_exec_diff: bool,
    /// The timeout it was created with, restarted by a resume after a timeout paused or stopped it.
    #[serde(default)]
    pub(crate) timeout_ms: Option<i64>,
    /// Named volumes it mounts (also recorded in the store's `volume_mounts`).
    #[serde(default)]
    pub(crate) volumes: Vec<VolumeMount>,
    /// It has a network (its policy, secrets and CA are in the store's `sandbox_networks`).
    #[serde(default)]
    pub(crate) network: bool,
    /// Its ports are served without credentials on the E2B sandbox door.
    #[serde(default)]
    pub(crate) public_ports: bool,
}

/// Who owns a live sandbox and how its processes start.
#[derive(Debug, Clone)]
pub(crate) struct Ownership {
    /// `None` while it waits in a warm pool.
    pub(crate) tenant: Option<String>,
    pub(crate) spec: StoredSpec,
}

/// Bytes written to a process's stdin so far (for its exit audit row).
#[derive(Debug, Default)]
pub(crate) struct ProcessCounters {
    pub(crate) bytes_in: u64,
}

#[derive(Debug)]
pub(crate) struct LiveSandbox {
    pub(crate) id: SandboxId,
    pub(crate) client: AgentClient,
    /// Taken when the sandbox is destroyed. Shared with backend work on it (`on_handle`), which holds
    /// the lock until the backend returns.
    pub(crate) handle: Arc<tokio::sync::Mutex<Option<SandboxHandle>>>,
    pub(crate) owner: Mutex<Ownership>,
    pub(crate) processes: Mutex<HashMap<u32, ProcessCounters>>,
    /// Its code contexts (kernels).
    pub(crate) contexts: crate::core::contexts::Contexts,
    /// Every process frozen: the agent does not answer until it is resumed.
    paused: AtomicBool,
    /// Being rolled back: its agent restarts, so a closed connection is not a death.
    restarting: AtomicBool,
}

impl LiveSandbox {
    pub(crate) fn new(id: SandboxId, client: AgentClient, handle: SandboxHandle, owner: Ownership) -> Self {
        Self {
            id,
            client,
            handle: Arc::new(tokio::sync::Mutex::new(Some(handle))),
            owner: Mutex::new(owner),
            processes: Mutex::new(HashMap::new()),
            contexts: tokio::sync::Mutex::new(Vec::new()),
            paused: AtomicBool::new(false),
            restarting: AtomicBool::new(false),
        }
    }

    pub(crate) fn is_restarting(&self) -> bool {
        self.restarting.load(Ordering::SeqCst)
    }

    pub(crate) fn set_restarting(&self, restarting: bool) {
        self.restarting.store(restarting, Ordering::SeqCst);
    }

    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::SeqCst);
    }

    /// A new connection to the agent, for a stream that must not stall the shared one (replays,
    /// tar transfers, watches).
    pub(crate) async fn own_connection(&self) -> Result<AgentClient, crate::ServiceError> {
        let socket = {
            let guard = self.handle.lock().await;
            guard
                .as_ref()
                .map(|h| h.agent_socket.clone())
                .ok_or_else(|| crate::ServiceError::sandbox_ending(&self.id))?
        };
        AgentClient::connect(&socket)
            .await
            .map_err(|e| crate::core::error::process_error("connect to the agent", 0, e))
    }

    pub(crate) fn tenant(&self) -> Option<String> {
        lock(&self.owner).tenant.clone()
    }

    pub(crate) fn spec(&self) -> StoredSpec {
        lock(&self.owner).spec.clone()
    }

    pub(crate) fn is_warm(&self) -> bool {
        lock(&self.owner).tenant.is_none()
    }

    pub(crate) fn add_bytes_in(&self, pid: u32, n: u64) {
        lock(&self.processes).entry(pid).or_default().bytes_in += n;
    }

    pub(crate) fn take_counters(&self, pid: u32) -> ProcessCounters {
        lock(&self.processes).remove(&pid).unwrap_or_default()
    }
}

/// A networked sandbox being served on the egress proxy: what its processes' environment is made of.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub(crate) link: NetworkLink,
    /// Names of the secrets it injects (as recorded; checked to be valid names when recorded).
    pub(crate) secrets: Vec<SecretName>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section only edits maps; a panic inside one leaves them consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
