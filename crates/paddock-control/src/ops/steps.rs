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

use std::time::Instant;

use paddock_runtime::fault;
use paddock_store::IntentOp;
use paddock_types::api::{RollbackRequest, SandboxInfo, SnapshotInfo};
use paddock_types::SandboxId;
use paddock_types::SnapshotId;

use crate::core::access::info;
use crate::core::audit::AuditAction;
use crate::core::error::stored_snapshot_id;
use crate::core::service::runtime_error;
use crate::lifecycle::states::Transition;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// `commit`: drops the newest checkpoint (the step is kept).
    pub async fn commit(&self, p: &Principal, id: &SandboxId) -> Result<SnapshotInfo, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let record = self.snapshot_or_checkpoint(p, id, None).await?;
        self.drop_snapshot(Some(p), &record, AuditAction::SandboxCommit)
            .await?;
        self.discard_rollback(&sb);
        Ok(info(&record))
    }

    /// Returns the sandbox's files to one of its snapshots (the newest checkpoint by default, which
    /// this consumes); its processes restart, its id stays.
    pub async fn rollback(
        &self,
        p: &Principal,
        id: &SandboxId,
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
                    Transition::Lose,
                    "rollback_failed",
                    Some(p),
                    AuditAction::SandboxLost,
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
            if let (Some(live), Ok(next)) = (self.live_sandbox(id), stored_snapshot_id(&next.id)) {
                self.prepare_rollback(&live, next);
            }
        }
        self.inner.metrics.observe_snapshot("rollback", started.elapsed());
        self.get_sandbox(p, id).await
    }
}
