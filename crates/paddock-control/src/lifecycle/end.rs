//! Ending a sandbox (killed, expired, failed, lost): the state change and its audit row in one
//! transaction, its checkpoints dropped, then its teardown.

use paddock_runtime::fault;
use paddock_store::{SandboxState, StoreError};
use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::lock;
use crate::lifecycle::states::Transition;
use crate::lifecycle::storage::drop_checkpoints_in;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// Ends a sandbox: records the new state and its audit row in one transaction (with its
    /// checkpoints' deletion: step transactions do not outlive their sandbox), then tears it down.
    /// Returns false when it was not live (already ended, or unknown). `end`: one of the table's
    /// endings of a live sandbox (kill, expire, fail, lose).
    pub(crate) async fn end_sandbox(
        &self,
        id: &str,
        end: Transition,
        reason: &str,
        principal: Option<&Principal>,
        action: AuditAction,
    ) -> Result<bool, ServiceError> {
        let to = end.to();
        debug_assert!(to.is_ended(), "{end:?} does not end a sandbox");
        let live = self.live_sandbox(id);
        let tenant = live.as_ref().and_then(|sb| sb.tenant());
        // The outcome says how the sandbox's life ended: a failure is not `ok`.
        let outcome = match (to, action) {
            (SandboxState::Failed, AuditAction::SandboxLost) => "lost",
            (SandboxState::Failed, _) => "error",
            _ => "ok",
        };
        let entry = AuditEntry::by(
            principal,
            tenant.or_else(|| principal.map(|p| p.tenant.clone())),
            action,
            Some(id),
        )
        .outcome(outcome)
        .detail(audit::Ended {
            reason: reason.to_owned(),
            state: to.as_str(),
        })
        .into_row();
        let (sid, reason_owned) = (id.to_owned(), reason.to_owned());
        let (changed, dropped) = self
            .db("record a sandbox's end", move |s| {
                s.transaction(|tx| {
                    let changed = audit::record(tx, end.change(), &sid, Some(&reason_owned), &entry)?;
                    let mut dropped = Vec::new();
                    if changed {
                        dropped = drop_checkpoints_in(tx, &sid, &entry)?;
                    }
                    Ok::<_, StoreError>((changed, dropped))
                })
            })
            .await?;
        fault::point("end.recorded");
        let removed = lock(&self.inner.live).remove(id);
        if let Some(sb) = removed {
            let handle = sb.handle.lock().await.take();
            if let Some(handle) = handle {
                self.tear_down(handle, sb.is_paused()).await;
            }
        }
        self.free_snapshot_storage(dropped);
        if changed {
            self.inner.metrics.sandbox_ended(to.as_str());
        }
        Ok(changed)
    }

    /// Kills the sandbox and removes everything of it.
    #[tracing::instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn kill_sandbox(&self, p: &Principal, id: &SandboxId) -> Result<(), ServiceError> {
        let record = self.owned_record(p, id).await?;
        self.refuse_recovering(id)?;
        if Transition::KillStopped.allows(record.state) {
            return self.kill_stopped(p, id).await;
        }
        if !Transition::Kill.allows(record.state) {
            return Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {id} is already {}", record.state.as_str()),
            ));
        }
        let ended = self
            .end_sandbox(id, Transition::Kill, "killed", Some(p), AuditAction::SandboxKill)
            .await?;
        if !ended {
            // A stop finished in between: it is a stopped sandbox now, killed as one.
            let record = self.owned_record(p, id).await?;
            if record.state == SandboxState::Stopped {
                return self.kill_stopped(p, id).await;
            }
        }
        Ok(())
    }
}
