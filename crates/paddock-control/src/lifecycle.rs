//! How sandboxes come and go: booting one on the backend, ending one (state change + audit row,
//! then teardown), recovery after a restart, the reaper, and the warm-pool fillers.

use std::sync::Arc;
use std::time::Duration;

use paddock_runtime::agent_client::AgentClient;
use paddock_runtime::{fault, RuntimeError, SandboxHandle};

use paddock_store::{NewSandbox, SandboxState, StoreError};
use paddock_types::{SandboxId, SandboxSpec, UserSpec};

use crate::live::{LiveSandbox, Ownership, StoredSpec};
use crate::service::{lock, now_ms, AuditEntry};
use crate::snapshots::drop_checkpoints_in;
use crate::{Principal, SandboxService, ServiceError};

/// States a sandbox can be ended from.
pub(crate) const LIVE_STATES: [SandboxState; 3] =
    [SandboxState::Warm, SandboxState::Creating, SandboxState::Running];

pub(crate) fn runtime_error(what: &'static str, e: RuntimeError) -> ServiceError {
    ServiceError::from_runtime(what, e)
}

pub(crate) fn new_sandbox_id() -> SandboxId {
    SandboxId::from_random(rand::random())
}

impl SandboxService {
    /// Creates the sandbox on the backend and connects to its agent.
    pub(crate) async fn boot(
        &self,
        id: &SandboxId,
        spec: &StoredSpec,
        volume: paddock_types::VolumeSource,
    ) -> Result<(SandboxHandle, AgentClient), ServiceError> {
        let template =
            self.inner.config.templates.get(&spec.template).ok_or_else(|| {
                ServiceError::invalid("template", format!("no template {:?}", spec.template))
            })?;
        let user: UserSpec = spec
            .user
            .parse()
            .map_err(|e: paddock_types::UserSpecError| ServiceError::invalid("user", e.to_string()))?;
        // Read once: the backend needs its CA certificate, the proxy all of it.
        let network = if spec.network {
            self.stored_network(id.as_str()).await?
        } else {
            None
        };
        let sandbox_spec = SandboxSpec {
            id: id.clone(),
            limits: spec.limits.clone(),
            rootfs: template.rootfs.clone(),
            mounts: Vec::new(),
            workdir: None,
            user,
            env: Vec::new(),
            volume,
            volumes: spec.volumes.clone(),
            network: network.as_ref().map(|row| self.network_spec(row)).transpose()?,
        };
        let handle = self
            .on_backend("create a sandbox", move |b| b.create_sandbox(&sandbox_spec))
            .await?
            .map_err(|e| runtime_error("create a sandbox", e))?;
        let client = match AgentClient::connect(&handle.agent_socket).await {
            Ok(client) => client,
            Err(e) => {
                let error = ServiceError::internal("connect to a new sandbox's agent", &e);
                self.destroy_handle(handle).await;
                return Err(error);
            }
        };
        if let Err(e) = self.attach_network(&handle, network).await {
            self.destroy_handle(handle).await;
            return Err(e);
        }
        Ok((handle, client))
    }

    /// Tears a sandbox down on the backend (logging, not returning, a failure: the state is already
    /// recorded and gc reclaims leftovers).
    pub(crate) async fn destroy_handle(&self, handle: SandboxHandle) {
        self.tear_down(handle, false).await;
    }

    /// [`Self::destroy_handle`], thawing a paused sandbox first (`thaw`) so that every process can
    /// take its SIGKILL at once.
    async fn tear_down(&self, handle: SandboxHandle, thaw: bool) {
        let id = handle.id.to_string();
        self.detach_network(&handle.id);
        let result = self
            .on_backend("destroy a sandbox", move |b| {
                if thaw {
                    let _ = b.resume_sandbox(&handle);
                }
                b.destroy_sandbox(handle)
            })
            .await;
        if let Ok(Err(e)) = result {
            tracing::warn!(sandbox_id = %id, error = %e, "teardown incomplete; gc will finish it");
        }
    }

    /// Ends a sandbox: records the new state and its audit row in one transaction (with its
    /// checkpoints' deletion: step transactions do not outlive their sandbox), then tears it down.
    /// Returns false when it was not live (already ended, or unknown).
    pub(crate) async fn end_sandbox(
        &self,
        id: &str,
        to: SandboxState,
        reason: &str,
        principal: Option<&Principal>,
        action: &'static str,
    ) -> Result<bool, ServiceError> {
        let live = self.live_sandbox(id);
        let tenant = live.as_ref().and_then(|sb| sb.tenant());
        // The outcome says how the sandbox's life ended: a failure is not `ok`.
        let outcome = match (to, action) {
            (SandboxState::Failed, "sandbox.lost") => "lost",
            (SandboxState::Failed, _) => "error",
            _ => "ok",
        };
        let entry = AuditEntry {
            principal,
            tenant: tenant.or_else(|| principal.map(|p| p.tenant.clone())),
            action,
            sandbox: Some(id),
            outcome: outcome.into(),
            detail: serde_json::json!({ "reason": reason, "state": to.as_str() }),
        }
        .into_row();
        let (sid, reason_owned) = (id.to_owned(), reason.to_owned());
        let (changed, dropped) = self
            .db("record a sandbox's end", move |s| {
                s.transaction(|tx| {
                    let changed =
                        tx.transition_sandbox(&sid, &LIVE_STATES, to, now_ms(), Some(&reason_owned))?;
                    let mut dropped = Vec::new();
                    if changed {
                        tx.append_audit(&row_with_time(entry.clone()))?;
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
            let dead: Vec<String> = lock(&self.inner.live)
                .values()
                .filter(|sb| sb.client.is_closed() && !sb.is_restarting())
                .map(|sb| sb.id.clone())
                .collect();
            for id in dead {
                tracing::warn!(sandbox_id = %id, "sandbox agent is gone");
                if let Err(e) = self
                    .end_sandbox(&id, SandboxState::Failed, "agent_lost", None, "sandbox.lost")
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

    /// Keeps `template`'s warm pool at its configured size until the service stops.
    pub(crate) async fn run_pool_filler(self, template: String) {
        let target = self.inner.config.templates[&template].warm_pool_size as usize;
        self.inner.metrics.set_pool_target(&template, target as i64);
        loop {
            if self.inner.stop.is_cancelled() {
                break;
            }
            let have = self.warm_count(&template);
            self.inner.metrics.set_pool_size(&template, have as i64);
            if have < target {
                if let Err(e) = self.create_warm(&template).await {
                    tracing::warn!(template = %template, error = %e, "warm pool refill failed");
                    tokio::select! {
                        () = self.inner.stop.cancelled() => break,
                        () = tokio::time::sleep(Duration::from_secs(2)) => {}
                    }
                }
                continue;
            }
            tokio::select! {
                () = self.inner.stop.cancelled() => break,
                () = self.inner.pool_wakeup.notified() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    pub(crate) fn warm_count(&self, template: &str) -> usize {
        lock(&self.inner.live)
            .values()
            .filter(|sb| sb.is_warm() && sb.spec().template == template)
            .count()
    }

    async fn create_warm(&self, template: &str) -> Result<(), ServiceError> {
        let id = new_sandbox_id();
        let spec = StoredSpec {
            template: template.to_owned(),
            limits: self.inner.config.default_limits.clone(),
            env: Default::default(),
            workdir: None,
            user: UserSpec::default_user().to_string(),
            on_timeout: Default::default(),
            audit_exec_diff: false,
            timeout_ms: None,
            volumes: Vec::new(),
            network: false,
        };
        let new = NewSandbox {
            id: id.to_string(),
            tenant: None,
            state: SandboxState::Creating,
            profile: template.to_owned(),
            spec_json: serde_json::to_string(&spec)
                .map_err(|e| ServiceError::internal("encode a spec", &e))?,
            labels: Default::default(),
            memory_bytes: 0,
            cpu_millis: 0,
            disk_bytes: crate::quota::sandbox_storage(&spec.limits, 0),
            base_bytes: 0,
            created_at_ms: now_ms(),
            expires_at_ms: None,
        };
        self.db("record a warm sandbox", move |s| s.insert_sandbox(&new))
            .await?;
        let (handle, client) = match self.boot(&id, &spec, paddock_types::VolumeSource::Template).await {
            Ok(booted) => booted,
            Err(e) => {
                self.mark_lost(id.as_str(), None, "warm pool boot failed").await?;
                return Err(e);
            }
        };
        let owner = Ownership { tenant: None, spec };
        let sb = Arc::new(LiveSandbox::new(id.to_string(), client, handle, owner));
        lock(&self.inner.live).insert(id.to_string(), sb);
        let sid = id.to_string();
        let ready = self
            .db("record a warm sandbox", move |s| {
                s.transition_sandbox(
                    &sid,
                    &[SandboxState::Creating],
                    SandboxState::Warm,
                    now_ms(),
                    None,
                )
            })
            .await;
        if !matches!(ready, Ok(true)) {
            self.end_sandbox(
                id.as_str(),
                SandboxState::Failed,
                "warm pool boot failed",
                None,
                "sandbox.lost",
            )
            .await?;
        }
        Ok(())
    }
}

/// Audit rows written inside a caller's transaction get their time when written.
pub(crate) fn row_with_time(mut row: paddock_store::NewAuditEntry) -> paddock_store::NewAuditEntry {
    row.ts_ms = now_ms();
    row
}
