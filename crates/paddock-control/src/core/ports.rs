//! Connections to sandboxes' own ports: the caps every one counts against while it is open (its
//! sandbox's, its tenant's, the server's), and the stream a front-end gets, which carries its place.
//!
//! The counts live in one map behind a lock, entries removed when they reach zero, so memory is
//! bounded by the connections open. Nothing here connects or audits (`ops/ports.rs` does).

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::core::live::lock;
use crate::{PortsConfig, ServiceError};

/// Open connections by sandbox and by tenant, and in all.
#[derive(Debug, Default)]
pub(crate) struct PortGate {
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    sandboxes: HashMap<SandboxId, u32>,
    tenants: HashMap<String, u32>,
    server: u32,
}

/// One open connection's place in the counts, given back when dropped.
#[derive(Debug)]
pub(crate) struct PortPlace {
    gate: Arc<PortGate>,
    sandbox: SandboxId,
    tenant: String,
}

impl PortGate {
    /// A place for one more connection to `sandbox` of `tenant`, or the cap it would pass.
    pub(crate) fn enter(
        self: &Arc<Self>,
        limits: &PortsConfig,
        sandbox: &SandboxId,
        tenant: &str,
    ) -> Result<PortPlace, ServiceError> {
        let mut c = lock(&self.counts);
        let on_sandbox = c.sandboxes.get(sandbox).copied().unwrap_or(0);
        let on_tenant = c.tenants.get(tenant).copied().unwrap_or(0);
        if c.server >= limits.server {
            return Err(ServiceError::new(
                ErrorCode::Unavailable,
                format!(
                    "the server holds its most connections to sandbox ports ({}); retry later",
                    limits.server
                ),
            ));
        }
        if on_sandbox >= limits.per_sandbox || on_tenant >= limits.per_tenant {
            let (what, limit) = if on_sandbox >= limits.per_sandbox {
                ("port connections to the sandbox", limits.per_sandbox)
            } else {
                ("port connections to the tenant's sandboxes", limits.per_tenant)
            };
            let mut e = ServiceError::new(
                ErrorCode::QuotaExceeded,
                format!("at most {limit} open {what}; close some first"),
            );
            e.field = Some("port_connections".into());
            return Err(e);
        }
        c.server += 1;
        *c.sandboxes.entry(sandbox.clone()).or_insert(0) += 1;
        *c.tenants.entry(tenant.to_owned()).or_insert(0) += 1;
        Ok(PortPlace {
            gate: Arc::clone(self),
            sandbox: sandbox.clone(),
            tenant: tenant.to_owned(),
        })
    }

    /// Connections open now to `sandbox`'s ports.
    #[cfg(test)]
    pub(crate) fn open_to(&self, sandbox: &SandboxId) -> u32 {
        lock(&self.counts).sandboxes.get(sandbox).copied().unwrap_or(0)
    }
}

impl Drop for PortPlace {
    fn drop(&mut self) {
        let mut c = lock(&self.gate.counts);
        c.server = c.server.saturating_sub(1);
        if let Some(n) = c.sandboxes.get_mut(&self.sandbox) {
            *n -= 1;
            if *n == 0 {
                c.sandboxes.remove(&self.sandbox);
            }
        }
        if let Some(n) = c.tenants.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                c.tenants.remove(&self.tenant);
            }
        }
    }
}

/// A connection to a sandbox's port (see `SandboxService::connect_port`): a TCP stream that holds
/// its place under the caps until it is dropped.
#[derive(Debug)]
pub struct PortStream {
    stream: TcpStream,
    _place: PortPlace,
}

impl PortStream {
    pub(crate) fn new(stream: TcpStream, place: PortPlace) -> Self {
        Self {
            stream,
            _place: place,
        }
    }
}

impl AsyncRead for PortStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for PortStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_capped_per_sandbox_tenant_and_server_and_given_back() {
        let gate = Arc::new(PortGate::default());
        let limits = PortsConfig {
            per_sandbox: 2,
            per_tenant: 3,
            server: 4,
            ..PortsConfig::default()
        };
        let (a, b, c): (SandboxId, SandboxId, SandboxId) = (
            "sb-a".parse().expect("an id"),
            "sb-b".parse().expect("an id"),
            "sb-c".parse().expect("an id"),
        );
        let a1 = gate.enter(&limits, &a, "t1").expect("first");
        let _a2 = gate.enter(&limits, &a, "t1").expect("second");
        let e = gate.enter(&limits, &a, "t1").expect_err("sandbox cap");
        assert_eq!(e.code, ErrorCode::QuotaExceeded);
        let _b1 = gate.enter(&limits, &b, "t1").expect("another sandbox");
        assert_eq!(
            gate.enter(&limits, &b, "t1").expect_err("tenant cap").code,
            ErrorCode::QuotaExceeded
        );
        let _c1 = gate.enter(&limits, &c, "t2").expect("another tenant");
        assert_eq!(
            gate.enter(&limits, &c, "t2").expect_err("server cap").code,
            ErrorCode::Unavailable
        );
        drop(a1);
        assert_eq!(gate.open_to(&a), 1);
        gate.enter(&limits, &c, "t2").expect("a place was given back");
        assert_eq!(lock(&gate.counts).tenants.len(), 2);
    }
}
