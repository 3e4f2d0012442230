//! The approvals queue as people see it: list, read, approve and reject (`/v1/approvals`).
//!
//! Approving and rejecting need an approver (or admin) key; the key that asked cannot approve its
//! own request unless the tenant's policy sets `self_approval` (it may always reject it). A
//! decision is one conditional update with its audit row, so of two approvers, or an approver and
//! the expiry, exactly one decides; the other gets `approval_decided`.
//!
//! What it does not do: run what is approved (the held request does, see
//! `core/approvals/gate.rs`), or notify anyone (the queue's events do).

use paddock_store::{ApprovalDecision, ApprovalRecord};
use paddock_types::api::{
    ApprovalEvent, ApprovalInfo, ApprovalList, ApprovalState, DecideApprovalRequest, ErrorCode,
    ListApprovalsQuery,
};

use crate::core::approvals::{approval_info, state_at};
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::principal::Permission;
use crate::core::time::now_ms;
use crate::{Principal, SandboxService, ServiceError};

/// The longest note an approver may leave.
const MAX_NOTE: usize = 1024;

/// `GET /v1/approvals/events`: the changes of one tenant's queue, as they happen. It ends if its
/// reader falls more than 1024 changes behind (re-list, then listen again) or the server stops.
#[derive(Debug)]
pub struct ApprovalStream {
    rx: tokio::sync::broadcast::Receiver<ApprovalEvent>,
    tenant: String,
}

impl ApprovalStream {
    /// The next change of the tenant's queue; `None`: the stream ended.
    pub async fn recv(&mut self) -> Option<ApprovalEvent> {
        loop {
            match self.rx.recv().await {
                Ok(event) if event.tenant == self.tenant => return Some(event),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }
}

/// The body of a signed webhook callback: a decision an approval system (a chat bot, a ticketing
/// tool) sends back on a person's behalf.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CallbackDecision {
    /// `approve` or `reject`.
    decision: String,
    /// Who decided, as the approval system knows them (recorded as `webhook:<approver>`).
    approver: String,
    #[serde(default)]
    note: Option<String>,
}

/// The longest approver name a callback may give.
const MAX_APPROVER: usize = 128;

/// One webhook delivery of a queue change, as the server's webhook sender reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookDelivery {
    /// The delivery's id (its `Paddock-Delivery` header).
    pub delivery: String,
    /// Attempts made.
    pub attempts: u32,
    /// Whether the receiver answered 2xx.
    pub delivered: bool,
    /// The last answer's HTTP status.
    pub status: Option<u16>,
    /// The last failure (no answer, or a non-2xx one).
    pub error: Option<String>,
}

fn approval_not_found(id: &str) -> ServiceError {
    ServiceError::new(ErrorCode::ApprovalNotFound, format!("approval {id} not found"))
}

impl SandboxService {
    async fn approval_record(&self, p: &Principal, id: &str) -> Result<ApprovalRecord, ServiceError> {
        let (tenant, id_owned) = (p.tenant.clone(), id.to_owned());
        self.db("read an approval", move |s| s.get_approval(&tenant, &id_owned))
            .await?
            .ok_or_else(|| approval_not_found(id))
    }

    /// `GET /v1/approvals`: the tenant's approvals, newest first.
    pub async fn list_approvals(
        &self,
        p: &Principal,
        q: ListApprovalsQuery,
    ) -> Result<ApprovalList, ServiceError> {
        let state = match q.state.as_deref() {
            None => None,
            Some(text) => Some(
                ApprovalState::parse(text)
                    .ok_or_else(|| {
                        ServiceError::invalid("state", "one of pending, approved, rejected, expired")
                    })?
                    .as_str(),
            ),
        };
        let limit = q.limit.unwrap_or(100);
        if limit == 0 || limit > 1000 {
            return Err(ServiceError::invalid("limit", "from 1 to 1000"));
        }
        let tenant = p.tenant.clone();
        let sandbox = q.sandbox_id.clone();
        // Read by the stored state, then filtered by the state at this moment: a pending row past
        // its time is listed as expired, not pending, even before the sweep marks it.
        let stored = match state {
            Some("expired") => None,
            other => other,
        };
        let rows = self
            .db("list approvals", move |s| {
                s.list_approvals(&tenant, stored, sandbox.as_deref(), limit)
            })
            .await?;
        let now = now_ms();
        let approvals = rows
            .iter()
            .filter(|r| state.is_none_or(|s| state_at(r, now).as_str() == s))
            .map(approval_info)
            .collect::<Result<_, _>>()?;
        Ok(ApprovalList { approvals })
    }

    /// `GET /v1/approvals/events`: the caller's tenant's queue changes from now on.
    pub fn approval_stream(&self, p: &Principal) -> ApprovalStream {
        ApprovalStream {
            rx: self.approval_events(),
            tenant: p.tenant.clone(),
        }
    }

    /// Records what became of one queue change's webhook delivery (`approval.webhook`, outcome
    /// `ok` or `failed`), a row of the approval's tenant.
    pub async fn record_webhook_delivery(
        &self,
        event: &ApprovalEvent,
        d: WebhookDelivery,
    ) -> Result<(), ServiceError> {
        let entry = AuditEntry::system(
            AuditAction::ApprovalWebhook,
            Some(event.tenant.clone()),
            event.approval.sandbox_id.as_deref(),
        )
        .outcome(if d.delivered { "ok" } else { "failed" })
        .detail(audit::ApprovalWebhookSent {
            approval_id: event.approval.id.clone(),
            event: event.event.clone(),
            delivery: d.delivery,
            attempts: d.attempts,
            status: d.status,
            error: d.error,
        });
        self.audit(entry).await
    }

    /// `POST /v1/approvals/{id}/callback`: a decision signed with the webhook's key (the
    /// `Paddock-Signature` header over the exact body, within five minutes), on behalf of the
    /// person the body names; recorded as decided by `webhook:<approver>`. Refused
    /// (`unauthorized`) unsigned, signed with another key, or stale; `unsupported` when no webhook
    /// key is configured. Whoever holds the key may decide any tenant's approvals: it is the
    /// operator's approval system's.
    #[tracing::instrument(skip_all, fields(approval = %id))]
    pub async fn decide_by_callback(
        &self,
        id: &str,
        signature: Option<&str>,
        body: &[u8],
    ) -> Result<ApprovalInfo, ServiceError> {
        let Some(key) = &self.inner.config.approvals.callback_key else {
            return Err(ServiceError::new(
                ErrorCode::Unsupported,
                "this server has no webhook key ([approvals] webhook_secret_file): callbacks are refused",
            ));
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let signature = signature.ok_or_else(|| {
            ServiceError::new(
                ErrorCode::Unauthorized,
                "a callback must carry a Paddock-Signature header",
            )
        })?;
        crate::core::approvals::signature::verify_webhook(&key.0, signature, body, now)
            .map_err(|why| ServiceError::new(ErrorCode::Unauthorized, format!("callback refused: {why}")))?;
        let decision: CallbackDecision = serde_json::from_slice(body)
            .map_err(|e| ServiceError::invalid("body", format!("not a callback decision: {e}")))?;
        let approved = match decision.decision.as_str() {
            "approve" => true,
            "reject" => false,
            _ => return Err(ServiceError::invalid("decision", "approve or reject")),
        };
        if decision.approver.trim().is_empty()
            || decision.approver.len() > MAX_APPROVER
            || decision.approver.chars().any(char::is_control)
        {
            return Err(ServiceError::invalid(
                "approver",
                format!("who decided: 1 to {MAX_APPROVER} bytes, no control characters"),
            ));
        }
        let id_owned = id.to_owned();
        let record = self
            .db("read an approval", move |s| s.find_approval(&id_owned))
            .await?
            .ok_or_else(|| approval_not_found(id))?;
        let p = Principal {
            tenant: record.tenant,
            key_id: format!("webhook:{}", decision.approver),
            admin: false,
            change_network: false,
            approver: true,
        };
        self.decide(&p, id, approved, DecideApprovalRequest { note: decision.note })
            .await
    }

    /// `GET /v1/approvals/{id}`.
    pub async fn get_approval(&self, p: &Principal, id: &str) -> Result<ApprovalInfo, ServiceError> {
        approval_info(&self.approval_record(p, id).await?)
    }

    /// `POST /v1/approvals/{id}/approve`: the held request may run, once.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant, approval = %id))]
    pub async fn approve(
        &self,
        p: &Principal,
        id: &str,
        req: DecideApprovalRequest,
    ) -> Result<ApprovalInfo, ServiceError> {
        self.decide(p, id, true, req).await
    }

    /// `POST /v1/approvals/{id}/reject`: the held request never runs.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant, approval = %id))]
    pub async fn reject(
        &self,
        p: &Principal,
        id: &str,
        req: DecideApprovalRequest,
    ) -> Result<ApprovalInfo, ServiceError> {
        self.decide(p, id, false, req).await
    }

    async fn decide(
        &self,
        p: &Principal,
        id: &str,
        approved: bool,
        req: DecideApprovalRequest,
    ) -> Result<ApprovalInfo, ServiceError> {
        let doing = if approved {
            "approving a request"
        } else {
            "rejecting a request"
        };
        p.require(Permission::Approve, doing)?;
        if req.note.as_ref().is_some_and(|n| n.len() > MAX_NOTE) {
            return Err(ServiceError::invalid("note", format!("at most {MAX_NOTE} bytes")));
        }
        let record = self.approval_record(p, id).await?;
        let now = now_ms();
        if state_at(&record, now) != ApprovalState::Pending {
            return Err(ServiceError::approval(
                ErrorCode::ApprovalDecided,
                id,
                format!("approval {id} is already {}", state_at(&record, now).as_str()),
            ));
        }
        if approved && record.requested_by == p.key_id && !self.self_approval_allowed(&p.tenant).await? {
            return Err(ServiceError::new(
                ErrorCode::Forbidden,
                format!(
                    "approval {id} was asked for by this key: another approver must approve it (the tenant's \
                     policy does not set self_approval)"
                ),
            ));
        }
        let action = if approved {
            AuditAction::ApprovalApprove
        } else {
            AuditAction::ApprovalReject
        };
        let entry = AuditEntry::ok(p, action, record.sandbox_id.as_deref())
            .detail(audit::ApprovalDecided {
                approval_id: record.id.clone(),
                kind: record.kind.clone(),
                summary: record.summary.clone(),
                requested_by: record.requested_by.clone(),
                note: req.note.clone(),
            })
            .into_row();
        let ttl = i64::try_from(self.inner.config.approvals.ttl.as_millis()).unwrap_or(i64::MAX);
        let (tenant, id_owned, by, note) = (p.tenant.clone(), id.to_owned(), p.key_id.clone(), req.note);
        let decided = self
            .db("decide an approval", move |s| {
                s.transaction(|tx| {
                    let decision = ApprovalDecision {
                        approved,
                        by: &by,
                        note: note.as_deref(),
                        at_ms: now,
                        use_by_ms: now.saturating_add(ttl),
                    };
                    if !tx.decide_approval(&tenant, &id_owned, &decision)? {
                        return Ok(None);
                    }
                    audit::append(tx, &entry)?;
                    tx.get_approval(&tenant, &id_owned)
                })
            })
            .await?;
        match decided {
            Some(r) => {
                self.announce_approval(if approved { "approved" } else { "rejected" }, &r);
                approval_info(&r)
            }
            // Decided, or its time came, since it was read.
            None => {
                let now = self.approval_record(p, id).await?;
                Err(ServiceError::approval(
                    ErrorCode::ApprovalDecided,
                    id,
                    format!("approval {id} is already {}", state_at(&now, now_ms()).as_str()),
                ))
            }
        }
    }
}
