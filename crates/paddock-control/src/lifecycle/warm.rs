//! Warm pools: booting sandboxes ahead of demand, per template, up to the configured size.

use std::sync::Arc;
use std::time::{Duration, Instant};

use paddock_store::{NewSandbox, SandboxState};
use paddock_types::UserSpec;

use crate::core::activity::refill_wait;
use crate::core::audit::{self, AuditAction};
use crate::core::live::{lock, LiveSandbox, Ownership, StoredSpec};
use crate::core::service::new_sandbox_id;
use crate::core::time::now_ms;
use crate::lifecycle::states::Transition;
use crate::{SandboxService, ServiceError};

impl SandboxService {
    /// Keeps `template`'s warm pool at its configured size until the service stops.
    pub(crate) async fn run_pool_filler(self, template: String) {
        let target = self.inner.config.templates[&template].warm_pool_size as usize;
        self.inner.metrics.set_pool_target(&template, target as i64);
        // Since when the pool has been short of its target (refills yield to requests: see
        // `core::activity`).
        let mut due_since: Option<Instant> = None;
        loop {
            if self.inner.stop.is_cancelled() {
                break;
            }
            let have = self.warm_count(&template);
            self.inner.metrics.set_pool_size(&template, have as i64);
            // A template the server builds fills once built (its builder wakes the fillers).
            let built = !self.inner.config.templates[&template].is_built()
                || lock(&self.inner.built_templates).contains_key(&template);
            if have < target && built {
                let due = *due_since.get_or_insert_with(Instant::now);
                let wait = refill_wait(due.elapsed(), self.inner.activity.since_last(), have);
                if !wait.is_zero() {
                    tokio::select! {
                        () = self.inner.stop.cancelled() => break,
                        () = tokio::time::sleep(wait) => {}
                    }
                    continue;
                }
                due_since = None;
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
        // A built template's defaults, as a create with no env, workdir or user would get them.
        let built = if self.inner.config.templates[template].is_built() {
            Some(self.configured_template(template).await?)
        } else {
            None
        };
        let mut request = paddock_types::api::CreateSandboxRequest::default();
        if let Some(image) = &built {
            crate::plan::create::apply_image_defaults(&mut request, &image.detail.built.config);
        }
        let image_command = built.as_ref().and_then(|b| b.detail.built.config.start_command());
        let prefetch = crate::plan::warm::prefetch_paths(&request.env, image_command.as_deref());
        let spec = StoredSpec {
            template_id: built.as_ref().map(|b| b.id.to_string()),
            start: built.and_then(|b| b.detail.start),
            template: template.to_owned(),
            limits: self.inner.config.default_limits.clone(),
            env: request.env,
            workdir: request.workdir,
            user: request
                .user
                .unwrap_or_else(|| UserSpec::default_user().to_string()),
            on_timeout: Default::default(),
            audit_exec_diff: false,
            timeout_ms: None,
            volumes: Vec::new(),
            network: false,
            public_ports: false,
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
            disk_bytes: crate::core::quota::sandbox_storage(&spec.limits, 0),
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
        // Read ahead what its first command will read (see `plan::warm`). Only an optimisation:
        // a failure is logged and the sandbox is pooled all the same.
        if let Err(e) = client.prefetch(&prefetch).await {
            tracing::warn!(sandbox_id = %id, error = %e, "warm sandbox prefetch failed");
        }
        let owner = Ownership { tenant: None, spec };
        let sb = Arc::new(LiveSandbox::new(id.clone(), client, handle, owner));
        self.start_warm_kernels(template, &sb).await;
        lock(&self.inner.live).insert(id.clone(), sb);
        let sid = id.to_string();
        let ready = self
            .db("record a warm sandbox", move |s| {
                // No audit row: a warm sandbox belongs to no tenant until it is claimed.
                s.transaction(|tx| audit::change_state(tx, Transition::Warm.change(), &sid, None))
            })
            .await;
        if !matches!(ready, Ok(true)) {
            self.end_sandbox(
                id.as_str(),
                Transition::Lose,
                "warm pool boot failed",
                None,
                AuditAction::SandboxLost,
            )
            .await?;
        }
        Ok(())
    }

    /// Starts the default contexts `[templates.NAME] kernels` names in a warm sandbox, so a
    /// claim's first cell finds its kernel running. A kernel that fails is logged and left out
    /// (the first cell then starts it, and says why if it fails again).
    async fn start_warm_kernels(&self, template: &str, sb: &Arc<LiveSandbox>) {
        for language in &self.inner.config.templates[template].kernels {
            let Some(kernel) = crate::plan::code::kernel_for(Some(language)) else {
                continue;
            };
            let mut contexts = sb.contexts.lock().await;
            if let Err(e) = self.start_default_context(sb, &mut contexts, kernel).await {
                tracing::warn!(sandbox_id = %sb.id, language, error = %e, "a warm sandbox's kernel did not start");
            }
        }
    }
}
