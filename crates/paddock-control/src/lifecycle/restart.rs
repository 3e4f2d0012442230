//! Restarting a sandbox on a snapshot (a rollback): preparing the copy in the background,
//! switching the live registry to the restarted sandbox, and recording the restart.

use std::sync::Arc;

use paddock_runtime::agent_client::AgentClient;
use paddock_runtime::SandboxHandle;
use paddock_store::{SnapshotRecord, StoreError};
use paddock_types::api::ErrorCode;
use paddock_types::SnapshotId;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::error::stored_snapshot_id;
use crate::core::live::{lock, LiveSandbox};
use crate::core::time::now_ms;
use crate::lifecycle::states::Transition;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// Lets the backend prepare a rollback of `sb` to `snapshot` now, in the background (a boot of a
    /// copy), so that the rollback itself is a switch (see `SandboxBackend::prepare_rollback`).
    pub(crate) fn prepare_rollback(&self, sb: &Arc<LiveSandbox>, snapshot: SnapshotId) {
        let (service, sb) = (self.clone(), sb.clone());
        tokio::spawn(async move {
            let prepared = service
                .on_handle(&sb, "prepare a rollback", move |b, handle| {
                    b.prepare_rollback(handle, &snapshot).map_err(|e| (snapshot, e))
                })
                .await;
            if let Ok(Some(Err((snapshot, e)))) = prepared {
                tracing::debug!(sandbox_id = %sb.id, snapshot = %snapshot, error = %e, "rollback not prepared; a rollback will restart the sandbox");
            }
        });
    }

    /// Releases a prepared rollback of `sb` (its checkpoint is gone), in the background.
    pub(crate) fn discard_rollback(&self, sb: &Arc<LiveSandbox>) {
        let (service, sb) = (self.clone(), sb.clone());
        tokio::spawn(async move {
            let _ = service
                .on_handle(&sb, "discard a rollback", |b, handle| b.discard_rollback(handle))
                .await;
        });
    }

    /// Records a finished rollback of sandbox `id` to `snapshot` in one transaction: its new base (its
    /// files are the snapshot's now: so is what it is charged beyond its disk limit), the
    /// `sandbox.rollback` row, the consumed checkpoint's deletion and the end of `intent`. The
    /// consumed checkpoint's storage is freed afterwards, off the caller's path (storage without a
    /// record is garbage the next start collects if this is interrupted). A rollback is never refused
    /// for storage (it is an undo): its new base can take the tenant over its storage quota by at most
    /// the snapshot's charge, and then nothing new fits until it is under.
    pub(crate) async fn record_rollback(
        &self,
        p: Option<&Principal>,
        id: &str,
        snapshot: &SnapshotRecord,
        consumed: bool,
        intent: i64,
    ) -> Result<(), ServiceError> {
        let base = snapshot.storage_bytes;
        let tenant = Some(snapshot.tenant.clone());
        let rollback_row = AuditEntry::by(p, tenant.clone(), AuditAction::SandboxRollback, Some(id))
            .detail(audit::Rollback {
                snapshot: snapshot.id.clone(),
                consumed,
                // Finished by recovery: the row says so.
                recovered: p.is_none().then_some(true),
            })
            .into_row();
        let consume_row = AuditEntry::by(p, tenant, AuditAction::SnapshotConsume, Some(id))
            .detail(audit::SnapshotRef {
                snapshot: snapshot.id.clone(),
                kind: snapshot.kind.as_str(),
            })
            .into_row();
        let (sid, snapshot_id) = (id.to_owned(), snapshot.id.clone());
        let dropped = self
            .db("record a rollback", move |s| {
                s.transaction(|tx| {
                    tx.set_sandbox_base_bytes(&sid, base)?;
                    audit::append(tx, &rollback_row)?;
                    let dropped = consumed && tx.mark_snapshot_deleted(&snapshot_id, now_ms())?;
                    if dropped {
                        audit::append(tx, &consume_row)?;
                    }
                    tx.end_intent(intent)?;
                    Ok::<_, StoreError>(dropped)
                })
            })
            .await?;
        if dropped {
            self.free_snapshot_storage(vec![stored_snapshot_id(&snapshot.id)?]);
        }
        Ok(())
    }

    /// Puts a restarted sandbox's new handle and agent connection in place of `old`, whose handle
    /// lock (`guard`, emptied) the caller held through the restart. The live map is changed only if
    /// it still holds `old`: if an end took it out meanwhile, the new sandbox is destroyed here
    /// (the end found no handle to destroy) and the restart fails with `sandbox_not_running`.
    pub(crate) async fn commit_restart(
        &self,
        p: &Principal,
        old: &Arc<LiveSandbox>,
        guard: tokio::sync::MutexGuard<'_, Option<SandboxHandle>>,
        handle: SandboxHandle,
    ) -> Result<(), ServiceError> {
        let client = match AgentClient::connect(&handle.agent_socket).await {
            Ok(c) => c,
            Err(e) => {
                let error = ServiceError::internal("connect to a restarted agent", &e);
                drop(guard);
                self.destroy_handle(handle).await;
                self.end_sandbox(
                    &old.id,
                    Transition::Lose,
                    "rollback_failed",
                    Some(p),
                    AuditAction::SandboxLost,
                )
                .await?;
                return Err(error);
            }
        };
        let owner = lock(&old.owner).clone();
        let fresh = Arc::new(LiveSandbox::new(old.id.clone(), client, handle, owner));
        let replaced = {
            let mut live = lock(&self.inner.live);
            match live.get(&old.id) {
                Some(current) if Arc::ptr_eq(current, old) => {
                    live.insert(old.id.clone(), fresh.clone());
                    true
                }
                _ => false,
            }
        };
        drop(guard);
        if !replaced {
            if let Some(handle) = fresh.handle.lock().await.take() {
                self.destroy_handle(handle).await;
            }
            return Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {} ended during its rollback", old.id),
            ));
        }
        Ok(())
    }
}
