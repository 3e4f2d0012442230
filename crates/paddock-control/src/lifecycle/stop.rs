//! Stopping a sandbox (its processes end, its files are kept) and resuming it; what a timeout does
//! besides killing (`on_timeout: pause | stop`).
//!
//! A stopped sandbox holds no processes, cgroups or run directory: only its file system, kept by the
//! backend outside garbage collection's reach, and its store record (state `stopped`, no expiry). It
//! survives server restarts. It still counts against the tenant's `max_sandboxes` and `max_storage`
//! (it holds its files and a tenant may resume it at will), not its memory and CPU quotas: resuming
//! boots it again with the same id on the same files once those admit it. A sandbox
//! paused or stopped by its timeout does not expire again until it is resumed, which restarts its
//! timeout.

use std::sync::Arc;

use paddock_runtime::fault;
use paddock_store::{IntentOp, StoreError};
use paddock_types::api::{ErrorCode, OnTimeout, SandboxInfo};
use paddock_types::{SandboxId, VolumeSource};

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::{lock, LiveSandbox, Ownership, StoredSpec};
use crate::core::service::runtime_error;
use crate::core::time::now_ms;
use crate::lifecycle::states::Transition;
use crate::lifecycle::storage::drop_checkpoints_in;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// Stops a running (or paused) sandbox: its processes end, its files are kept.
    pub async fn stop_sandbox(&self, p: &Principal, id: &SandboxId) -> Result<SandboxInfo, ServiceError> {
        let sb = self.owned_live_any(p, id).await?;
        self.stop_live(Some(p), &sb, "stop").await?;
        self.get_sandbox(p, id).await
    }

    /// Stops live sandbox `sb` (`cause`: `stop` on request, `timeout` by the reaper).
    pub(crate) async fn stop_live(
        &self,
        principal: Option<&Principal>,
        sb: &Arc<LiveSandbox>,
        cause: &'static str,
    ) -> Result<(), ServiceError> {
        // Its agent goes away on purpose: the reaper must not take it for a death.
        sb.set_restarting(true);
        // Held until the backend is done: an operation that restarts the sandbox (a rollback) is
        // either finished or not begun.
        let mut guard = sb.handle.lock().await;
        let handle = guard.take().ok_or_else(|| ServiceError::sandbox_ending(&sb.id))?;
        // Before the first irreversible step: a crash from here on is finished by recovery.
        let intent = match self
            .begin_intent(
                &sb.id,
                IntentOp::Stop,
                None,
                serde_json::json!({ "cause": cause }),
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
        fault::point("stop.intent_recorded");
        {
            let mut live = lock(&self.inner.live);
            if live.get(&sb.id).is_some_and(|current| Arc::ptr_eq(current, sb)) {
                live.remove(&sb.id);
            }
        }
        self.detach_network(&handle.id);
        let stopped = self
            .on_backend("stop a sandbox", move |b| b.stop_sandbox(handle))
            .await;
        drop(guard);
        let stopped = stopped?;
        if let Err(e) = stopped {
            let error = runtime_error("stop a sandbox", e);
            self.end_sandbox(
                &sb.id,
                Transition::Lose,
                "stop_failed",
                principal,
                AuditAction::SandboxLost,
            )
            .await?;
            self.end_intent(intent).await;
            return Err(error);
        }
        fault::point("stop.done");
        let entry = AuditEntry::by(principal, sb.tenant(), AuditAction::SandboxStop, Some(&sb.id))
            .detail(audit::Cause { cause })
            .into_row();
        let sid = sb.id.clone();
        let recorded = self
            .db("record a stop", move |s| {
                s.transaction(|tx| {
                    let stopped = audit::record(tx, Transition::Stop.change(), &sid, None, &entry)?;
                    if stopped {
                        tx.set_sandbox_expiry(&sid, None)?;
                    }
                    tx.end_intent(intent)?;
                    Ok::<_, StoreError>(stopped)
                })
            })
            .await?;
        if !recorded {
            // Ended (killed, expired) while it was stopping: the files it kept go with it.
            self.free_stopped(sb.id.clone()).await;
            return Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {} ended while it was being stopped", sb.id),
            ));
        }
        self.inner.metrics.sandbox_ended("stopped");
        Ok(())
    }

    /// Boots stopped sandbox `id` again on its kept files.
    pub(crate) async fn resume_stopped(
        &self,
        p: &Principal,
        id: &SandboxId,
    ) -> Result<SandboxInfo, ServiceError> {
        let record = self.owned_record(p, id).await?;
        let spec: StoredSpec = serde_json::from_str(&record.spec_json)
            .map_err(|e| ServiceError::internal("decode a sandbox spec", &e))?;
        let sandbox_id = id.clone();
        // Its limits were checked when it was created; the server's maxima may have been lowered since.
        crate::plan::create::check_limits(&spec.limits, &self.inner.config.max_limits)?;
        // Written before the state changes: from `creating` on, a crash is undone by recovery
        // (the sandbox is stopped again, its files kept).
        let intent = self
            .begin_intent(id, IntentOp::Resume, None, serde_json::json!({}))
            .await?;
        let (sid, tenant, defaults) = (id.to_owned(), p.tenant.clone(), self.quota_defaults());
        let admitted = match self
            .db("resume a stopped sandbox", move |s| {
                // The state table's `Readmit` (stopped → creating), applied by the store with the
                // quota check.
                s.resume_stopped_checked(&sid, &tenant, &defaults)
            })
            .await
        {
            Ok(admitted) => admitted,
            Err(e) => {
                self.end_intent(intent).await;
                // Refusals are recorded too.
                return self
                    .audit_refusal(p, AuditAction::SandboxResume, Some(id), Err(e))
                    .await;
            }
        };
        if !admitted {
            self.end_intent(intent).await;
            return Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {id} is {}", record.state.as_str()),
            ));
        }
        fault::point("resume.admitted");
        let (handle, client) = match self.boot(&sandbox_id, &spec, VolumeSource::Stopped).await {
            Ok(booted) => booted,
            Err(e) => {
                // Its files are kept (the backend puts them back): it is stopped again, not lost.
                let row = AuditEntry::ok(p, AuditAction::SandboxResume, Some(id))
                    .outcome(format!("error: {}", e.message))
                    .into_row();
                let sid = id.to_owned();
                let kept = self
                    .db("record a failed resume", move |s| {
                        s.transaction(|tx| {
                            // The failed resume is recorded whether or not it is kept.
                            let kept = audit::change_state(tx, Transition::Restop.change(), &sid, None)?;
                            audit::append(tx, &row)?;
                            tx.end_intent(intent)?;
                            Ok::<_, StoreError>(kept)
                        })
                    })
                    .await?;
                if !kept {
                    // Killed while it was resuming: the files put back go too.
                    self.free_stopped(sandbox_id).await;
                }
                return Err(e);
            }
        };
        fault::point("resume.booted");
        let expires = self.restarted_timeout(&spec);
        let owner = Ownership {
            tenant: Some(p.tenant.clone()),
            spec,
        };
        let sb = Arc::new(LiveSandbox::new(id.to_owned(), client, handle, owner));
        lock(&self.inner.live).insert(id.to_owned(), sb);
        let row = AuditEntry::ok(p, AuditAction::SandboxResume, Some(id))
            .detail(audit::Resumed { from: "stopped" })
            .into_row();
        let sid = id.to_owned();
        let started = self
            .db("record a resumed sandbox", move |s| {
                s.transaction(|tx| {
                    let started = audit::record(tx, Transition::Boot.change(), &sid, None, &row)?;
                    if started {
                        tx.set_sandbox_expiry(&sid, Some(expires))?;
                    }
                    tx.end_intent(intent)?;
                    Ok::<_, StoreError>(started)
                })
            })
            .await?;
        if !started {
            self.end_sandbox(
                id,
                Transition::Lose,
                "recording failed",
                Some(p),
                AuditAction::SandboxLost,
            )
            .await?;
            return Err(ServiceError::new(
                ErrorCode::Internal,
                "the sandbox could not be recorded",
            ));
        }
        self.get_sandbox(p, id).await
    }

    /// Restarts the timeout of a sandbox that a timeout paused (it has no expiry while paused).
    pub(crate) async fn rearm_timeout(&self, id: &str, spec: &StoredSpec) -> Result<(), ServiceError> {
        let expires = self.restarted_timeout(spec);
        let sid = id.to_owned();
        self.db("restart a timeout", move |s| {
            let record = s.get_sandbox(&sid)?;
            if record.is_some_and(|r| r.expires_at_ms.is_none()) {
                s.set_sandbox_expiry(&sid, Some(expires))?;
            }
            Ok::<_, StoreError>(())
        })
        .await
    }

    /// When a timeout restarted now ends: the sandbox's own timeout, or the server's default for one
    /// created before timeouts were recorded.
    fn restarted_timeout(&self, spec: &StoredSpec) -> i64 {
        now_ms()
            + spec
                .timeout_ms
                .unwrap_or(self.inner.config.default_timeout.as_millis() as i64)
    }

    /// Deletes a stopped sandbox: its kept files go, its record ends as `killed`.
    pub(crate) async fn kill_stopped(&self, p: &Principal, id: &SandboxId) -> Result<(), ServiceError> {
        let row = AuditEntry::ok(p, AuditAction::SandboxKill, Some(id))
            .detail(audit::EndedStopped {
                reason: "killed",
                state: "killed",
                from: "stopped",
            })
            .into_row();
        let sid = id.to_owned();
        let (changed, dropped) = self
            .db("record a sandbox's end", move |s| {
                s.transaction(|tx| {
                    let changed =
                        audit::record(tx, Transition::KillStopped.change(), &sid, Some("killed"), &row)?;
                    let mut dropped = Vec::new();
                    if changed {
                        dropped = drop_checkpoints_in(tx, &sid, &row)?;
                    }
                    Ok::<_, StoreError>((changed, dropped))
                })
            })
            .await?;
        self.free_snapshot_storage(dropped);
        if !changed {
            return Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {id} is not stopped any more"),
            ));
        }
        self.free_stopped(id.clone()).await;
        Ok(())
    }

    /// What the reaper does with live sandbox `record_id` whose timeout passed.
    pub(crate) async fn on_timeout(&self, id: &str) -> Result<(), ServiceError> {
        let live = self.live_sandbox(id);
        let action = live.as_ref().map(|sb| sb.spec().on_timeout).unwrap_or_default();
        match (action, live) {
            (OnTimeout::Pause, Some(sb)) => {
                if !sb.is_paused() {
                    self.on_live_handle(&sb, "pause a sandbox", |b, handle| b.pause_sandbox(handle))
                        .await?;
                    sb.set_paused(true);
                }
                let entry = AuditEntry::system(AuditAction::SandboxPause, sb.tenant(), Some(id))
                    .detail(audit::Cause { cause: "timeout" })
                    .into_row();
                let sid = id.to_owned();
                self.db("record a timeout pause", move |s| {
                    s.transaction(|tx| {
                        // Recorded whether or not the store's flag changed: the sandbox is frozen.
                        audit::change_state(tx, Transition::Pause.change(), &sid, None)?;
                        tx.set_sandbox_expiry(&sid, None)?;
                        audit::append(tx, &entry)?;
                        Ok::<_, StoreError>(())
                    })
                })
                .await
            }
            (OnTimeout::Stop, Some(sb)) => self.stop_live(None, &sb, "timeout").await,
            _ => self
                .end_sandbox(
                    id,
                    Transition::Expire,
                    "expired",
                    None,
                    AuditAction::SandboxExpire,
                )
                .await
                .map(drop),
        }
    }
}
