//! The egress proxy's asker: a connection from a sandbox to a name its allowlist does not cover,
//! which the sandbox's approval policy says to `ask` about, waits (bounded by `[approvals] wait`)
//! as a pending approval of kind `network`; only a person's approval lets that one connection go.
//! The approval is the sandbox's tenant's, asked by the sandbox itself (`sandbox:<id>`), so any of
//! the tenant's approvers may decide it.
//!
//! What it does not do: widen the allowlist (an approval lets one connection through), or ask
//! when the policy says allow or deny (the allowlist alone decides those: refused).

use std::sync::Weak;

use paddock_egress::NetworkAsker;
use paddock_policy::{Action, Verdict};
use paddock_types::api::ApprovalKind;
use paddock_types::{DomainName, SandboxId};

use super::Asked;
use crate::core::service::Inner;
use crate::{Principal, SandboxService};

/// The asker the egress proxy holds (weakly: the service holds the proxy).
#[derive(Debug)]
pub(crate) struct NetworkAsk(pub(crate) Weak<Inner>);

impl NetworkAsker for NetworkAsk {
    fn ask<'a>(
        &'a self,
        sandbox: &'a SandboxId,
        host: &'a DomainName,
        port: u16,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let Some(inner) = self.0.upgrade() else {
                return false;
            };
            SandboxService { inner }
                .ask_network(sandbox, host.as_str(), port)
                .await
        })
    }
}

impl SandboxService {
    /// Whether a person approved sandbox `id`'s connection to `host`:`port` (held until then, or
    /// until the wait ends: `false`).
    async fn ask_network(&self, id: &SandboxId, host: &str, port: u16) -> bool {
        let Some(tenant) = self.live_sandbox(id).and_then(|sb| sb.tenant()) else {
            return false;
        };
        let action = Action::Network { host, port };
        let asks = match self.effective_policy(&tenant, Some(id.as_str())).await {
            Ok(Some(effective)) => paddock_policy::decide(&effective.policy, &action).verdict == Verdict::Ask,
            _ => false,
        };
        if !asks {
            return false;
        }
        let p = Principal {
            tenant,
            key_id: format!("sandbox:{id}"),
            admin: false,
            change_network: false,
            approver: false,
        };
        let asked = || Asked {
            kind: ApprovalKind::Network,
            summary: format!("connect {host}:{port}"),
            request: serde_json::json!({"host": host, "port": port}),
        };
        match self
            .gate(&p, Some(id.as_str()), &[action], asked, None, None)
            .await
        {
            Ok(gated) => gated.approval_id.is_some(),
            Err(e) => {
                tracing::debug!(sandbox_id = %id, error = %e, "a held connection was not approved");
                false
            }
        }
    }
}
