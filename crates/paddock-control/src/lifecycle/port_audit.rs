//! The task that writes the later rows of port connections (aggregates of repeats, suppressed
//! counts) that `core/audit/ports.rs` decides on.

use std::time::Duration;

use crate::core::live::lock;
use crate::core::time::now_ms;
use crate::SandboxService;

/// How often ended windows are written.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

impl SandboxService {
    /// Writes the rows of ended windows every second until the service stops, then every row held.
    pub(crate) async fn run_port_audit(self) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let stopping = tokio::select! {
                _ = tick.tick() => false,
                () = self.inner.stop.cancelled() => true,
            };
            let mut rows = Vec::new();
            {
                let mut audit = lock(&self.inner.port_audit);
                if stopping {
                    audit.drain(now_ms(), &mut rows);
                } else {
                    audit.flush(now_ms(), &mut rows);
                }
            }
            if !rows.is_empty() {
                let n = rows.len();
                if let Err(e) = self
                    .db("write port audit rows", move |s| {
                        s.append_audit_batch(&rows).map(|_| ())
                    })
                    .await
                {
                    tracing::error!(error = %e.message, rows = n, "port connection audit rows lost");
                }
            }
            if stopping {
                return;
            }
        }
    }
}
