//! The front-end's configuration and the state its handlers share.

use std::sync::Arc;

use paddock_control::SandboxService;

use crate::tokens::TokenKey;

/// How the E2B front-end is set up (`[e2b]` in the server's configuration).
#[derive(Debug, Clone)]
pub struct E2bConfig {
    /// The key the sandboxes' access tokens are derived from.
    pub token_key: TokenKey,
    /// The domain of per-sandbox hosts (`<port>-<id>.<domain>`), also returned to the SDKs as the
    /// sandbox's `domain`; `None` routes sandbox traffic by the `E2b-Sandbox-*` headers only.
    pub domain: Option<String>,
    /// What `allow_internet_access: true` (E2B's default, sent by older SDKs on every create) means:
    /// with `false` (paddock's default) it gives no network, and only explicit `network.allowOut`
    /// entries open egress; with `true` it allows every public destination the operator's deny list
    /// leaves open, as E2B does.
    pub internet_access: bool,
}

/// What every handler of the front-end has.
#[derive(Clone)]
pub struct E2bState {
    /// The one service.
    pub service: SandboxService,
    /// The configuration.
    pub config: Arc<E2bConfig>,
    /// Idle connections to sandboxes' ports, kept per (sandbox, port, credential kind).
    pub ports_pool: paddock_proxy::Pool<crate::ports::PoolKey>,
}

impl E2bState {
    /// The state of a front-end serving `service` as `config` says.
    pub fn new(service: SandboxService, config: E2bConfig) -> Self {
        Self {
            service,
            config: Arc::new(config),
            ports_pool: paddock_proxy::Pool::new(paddock_proxy::PoolLimits::default()),
        }
    }
}

impl std::fmt::Debug for E2bState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bState")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
