//! Tenant quotas as the service applies them: the server's defaults, what each thing a tenant runs
//! or stores is charged, and checks before expensive work.
//!
//! The check that counts is the store's, in the transaction that records the new sandbox, snapshot
//! or volume (race-free, see `paddock-store/src/quota.rs`). The checks here come first so that a
//! tenant at its limit is refused before a fork boots N copies, a snapshot is captured, an archive is
//! unpacked or a volume is made, and so that the answer names the quota. They count what is known
//! beforehand; the store's check counts the real figures.
//!
//! Charges against `max_storage` (upper bounds of what each can hold in the pool, known without
//! walking any files; the pool's simple quotas charge every extent to the subvolume that wrote it):
//! - a sandbox: its disk limit, plus its base (what the snapshot it was made from is charged: it can
//!   keep all of that alive on its own once the snapshot is deleted);
//! - a snapshot: its sandbox's base plus what the sandbox had written when it was taken (its quota
//!   group's count right after the capture's transaction commit); an import: the archive's size;
//! - a volume: its size; one created without a size gets the server's default disk size, as its real
//!   limit, so nothing stored is ever unlimited or uncharged.
//!
//! What it does not do: reclaim anything when a quota is lowered (the tenant just cannot add more).

use paddock_store::{QuotaDefaults, QuotaRequest, StoreError};
use paddock_types::api::ErrorCode;
use paddock_types::Limits;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::{Principal, SandboxService, ServiceError};

/// What a sandbox with `limits` that starts from `base_bytes` is charged against `max_storage`.
pub(crate) fn sandbox_storage(limits: &Limits, base_bytes: u64) -> u64 {
    limits.disk.map_or(0, u64::from).saturating_add(base_bytes)
}

impl SandboxService {
    /// The server's quota defaults, for the store's checks.
    pub(crate) fn quota_defaults(&self) -> QuotaDefaults {
        let config = &self.inner.config;
        QuotaDefaults {
            quota: config.quotas,
            unsized_volume_bytes: config.default_limits.disk.map_or(0, u64::from),
        }
    }

    /// Refuses `request` for `p`'s tenant if it would exceed one of its quotas now; a refusal is
    /// recorded as an `action` audit row with outcome `quota_exceeded`.
    pub(crate) async fn precheck_quota(
        &self,
        p: &Principal,
        action: AuditAction,
        sandbox: Option<&str>,
        request: QuotaRequest,
    ) -> Result<(), ServiceError> {
        let (tenant, defaults) = (p.tenant.clone(), self.quota_defaults());
        let checked = self
            .db("check a quota", move |s| {
                s.check_quota(&tenant, &request, &defaults)
            })
            .await;
        self.audit_refusal(p, action, sandbox, checked).await
    }

    /// Records `result` as a refused `action` when it is a quota refusal, and passes it on.
    pub(crate) async fn audit_refusal<T>(
        &self,
        p: &Principal,
        action: AuditAction,
        sandbox: Option<&str>,
        result: Result<T, ServiceError>,
    ) -> Result<T, ServiceError> {
        if let Err(e) = &result {
            if e.code == ErrorCode::QuotaExceeded {
                let entry = AuditEntry::ok(p, action, sandbox)
                    .outcome(e.code.as_str())
                    .detail(audit::Refusal {
                        field: e.field.clone(),
                        message: e.message.clone(),
                    });
                self.audit(entry).await?;
            }
        }
        result
    }

    /// Bytes `p`'s tenant may still add to what it stores (`None`: no storage quota).
    pub(crate) async fn storage_room(&self, p: &Principal) -> Result<Option<u64>, ServiceError> {
        let (tenant, defaults) = (p.tenant.clone(), self.quota_defaults());
        self.db("read a tenant's quota", move |s| {
            let quota = s.effective_quota(&tenant, &defaults)?.unwrap_or(defaults.quota);
            let Some(max) = quota.max_storage_bytes else {
                return Ok(None);
            };
            let used = s.tenant_usage(&tenant, &defaults)?.storage_bytes;
            Ok::<_, StoreError>(Some(max.saturating_sub(used)))
        })
        .await
    }
}
