//! Connections to a sandbox's own TCP ports, for front-ends that proxy HTTP, WebSockets or raw TCP
//! to a server running inside it (E2B's `<port>-<id>.<domain>`, `/v1/sandboxes/{id}/ports/...`,
//! `paddock sandbox port-forward`).
//!
//! Each connection is checked like every operation (the caller's tenant, the sandbox running and
//! not paused), counts against the caps of `core/ports.rs` while it is open, and is audited as
//! `sandbox.port_connect` with repeats folded (`core/audit/ports.rs`). The backend makes the socket
//! in the sandbox's network namespace; the connect happens here, with a timeout, holding neither
//! the handle's lock nor a blocking thread.

use paddock_runtime::RuntimeError;
use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;

use crate::core::audit::ports::{Admit, PortKey};
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::lock;
use crate::core::ports::PortStream;
use crate::core::time::now_ms;
use crate::{Principal, SandboxService, ServiceError};

/// The front-end a connection to a sandbox's port came through (named in its audit rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortDoor {
    /// E2B's sandbox door (`<port>-<id>.<domain>` or the `E2b-Sandbox-*` headers).
    E2b,
    /// paddock's own API (`/v1/sandboxes/{id}/ports/...`, the CLI's port forwarding).
    Api,
}

impl PortDoor {
    fn as_str(self) -> &'static str {
        match self {
            PortDoor::E2b => "e2b",
            PortDoor::Api => "v1",
        }
    }
}

impl SandboxService {
    /// A connection to TCP port `port` of sandbox `id` (what a process in it serves on its
    /// loopback), as `p`. `port_closed` when nothing listens there; `quota_exceeded` (field
    /// `port_connections`) when the sandbox or the tenant holds its most open connections.
    #[tracing::instrument(skip_all, fields(sandbox_id = %id, port))]
    pub async fn connect_port(
        &self,
        p: &Principal,
        id: &SandboxId,
        port: u16,
        door: PortDoor,
    ) -> Result<PortStream, ServiceError> {
        if port == 0 {
            return Err(ServiceError::invalid("port", "port 0 is no port"));
        }
        let sb = self.owned_live(p, id).await?;
        let limits = &self.inner.config.ports;
        let place = self.inner.port_gate.enter(limits, id, &p.tenant)?;
        let opened = self
            .on_handle(&sb, "open a sandbox port", move |backend, handle| {
                backend.open_port(handle, port)
            })
            .await?
            .ok_or_else(|| ServiceError::sandbox_ending(id))?;
        let socket = opened.map_err(|e| match e {
            RuntimeError::Unsupported(message) => ServiceError::new(ErrorCode::Unsupported, message),
            other => {
                // The init has exited (its pidfd answers ESRCH): the sandbox is ending.
                tracing::debug!(error = %other, "no socket in the sandbox's network namespace");
                ServiceError::sandbox_ending(id)
            }
        })?;
        let stream = match tokio::time::timeout(limits.connect_timeout, socket.connect()).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                return Err(port_closed(id, port));
            }
            Ok(Err(e)) => {
                return Err(ServiceError::new(
                    ErrorCode::Unavailable,
                    format!("cannot connect to port {port} of sandbox {id}: {e}"),
                ))
            }
            Err(_) => {
                return Err(ServiceError::new(
                    ErrorCode::Timeout,
                    format!(
                        "port {port} of sandbox {id} accepted no connection within {} s",
                        limits.connect_timeout.as_secs()
                    ),
                ))
            }
        };
        let key = PortKey {
            sandbox: id.to_string(),
            tenant: p.tenant.clone(),
            key_id: Some(p.key_id.clone()).filter(|k| !k.is_empty()),
            port,
            door: door.as_str(),
        };
        let mut due = Vec::new();
        let admit = lock(&self.inner.port_audit).observe(&key, now_ms(), &mut due);
        if !due.is_empty() {
            self.db("write port audit rows", move |s| {
                s.append_audit_batch(&due).map(|_| ())
            })
            .await?;
        }
        if admit == Admit::Row {
            let row = AuditEntry::ok(p, AuditAction::SandboxPortConnect, Some(id.as_str())).detail(
                audit::PortConnected {
                    port,
                    door: door.as_str().to_owned(),
                    count: 1,
                    first_ms: None,
                    last_ms: None,
                },
            );
            if let Err(e) = self.audit(row).await {
                lock(&self.inner.port_audit).forget(&key);
                return Err(e);
            }
        }
        Ok(PortStream::new(stream, place))
    }
}

fn port_closed(id: &SandboxId, port: u16) -> ServiceError {
    ServiceError::new(
        ErrorCode::PortClosed,
        format!("sandbox {id} is running but nothing listens on its port {port}"),
    )
}
