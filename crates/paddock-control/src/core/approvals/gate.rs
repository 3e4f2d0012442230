//! The gate every policy-checked request passes before anything of it runs.
//!
//! The verdict of the effective policy decides: `allow` goes on; `deny` is refused
//! (`policy_denied`, with a `policy.deny` row); `ask` goes on only under an approval of this very
//! request (the same sandbox and the same request hash) that a person approved and that was not
//! used before, and marks it used in the same conditional update, so it runs once. A request
//! without one gets a new pending approval and waits, bounded, for a decision; a caller that goes
//! away, a wait that ends, a restart, a rejection or the expiry leave nothing run: fail-closed.
//!
//! What it does not do: describe the request (the caller gives the [`Action`] the policy sees and
//! the [`Asked`] a person sees, both from what the API was asked, never from inside the sandbox),
//! or run it.

use std::time::Duration;

use paddock_policy::{Action, Verdict};
use paddock_store::{ApprovalRecord, ApprovalUse};
use paddock_types::api::{ApprovalKind, ApprovalState, ErrorCode};
use sha2::Digest as _;
use tokio::sync::broadcast::error::RecvError;

use super::{new_approval_id, state_at};
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::time::{now_ms, rfc3339};
use crate::{Principal, SandboxService, ServiceError};

/// A held request as a person sees it.
pub(crate) struct Asked {
    pub(crate) kind: ApprovalKind,
    /// One line: the command line, `write /path`.
    pub(crate) summary: String,
    /// The exact request (what an approval lets run; hashed to match a retry).
    pub(crate) request: serde_json::Value,
}

/// How a gated request goes on.
pub(crate) struct Gated {
    /// The approval it runs under (`None`: the policy allowed it, or there is none).
    pub(crate) approval_id: Option<String>,
}

/// The most of a request an approval keeps (a larger one is kept as its size; its hash is of the
/// whole, so only the very request still runs under it).
const MAX_STORED_REQUEST: usize = 64 * 1024;
/// Approvals one sandbox may have pending at once.
const MAX_PENDING_PER_SANDBOX: u64 = 32;
/// The longest one-line summary kept (cut at a character boundary, marked with `…`).
const MAX_SUMMARY: usize = 1024;

/// `text` cut to at most `max` bytes at a character boundary, marked when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A pending approval about to be queued: its row and its `approval.request` audit row, written
/// together by [`Pending::write`] (alone, or with the row of what waits on it).
pub(crate) struct Pending {
    pub(crate) record: ApprovalRecord,
    entry: paddock_store::NewAuditEntry,
}

/// The queue's bounds: pending approvals per tenant, decided ones kept per tenant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ApprovalLimits {
    max_pending: u64,
    keep_decided: u32,
}

impl Pending {
    /// Writes the approval and its row in `tx`; `quota_exceeded` (`max_pending_approvals`) when
    /// the tenant has as many pending as it may.
    pub(crate) fn write(
        &self,
        tx: &paddock_store::StoreTx<'_>,
        limits: ApprovalLimits,
    ) -> Result<(), paddock_store::StoreError> {
        if let Some(sandbox) = &self.record.sandbox_id {
            // One sandbox (whose workload can make network asks) cannot fill its tenant's queue.
            let pending = tx.pending_approvals_of_sandbox(&self.record.tenant, sandbox)?;
            if pending >= MAX_PENDING_PER_SANDBOX {
                return Err(paddock_store::StoreError::QuotaExceeded {
                    what: "max_pending_approvals_per_sandbox",
                    limit: MAX_PENDING_PER_SANDBOX,
                    requested_total: pending + 1,
                    tenant: self.record.tenant.clone(),
                });
            }
        }
        let pending = tx.pending_approvals(&self.record.tenant)?;
        if pending >= limits.max_pending {
            return Err(paddock_store::StoreError::QuotaExceeded {
                what: "max_pending_approvals",
                limit: limits.max_pending,
                requested_total: pending + 1,
                tenant: self.record.tenant.clone(),
            });
        }
        tx.insert_approval(&self.record, limits.keep_decided)?;
        audit::append(tx, &self.entry)?;
        Ok(())
    }
}

/// Refuse a request when its approval is not usable; `id` names it in the answer.
fn unusable(id: &str, why: ApprovalUse) -> ServiceError {
    match why {
        ApprovalUse::Granted => ServiceError::internal("use an approval", &"granted treated as refused"),
        ApprovalUse::NotFound => {
            ServiceError::new(ErrorCode::ApprovalNotFound, format!("approval {id} not found"))
        }
        ApprovalUse::Pending => still_pending(id),
        ApprovalUse::Rejected => ServiceError::approval(
            ErrorCode::ApprovalRejected,
            id,
            format!("approval {id} was rejected: the request was not run"),
        ),
        ApprovalUse::Expired => ServiceError::approval(
            ErrorCode::ApprovalExpired,
            id,
            format!("approval {id} expired before it was used: the request was not run; send it again to ask again"),
        ),
        ApprovalUse::Used => ServiceError::approval(
            ErrorCode::ApprovalExpired,
            id,
            format!("approval {id} was already used: an approval runs its request once; send it again to ask again"),
        ),
        ApprovalUse::OtherRequest => ServiceError {
            approval_id: Some(id.to_owned()),
            ..ServiceError::invalid(
                "approval_id",
                format!("approval {id} was given for another request (another sandbox, or other fields): it runs only the request it was asked for"),
            )
        },
    }
}

fn still_pending(id: &str) -> ServiceError {
    ServiceError::approval(
        ErrorCode::ApprovalPending,
        id,
        format!(
            "the approval policy asks a person first: approval {id} is pending and nothing has run; \
             poll GET /v1/approvals/{id}, and once it is approved send the same request again with \
             approval_id {id}"
        ),
    )
}

/// The canonical hash of a request (its JSON, maps sorted).
pub(crate) fn request_sha256(request: &serde_json::Value) -> String {
    hex::encode(sha2::Sha256::digest(request.to_string().as_bytes()))
}

impl SandboxService {
    /// The queue's bounds, as configured.
    pub(crate) fn approval_limits(&self) -> ApprovalLimits {
        let config = &self.inner.config.approvals;
        ApprovalLimits {
            max_pending: config.max_pending_per_tenant,
            keep_decided: config.keep_decided_per_tenant,
        }
    }

    /// A new pending approval of `asked` (hashing `sha`) by `p`, for `sandbox` if it is about one,
    /// asked by `scope`'s policy (its rule `rule`, for `reason`); not yet written.
    #[expect(
        clippy::too_many_arguments,
        reason = "each a distinct part of the approval row"
    )]
    pub(crate) fn pending_approval(
        &self,
        p: &Principal,
        sandbox: Option<&str>,
        asked: Asked,
        sha: String,
        scope: &'static str,
        rule: Option<u32>,
        reason: Option<String>,
    ) -> Pending {
        let now = now_ms();
        let ttl = i64::try_from(self.inner.config.approvals.ttl.as_millis()).unwrap_or(i64::MAX);
        let summary = cut(&asked.summary, MAX_SUMMARY);
        let mut request = asked.request.to_string();
        if request.len() > MAX_STORED_REQUEST {
            request = serde_json::json!({
                "omitted": format!("the request is larger than {MAX_STORED_REQUEST} bytes"),
                "bytes": request.len(),
            })
            .to_string();
        }
        let record = ApprovalRecord {
            id: new_approval_id(),
            tenant: p.tenant.clone(),
            sandbox_id: sandbox.map(str::to_owned),
            kind: asked.kind.as_str().to_owned(),
            summary: summary.clone(),
            request,
            request_sha256: sha.clone(),
            policy_scope: scope.to_owned(),
            rule: rule.map(i64::from),
            reason: reason.clone(),
            requested_by: p.key_id.clone(),
            state: ApprovalState::Pending.as_str().to_owned(),
            created_at_ms: now,
            expires_at_ms: now.saturating_add(ttl),
            decided_at_ms: None,
            decided_by: None,
            note: None,
            used_at_ms: None,
        };
        let entry = AuditEntry::ok(p, AuditAction::ApprovalRequest, sandbox)
            .outcome(ErrorCode::ApprovalPending.as_str())
            .detail(audit::ApprovalRequested {
                approval_id: record.id.clone(),
                kind: asked.kind.as_str(),
                summary,
                request_sha256: sha,
                scope,
                rule,
                reason,
                expires_at: rfc3339(record.expires_at_ms),
            })
            .into_row();
        Pending { record, entry }
    }

    /// Checks `actions` (the parts of one request, in `sandbox`, or for the tenant) against the effective policy: `Ok` when
    /// it may run now, with the approval it runs under; an error (and nothing run) otherwise.
    /// `asked` describes it for a person, only called when a policy asks or denies. `approval_id`
    /// is the caller's claim of an approval; `wait` how long to hold for a decision (capped by the
    /// server's `[approvals] wait`).
    pub(crate) async fn gate(
        &self,
        p: &Principal,
        sandbox: Option<&str>,
        actions: &[Action<'_>],
        asked: impl FnOnce() -> Asked,
        approval_id: Option<&str>,
        wait: Option<Duration>,
    ) -> Result<Gated, ServiceError> {
        let Some(effective) = self.effective_policy(&p.tenant, sandbox).await? else {
            return Ok(Gated { approval_id: None });
        };
        // Of several parts of one request (a move's source and target), the most restrictive
        // decides, as of several rules (`Verdict`'s order), the first of equals reported.
        let Some(decision) = actions
            .iter()
            .map(|a| paddock_policy::decide(&effective.policy, a))
            .reduce(|a, b| if b.verdict > a.verdict { b } else { a })
        else {
            return Ok(Gated { approval_id: None });
        };
        let rule = decision.rule.and_then(|r| u32::try_from(r).ok());
        let reason = decision.reason.map(str::to_owned);
        match decision.verdict {
            Verdict::Allow => Ok(Gated { approval_id: None }),
            Verdict::Deny => {
                let asked = asked();
                let which = match (rule, &reason) {
                    (Some(r), Some(why)) => format!("rule {r}: {why}"),
                    (Some(r), None) => format!("rule {r}"),
                    (None, _) => "its default".to_owned(),
                };
                self.audit(
                    AuditEntry::ok(p, AuditAction::PolicyDeny, sandbox)
                        .outcome(ErrorCode::PolicyDenied.as_str())
                        .detail(audit::PolicyDenied {
                            kind: asked.kind.as_str(),
                            summary: asked.summary.clone(),
                            scope: effective.scope,
                            rule,
                            reason,
                        }),
                )
                .await?;
                Err(ServiceError::new(
                    ErrorCode::PolicyDenied,
                    format!(
                        "the {} approval policy denies this ({which}): {}",
                        effective.scope, asked.summary
                    ),
                ))
            }
            Verdict::Ask => {
                let asked = asked();
                let sha = request_sha256(&asked.request);
                if let Some(id) = approval_id {
                    return self.use_approval(p, id, sandbox, &sha).await;
                }
                let wait = wait
                    .unwrap_or(self.inner.config.approvals.wait)
                    .min(self.inner.config.approvals.wait);
                let pending = self.pending_approval(p, sandbox, asked, sha, effective.scope, rule, reason);
                self.hold(p, pending, wait).await
            }
        }
    }

    /// Runs the request hashing `sha` under approval `id`, if it may.
    async fn use_approval(
        &self,
        p: &Principal,
        id: &str,
        sandbox: Option<&str>,
        sha: &str,
    ) -> Result<Gated, ServiceError> {
        let (tenant, id_owned, sandbox_owned, sha) = (
            p.tenant.clone(),
            id.to_owned(),
            sandbox.map(str::to_owned),
            sha.to_owned(),
        );
        let (outcome, record) = self
            .db("use an approval", move |s| {
                s.transaction(|tx| {
                    let outcome =
                        tx.use_approval(&tenant, &id_owned, sandbox_owned.as_deref(), &sha, now_ms())?;
                    Ok::<_, paddock_store::StoreError>((outcome, tx.get_approval(&tenant, &id_owned)?))
                })
            })
            .await?;
        match (outcome, record) {
            (ApprovalUse::Granted, Some(record)) => {
                self.announce_approval("used", &record);
                Ok(Gated {
                    approval_id: Some(id.to_owned()),
                })
            }
            (outcome, _) => Err(unusable(id, outcome)),
        }
    }

    /// Queues a new approval for the request and waits up to `wait` for a person: approved, it
    /// is used (and the request goes on); anything else, or no decision in time, leaves it unrun.
    async fn hold(&self, p: &Principal, pending: Pending, wait: Duration) -> Result<Gated, ServiceError> {
        let sha = pending.record.request_sha256.clone();
        let sandbox = pending.record.sandbox_id.clone();
        let sandbox = sandbox.as_deref();
        let now = pending.record.created_at_ms;
        // Listening before the row exists: no decision can come between the two.
        let mut events = self.approval_events();
        let record = pending.record.clone();
        let limits = self.approval_limits();
        self.db("queue an approval", move |s| {
            s.transaction(|tx| pending.write(tx, limits))
        })
        .await?;
        self.announce_approval("requested", &record);
        let id = record.id.clone();
        let deadline = tokio::time::Instant::now() + wait;
        let expiry = tokio::time::Instant::now()
            + Duration::from_millis(record.expires_at_ms.saturating_sub(now).unsigned_abs());
        loop {
            let until = deadline.min(expiry);
            let decided = match tokio::time::timeout_at(until, events.recv()).await {
                Err(_) if until < expiry => return Err(still_pending(&id)),
                Ok(Ok(event)) if event.approval.id == id => event.approval.state,
                Ok(Ok(_)) => continue,
                // Its time is up (expired now, unless a decision came first), fallen behind, or
                // the server is stopping: what the store says now.
                Err(_) | Ok(Err(RecvError::Lagged(_))) | Ok(Err(RecvError::Closed)) => {
                    if tokio::time::Instant::now() >= expiry {
                        self.expire_approval(&record.tenant, &id).await?;
                    }
                    let (tenant, id) = (record.tenant.clone(), id.clone());
                    let now = self
                        .db("read an approval", move |s| s.get_approval(&tenant, &id))
                        .await?;
                    match now {
                        Some(r) => state_at(&r, now_ms()),
                        None => return Err(unusable(&record.id, ApprovalUse::NotFound)),
                    }
                }
            };
            match decided {
                ApprovalState::Pending => continue,
                ApprovalState::Approved => return self.use_approval(p, &id, sandbox, &sha).await,
                ApprovalState::Rejected => return Err(unusable(&id, ApprovalUse::Rejected)),
                ApprovalState::Expired => return Err(unusable(&id, ApprovalUse::Expired)),
            }
        }
    }

    /// Marks approval `id` expired if its time is up, with its `approval.expire` row, and tells
    /// the queue's listeners; nothing if it was decided or used first.
    pub(crate) async fn expire_approval(&self, tenant: &str, id: &str) -> Result<(), ServiceError> {
        let (t, i) = (tenant.to_owned(), id.to_owned());
        let expired = self
            .db("expire an approval", move |s| {
                s.transaction(|tx| {
                    if !tx.expire_approval(&t, &i, now_ms())? {
                        return Ok(None);
                    }
                    let Some(r) = tx.get_approval(&t, &i)? else {
                        return Ok(None);
                    };
                    let entry = AuditEntry::system(
                        AuditAction::ApprovalExpire,
                        Some(t.clone()),
                        r.sandbox_id.as_deref(),
                    )
                    .detail(audit::ApprovalDecided {
                        approval_id: r.id.clone(),
                        kind: r.kind.clone(),
                        summary: r.summary.clone(),
                        requested_by: r.requested_by.clone(),
                        note: None,
                    })
                    .into_row();
                    audit::append(tx, &entry)?;
                    Ok::<_, paddock_store::StoreError>(Some(r))
                })
            })
            .await?;
        if let Some(r) = expired {
            self.announce_approval("expired", &r);
        }
        Ok(())
    }
}
