//! Step transactions' ends: `commit` (keep the step) and `rollback` (return the sandbox's files to a
//! snapshot, restarting its processes), and finishing a rollback a crash interrupted.
//!
//! A rollback writes its intent (`IntentOp::Rollback`, with the snapshot) before the backend touches
//! the sandbox and removes it in the one transaction that records the outcome: the sandbox's new base,
//! the `sandbox.rollback` row and, when it consumes its checkpoint, that checkpoint's deletion. A
//! server killed in between finds the intent at its next start and rolls the sandbox back again from
//! the snapshot (`recovery.rs`): the rollback was asked for and its snapshot still exists, so the
//! sandbox ends on the snapshot's files either way. This module does not take snapshots
//! (`snapshots.rs`) or restart sandboxes itself (the backend's `rollback_sandbox`).

use std::sync::Arc;
use std::time::Instant;

use paddock_runtime::agent_client::AgentClient;
use paddock_runtime::{fault, SandboxHandle};
use paddock_store::{IntentOp, SnapshotRecord, StoreError};
use paddock_types::api::{ErrorCode, RollbackRequest, SandboxInfo, SnapshotInfo};
use paddock_types::SnapshotId;

use crate::lifecycle::{row_with_time, runtime_error};
use crate::live::LiveSandbox;
use crate::service::{lock, now_ms, AuditEntry};
use crate::snapshots::info;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// `commit`: drops the newest checkpoint (the step is kept).
    pub async fn commit(&self, p: &Principal, id: &str) -> Result<SnapshotInfo, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let record = self.snapshot_or_checkpoint(p, id, None).await?;
        self.drop_snapshot(Some(p), &record, "sandbox.commit").await?;
        self.discard_rollback(&sb);
        Ok(info(&record))
    }

    /// Returns the sandbox's files to one of its snapshots (the newest checkpoint by default, which
    /// this consumes); its processes restart, its id stays.
    pub async fn rollback(
        &self,
        p: &Principal,
        id: &str,
        req: RollbackRequest,
    ) -> Result<SandboxInfo, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let record = self
            .snapshot_or_checkpoint(p, id, req.snapshot.as_deref())
            .await?;
        if record.sandbox_id.as_deref() != Some(id) {
            return Err(ServiceError::invalid(
                "snapshot",
                format!(
                    "snapshot {} was not taken of this sandbox; create a sandbox from it instead",
                    record.id
                ),
            ));
        }
        let snapshot: SnapshotId = record
            .id
            .parse()
            .map_err(|e| ServiceError::internal("parse a snapshot id", &e))?;
        let consumed = req.snapshot.is_none();
        let started = Instant::now();
        // The handle's lock is the sandbox's operation lock, held until the rolled-back sandbox is
        // in place: an end (kill, expiry, stop, the reaper) coming meanwhile waits for it and ends
        // the new sandbox, or, if it took the old one out of the live map first, the commit below
        // sees that and tears down what the rollback made. No init is left that nothing holds.
        sb.set_restarting(true);
        let mut guard = sb.handle.lock().await;
        let Some(handle) = guard.take() else {
            sb.set_restarting(false);
            return Err(ServiceError::sandbox_ending(id));
        };
        let intent = match self
            .begin_intent(
                id,
                IntentOp::Rollback,
                Some(&record.id),
                serde_json::json!({ "consume": consumed }),
            )
            .await
        {
            Ok(intent) => intent,
            Err(e) => {
                *guard = Some(handle);
                sb.set_restarting(false);
                return Err(e);
            }
        };
        fault::point("rollback.intent_recorded");
        let restarted = self
            .on_backend("roll a sandbox back", move |b| {
                b.rollback_sandbox(handle, &snapshot)
            })
            .await?;
        let handle = match restarted {
            Ok(handle) => handle,
            Err(e) => {
                // The backend removed everything of the sandbox.
                drop(guard);
                let error = runtime_error("roll a sandbox back", e);
                self.end_sandbox(
                    id,
                    paddock_store::SandboxState::Failed,
                    "rollback_failed",
                    Some(p),
                    "sandbox.lost",
                )
                .await?;
                self.end_intent(intent).await;
                return Err(error);
            }
        };
        fault::point("rollback.restarted");
        let committed = self.commit_restart(p, &sb, guard, handle).await;
        sb.set_restarting(false);
        if let Err(e) = committed {
            self.end_intent(intent).await;
            return Err(e);
        }
        self.record_rollback(Some(p), id, &record, consumed, intent)
            .await?;
        fault::point("rollback.recorded");
        // The sandbox's newest remaining checkpoint (if any) is the next rollback's target.
        let sid = id.to_owned();
        if let Ok(Some(next)) = self
            .db("read a checkpoint", move |s| s.latest_checkpoint(&sid))
            .await
        {
            if let Some(live) = self.live_sandbox(id) {
                self.prepare_rollback(&live, &next.id);
            }
        }
        self.inner.metrics.observe_snapshot("rollback", started.elapsed());
        self.get_sandbox(p, id).await
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
        let rollback_row = AuditEntry {
            principal: p,
            tenant: Some(snapshot.tenant.clone()),
            action: "sandbox.rollback",
            sandbox: Some(id),
            outcome: "ok".into(),
            detail: serde_json::json!({ "snapshot": snapshot.id, "consumed": consumed }),
        };
        let rollback_row = match p {
            Some(_) => rollback_row.into_row(),
            // Finished by recovery: the row says so.
            None => rollback_row
                .detail(serde_json::json!({
                    "snapshot": snapshot.id,
                    "consumed": consumed,
                    "recovered": true,
                }))
                .into_row(),
        };
        let consume_row = AuditEntry {
            principal: p,
            tenant: Some(snapshot.tenant.clone()),
            action: "snapshot.consume",
            sandbox: Some(id),
            outcome: "ok".into(),
            detail: serde_json::json!({ "snapshot": snapshot.id, "kind": snapshot.kind.as_str() }),
        }
        .into_row();
        let (sid, snapshot_id) = (id.to_owned(), snapshot.id.clone());
        let dropped = self
            .db("record a rollback", move |s| {
                s.transaction(|tx| {
                    tx.set_sandbox_base_bytes(&sid, base)?;
                    tx.append_audit(&row_with_time(rollback_row))?;
                    let dropped = consumed && tx.mark_snapshot_deleted(&snapshot_id, now_ms())?;
                    if dropped {
                        tx.append_audit(&row_with_time(consume_row))?;
                    }
                    tx.end_intent(intent)?;
                    Ok::<_, StoreError>(dropped)
                })
            })
            .await?;
        if dropped {
            if let Ok(snapshot) = snapshot.id.parse::<SnapshotId>() {
                self.free_snapshot_storage(vec![snapshot]);
            }
        }
        Ok(())
    }

    /// Puts a restarted sandbox's new handle and agent connection in place of `old`, whose handle
    /// lock (`guard`, emptied) the caller held through the restart. The live map is changed only if
    /// it still holds `old`: if an end took it out meanwhile, the new sandbox is destroyed here
    /// (the end found no handle to destroy) and the restart fails with `sandbox_not_running`.
    async fn commit_restart(
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
                    paddock_store::SandboxState::Failed,
                    "rollback_failed",
                    Some(p),
                    "sandbox.lost",
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
