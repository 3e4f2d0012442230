//! Pausing and resuming a sandbox: every process frozen (no CPU, memory kept) and thawed, with the
//! state and its audit row recorded.

use paddock_runtime::fault;
use paddock_store::StoreError;
use paddock_types::api::SandboxInfo;
use paddock_types::SandboxId;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::lifecycle::states::Transition;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// Freezes every process of the sandbox (no CPU used, memory kept).
    pub async fn pause_sandbox(&self, p: &Principal, id: &SandboxId) -> Result<SandboxInfo, ServiceError> {
        self.set_frozen(p, id, true).await
    }

    /// Thaws a paused sandbox, or boots a stopped one again on its files. Either way, a timeout that
    /// paused or stopped it starts again.
    pub async fn resume_sandbox(&self, p: &Principal, id: &SandboxId) -> Result<SandboxInfo, ServiceError> {
        let Some(sb) = self.live_sandbox(id) else {
            let record = self.owned_record(p, id).await?;
            if record.state == paddock_store::SandboxState::Stopped {
                return self.resume_stopped(p, id).await;
            }
            return self.set_frozen(p, id, false).await;
        };
        let info = self.set_frozen(p, id, false).await?;
        if info.expires_at.is_none() {
            self.rearm_timeout(id, &sb.spec()).await?;
            return self.get_sandbox(p, id).await;
        }
        Ok(info)
    }

    /// Pauses (`frozen`) or resumes the sandbox; doing what is already done changes nothing.
    async fn set_frozen(
        &self,
        p: &Principal,
        id: &SandboxId,
        frozen: bool,
    ) -> Result<SandboxInfo, ServiceError> {
        let sb = self.owned_live_any(p, id).await?;
        if sb.is_paused() != frozen {
            let what = if frozen {
                "pause a sandbox"
            } else {
                "resume a sandbox"
            };
            self.on_live_handle(&sb, what, move |b, handle| {
                if frozen {
                    b.pause_sandbox(handle)
                } else {
                    b.resume_sandbox(handle)
                }
            })
            .await?;
            sb.set_paused(frozen);
            fault::point(if frozen { "pause.frozen" } else { "pause.thawed" });
            self.record_pause(p, id, frozen).await?;
        }
        self.get_sandbox(p, id).await
    }

    async fn record_pause(&self, p: &Principal, id: &str, paused: bool) -> Result<(), ServiceError> {
        let action = if paused {
            AuditAction::SandboxPause
        } else {
            AuditAction::SandboxResume
        };
        let change = if paused {
            Transition::Pause
        } else {
            Transition::Unpause
        };
        let row = AuditEntry::ok(p, action, Some(id)).into_row();
        let sid = id.to_owned();
        self.db("record a pause", move |s| {
            s.transaction(|tx| {
                // The row is written whether or not the store's flag changed: the backend froze
                // (or thawed) the sandbox either way.
                audit::change_state(tx, change.change(), &sid, None)?;
                audit::append(tx, &row)?;
                Ok::<_, StoreError>(())
            })
        })
        .await
    }
}
