//! Capturing a snapshot of a live sandbox: quota checked, storage taken on the backend, usage
//! measured, record and audit row written together (or the storage removed again).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use paddock_runtime::fault;
use paddock_store::{NewSnapshot, QuotaRequest, SnapshotKind, SnapshotRecord, StoreError};
use paddock_types::SnapshotId;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::LiveSandbox;
use crate::core::service::runtime_error;
use crate::core::time::now_ms;
use crate::{Principal, SandboxService, ServiceError};

/// What a snapshot being taken is: its id (chosen by the caller, so that an intent can name it
/// first), kind, name and labels.
pub(crate) struct Capture {
    pub(crate) id: SnapshotId,
    pub(crate) kind: SnapshotKind,
    pub(crate) name: Option<String>,
    pub(crate) labels: BTreeMap<String, String>,
}

impl SandboxService {
    /// Captures `sb`'s files as a snapshot of `kind` and records it, charged its sandbox's base plus
    /// what the sandbox had written (see `quota.rs`); refused first if the tenant is at its
    /// snapshot or storage quota, and again (atomically) when recorded.
    pub(crate) async fn take_snapshot(
        &self,
        p: &Principal,
        sb: &Arc<LiveSandbox>,
        capture: Capture,
        action: AuditAction,
    ) -> Result<SnapshotRecord, ServiceError> {
        let Capture {
            id: snapshot,
            kind,
            name,
            labels,
        } = capture;
        let started = Instant::now();
        let base_bytes = self.owned_record(p, &sb.id).await?.base_bytes;
        let request = QuotaRequest {
            snapshots: 1,
            storage_bytes: base_bytes,
            ..QuotaRequest::default()
        };
        self.precheck_quota(p, action, Some(&sb.id), request).await?;
        let taken = snapshot.clone();
        let written = self
            .on_handle(sb, "snapshot a sandbox", move |backend, handle| {
                backend
                    .snapshot_sandbox(handle, &taken)
                    .map_err(|e| runtime_error("snapshot a sandbox", e))?;
                // The capture committed the pool's transaction, so the quota group's count covers
                // every byte the snapshot can hold of the sandbox's own writes (later writes only add
                // to it).
                backend.sandbox_usage(handle).map(|u| u.disk_bytes).map_err(|e| {
                    let _ = backend.delete_snapshot(&taken);
                    runtime_error("measure a snapshot", e)
                })
            })
            .await?
            .ok_or_else(|| ServiceError::sandbox_ending(&sb.id))??;
        fault::point("snapshot.captured");
        let new = NewSnapshot {
            id: snapshot.to_string(),
            tenant: p.tenant.clone(),
            sandbox_id: Some(sb.id.to_string()),
            kind,
            name,
            labels,
            created_at_ms: now_ms(),
            storage_bytes: base_bytes.saturating_add(written),
            template_id: sb.spec().template_id,
        };
        let row = AuditEntry::ok(p, action, Some(&sb.id))
            .detail(audit::Captured {
                snapshot: snapshot.to_string(),
                kind: kind.as_str(),
                storage_bytes: new.storage_bytes,
            })
            .into_row();
        let (record, defaults) = (new.clone(), self.quota_defaults());
        let stored = self
            .db("record a snapshot", move |s| {
                s.transaction(|tx| {
                    tx.insert_snapshot_checked(&record, &defaults)?;
                    audit::append(tx, &row)?;
                    Ok::<_, StoreError>(())
                })
            })
            .await;
        if let Err(e) = stored {
            // Storage without a record is garbage: remove it now rather than at the next start.
            self.free_snapshot_now(snapshot).await;
            return self.audit_refusal(p, action, Some(&sb.id), Err(e)).await;
        }
        self.inner
            .metrics
            .observe_snapshot(kind.as_str(), started.elapsed());
        Ok(SnapshotRecord {
            id: new.id,
            tenant: new.tenant,
            sandbox_id: new.sandbox_id,
            kind: new.kind,
            name: new.name,
            labels: new.labels,
            created_at_ms: new.created_at_ms,
            deleted_at_ms: None,
            storage_bytes: new.storage_bytes,
            template_id: new.template_id,
        })
    }
}
