//! Sandbox networks: the egress proxy's owner. A sandbox created with a `network` policy (or
//! secrets) gets a link to the host from the backend; this module serves it on the egress proxy
//! (listeners on the link's host address, the sandbox's CA, its policy and secret values), writes the
//! proxy's records to the audit log, and changes policies and secrets live.
//!
//! What lives where: the policy, secret names and CA of each networked sandbox in the store's
//! `sandbox_networks` (so a restarted server serves it under the same CA); secret values in
//! `secrets`, read only here and handed to the proxy; the link itself is the backend's.

use paddock_egress::SandboxCaKey;
use paddock_store::{AuditFilter, SandboxNetworkRecord};
use paddock_types::api::{NetworkEvent, SandboxNetworkInfo, SetNetworkRequest};
use paddock_types::SandboxId;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::lock;
use crate::core::principal::Permission;
use crate::core::time::{now_ms, rfc3339};
use crate::plan::network::{decode_policy, secret_names, NetworkPlan};
use crate::{Principal, SandboxService, ServiceError};

/// How many recent connections `GET /v1/sandboxes/{id}/network` shows.
const RECENT_EVENTS: u32 = 50;

impl SandboxService {
    /// The store row of a new networked sandbox: its plan and a fresh CA.
    pub(crate) fn network_record(
        id: &SandboxId,
        plan: &NetworkPlan,
    ) -> Result<SandboxNetworkRecord, ServiceError> {
        let ca = SandboxCaKey::generate(id).map_err(|e| ServiceError::internal("make a sandbox CA", &e))?;
        Ok(SandboxNetworkRecord {
            sandbox_id: id.to_string(),
            policy: serde_json::to_value(&plan.policy)
                .map_err(|e| ServiceError::internal("encode a network policy", &e))?,
            secrets: plan.secrets.clone(),
            ca_cert_pem: ca.cert_pem().to_owned(),
            ca_key_pem: ca.key_pem().to_owned(),
            updated_at_ms: now_ms(),
        })
    }

    /// `GET /v1/sandboxes/{id}/network`.
    pub async fn get_network(
        &self,
        p: &Principal,
        id: &SandboxId,
    ) -> Result<SandboxNetworkInfo, ServiceError> {
        self.owned_record(p, id).await?;
        let row = self.network_row(id).await?;
        self.network_info(id, row).await
    }

    /// What `GET` and `PUT /v1/sandboxes/{id}/network` answer: `row` and the newest events.
    async fn network_info(
        &self,
        id: &str,
        row: SandboxNetworkRecord,
    ) -> Result<SandboxNetworkInfo, ServiceError> {
        let filter = AuditFilter {
            sandbox_id: Some(id.to_owned()),
            action: Some(AuditAction::NetworkConnection.area().into()),
            limit: RECENT_EVENTS,
            newest_first: true,
            ..Default::default()
        };
        let rows = self
            .db("read the audit log", move |s| s.query_audit(&filter))
            .await?;
        let link = lock(&self.inner.served).get(id).map(|s| s.link);
        let ports = self.egress_ports();
        Ok(SandboxNetworkInfo {
            sandbox_id: id.to_owned(),
            policy: decode_policy(&row)?,
            secrets: row.secrets,
            proxy_url: link.map(|l| l.proxy_url(&ports)),
            sandbox_ip: link.map(|l| l.sandbox_ip.to_string()),
            recent: rows
                .into_iter()
                .map(|r| NetworkEvent {
                    kind: r
                        .action
                        .trim_start_matches(AuditAction::NetworkConnection.area())
                        .to_owned(),
                    at: rfc3339(r.ts_ms),
                    allowed: r.outcome == "allowed",
                    detail: r.detail,
                })
                .collect(),
        })
    }

    /// `PUT /v1/sandboxes/{id}/network`: a new policy and/or secret list, recorded and applied to new
    /// connections at once. Only for a key that may change networks (`Principal::change_network`).
    /// A policy with an allow rule the operator's deny list makes useless is refused, as at create.
    pub async fn set_network(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: SetNetworkRequest,
    ) -> Result<SandboxNetworkInfo, ServiceError> {
        p.require(Permission::ChangeNetwork, "changing a sandbox's network")?;
        self.owned_record(p, id).await?;
        let mut row = self.network_row(id).await?;
        // Every check before the one write: a refused request changes nothing.
        if let Some(policy) = &req.policy {
            self.check_reachable(policy, "policy")?;
        }
        if let Some(names) = req.secrets {
            row.secrets = self.check_secret_names(p, names).await?;
        }
        if let Some(policy) = &req.policy {
            row.policy = serde_json::to_value(policy)
                .map_err(|e| ServiceError::internal("encode a network policy", &e))?;
        }
        row.updated_at_ms = now_ms();
        let entry = AuditEntry::ok(p, AuditAction::NetworkPolicy, Some(id))
            .detail(audit::NetworkPolicySet {
                policy: row.policy.clone(),
                secrets: row.secrets.clone(),
            })
            .into_row();
        let stored = row.clone();
        self.db("record a network policy", move |s| {
            s.transaction(|tx| {
                tx.put_sandbox_network(&stored)?;
                audit::append(tx, &entry)?;
                Ok::<_, paddock_store::StoreError>(())
            })
        })
        .await?;
        // A sandbox not served right now (stopped) gets the new state from the store when it resumes.
        let served = lock(&self.inner.served).contains_key(id.as_str());
        if served {
            self.egress()?
                .set_policy(id, decode_policy(&row)?)
                .map_err(|e| ServiceError::internal("change a sandbox's egress policy", &e))?;
            let secrets = secret_names(&row.secrets)?;
            self.push_secrets(id, Some(&p.tenant), &secrets).await?;
            if let Some(s) = lock(&self.inner.served).get_mut(id.as_str()) {
                s.secrets = secrets;
            }
        }
        self.network_info(id, row).await
    }
}
