//! Approval policies applied, and the queue of requests they hold for a person.
//!
//! - `policies.rs`: the effective policy of a sandbox (its own, else its tenant's), compiled once
//!   and cached until the API changes it.
//! - `gate.rs`: the one check every gated request makes ([`SandboxService::gate`]): allow, deny
//!   (`policy_denied`), or ask: a pending approval, then a bounded wait for a person, and only an
//!   explicit approval of this very request lets it run, once.
//! - here: the queue's change events (one broadcast channel: the waiting requests, the SSE stream
//!   and the webhook listen to it) and the wire form of an approval.
//!
//! What it does not do: serve the queue to people (`ops/approvals.rs` lists, approves and
//! rejects), deliver webhooks (the binary does, from [`SandboxService::approval_events`]), or run
//! what is approved (the gated operation goes on itself once `gate` returns).

mod gate;
pub(crate) mod network;
mod policies;
pub(crate) mod signature;

pub(crate) use gate::{request_sha256, Asked, Gated};

use paddock_store::ApprovalRecord;
use paddock_types::api::{ApprovalEvent, ApprovalInfo, ApprovalKind, ApprovalState};
use tokio::sync::broadcast;

use crate::core::time::{now_ms, rfc3339};
use crate::{SandboxService, ServiceError};

/// A new approval's id.
pub(crate) fn new_approval_id() -> String {
    format!("apr_{:032x}", rand::random::<u128>())
}

/// The state an approval is in at `now_ms`: pending or approved-and-unused past its time is
/// expired, whether or not the sweep has marked it yet.
pub(crate) fn state_at(r: &ApprovalRecord, now_ms: i64) -> ApprovalState {
    let state = ApprovalState::parse(&r.state).unwrap_or(ApprovalState::Expired);
    match state {
        ApprovalState::Pending | ApprovalState::Approved
            if r.used_at_ms.is_none() && r.expires_at_ms <= now_ms =>
        {
            ApprovalState::Expired
        }
        other => other,
    }
}

/// The wire form of a stored approval, as it stands now.
pub(crate) fn approval_info(r: &ApprovalRecord) -> Result<ApprovalInfo, ServiceError> {
    Ok(ApprovalInfo {
        id: r.id.clone(),
        state: state_at(r, now_ms()),
        kind: ApprovalKind::parse(&r.kind)
            .ok_or_else(|| ServiceError::internal("read an approval", &format!("kind {:?}", r.kind)))?,
        sandbox_id: r.sandbox_id.clone(),
        summary: r.summary.clone(),
        request: serde_json::from_str(&r.request)
            .map_err(|e| ServiceError::internal("read an approval's request", &e))?,
        request_sha256: r.request_sha256.clone(),
        policy: r.policy_scope.clone(),
        rule: r.rule.and_then(|r| u32::try_from(r).ok()),
        reason: r.reason.clone(),
        requested_by: r.requested_by.clone(),
        created_at: rfc3339(r.created_at_ms),
        expires_at: rfc3339(r.expires_at_ms),
        decided_at: r.decided_at_ms.map(rfc3339),
        decided_by: r.decided_by.clone(),
        note: r.note.clone(),
        used_at: r.used_at_ms.map(rfc3339),
    })
}

impl SandboxService {
    /// Every change of every tenant's queue from now on (`requested`, `approved`, `rejected`,
    /// `expired`, `used`). A receiver that falls more than 1024 events behind gets `Lagged` and
    /// should re-read what it cares about.
    pub fn approval_events(&self) -> broadcast::Receiver<ApprovalEvent> {
        self.inner.approvals.subscribe()
    }

    /// Marks the approvals whose time is up expired (up to 256 a call), each with its row.
    pub(crate) async fn sweep_approvals(&self) -> Result<(), ServiceError> {
        let due = self
            .db("list due approvals", |s| s.due_approvals(now_ms(), 256))
            .await?;
        for r in due {
            self.expire_approval(&r.tenant, &r.id).await?;
        }
        Ok(())
    }

    /// Tells the queue's listeners that `r` changed (`event`).
    pub(crate) fn announce_approval(&self, event: &'static str, r: &ApprovalRecord) {
        match approval_info(r) {
            Ok(approval) => {
                // No listener is not a failure: the store has the change.
                let _ = self.inner.approvals.send(ApprovalEvent {
                    event: event.to_owned(),
                    tenant: r.tenant.clone(),
                    approval,
                });
            }
            Err(e) => tracing::warn!(error = %e, id = %r.id, "an approval change not announced"),
        }
    }
}
