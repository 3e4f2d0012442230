//! The reaper: expires sandboxes whose timeout passed (or pauses or stops them, as asked), ends
//! those whose agent died, expires approvals no one decided in time, and purges old history.

use std::time::Duration;

use crate::core::audit::AuditAction;
use crate::core::live::lock;
use crate::core::time::now_ms;
use crate::lifecycle::states::Transition;
use crate::SandboxService;
use paddock_types::SandboxId;

impl SandboxService {
    /// Kills expired sandboxes and ends those whose agent died, until the service stops.
    pub(crate) async fn run_reaper(self) {
        let mut tick = tokio::time::interval(self.inner.config.reaper_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_purge = std::time::Instant::now();
        loop {
            tokio::select! {
                () = self.inner.stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let now = now_ms();
            match self
                .db("list expired sandboxes", move |s| s.expired_sandboxes(now))
                .await
            {
                Ok(expired) => {
                    for record in expired {
                        if self.refuse_recovering(&record.id).is_err() {
                            // Its timeout is seen to once it is recovered.
                            continue;
                        }
                        if let Err(e) = self.on_timeout(&record.id).await {
                            tracing::warn!(sandbox_id = %record.id, error = %e, "reaping failed");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "reaper cannot read the store"),
            }
            if let Err(e) = self.sweep_approvals().await {
                tracing::warn!(error = %e, "expiring approvals failed");
            }
            let dead: Vec<SandboxId> = lock(&self.inner.live)
                .values()
                .filter(|sb| sb.client.is_closed() && !sb.is_restarting())
                .map(|sb| sb.id.clone())
                .collect();
            for id in dead {
                tracing::warn!(sandbox_id = %id, "sandbox agent is gone");
                if let Err(e) = self
                    .end_sandbox(
                        &id,
                        Transition::Lose,
                        "agent_lost",
                        None,
                        AuditAction::SandboxLost,
                    )
                    .await
                {
                    tracing::warn!(sandbox_id = %id, error = %e, "ending a dead sandbox failed");
                }
            }
            if last_purge.elapsed() > Duration::from_secs(3600) {
                last_purge = std::time::Instant::now();
                let before = now_ms() - self.inner.config.history_retention.as_millis() as i64;
                if let Err(e) = self
                    .db("purge history", move |s| s.purge_ended_sandboxes(before))
                    .await
                {
                    tracing::warn!(error = %e, "purging ended sandboxes failed");
                }
            }
        }
    }
}
