//! Booting a sandbox on the backend (and connecting to its agent), recording a booted sandbox, and
//! tearing one down. Ending one is `end.rs`; recovery, the reaper and warm pools have their own
//! modules.

use std::sync::Arc;

use paddock_runtime::agent_client::AgentClient;
use paddock_runtime::{fault, SandboxHandle};
use paddock_store::{NewSandbox, SandboxState, VolumeMountRecord};
use paddock_types::api::{ErrorCode, SandboxInfo};
use paddock_types::{SandboxId, SandboxSpec, UserSpec};

use crate::core::access::info_from_record;
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::{lock, LiveSandbox, Ownership, StoredSpec};
use crate::core::service::{new_sandbox_id, runtime_error};
use crate::core::time::now_ms;
use crate::lifecycle::states::Transition;
use crate::plan::create::{encode_spec, CreatePlan};
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// Creates the sandbox on the backend and connects to its agent.
    pub(crate) async fn boot(
        &self,
        id: &SandboxId,
        spec: &StoredSpec,
        volume: paddock_types::VolumeSource,
    ) -> Result<(SandboxHandle, AgentClient), ServiceError> {
        let rootfs = match &spec.template_id {
            Some(id) => paddock_types::RootfsSpec::Image {
                template: id
                    .parse()
                    .map_err(|e| ServiceError::internal("parse a template id", &e))?,
            },
            None => self
                .inner
                .config
                .templates
                .get(&spec.template)
                .ok_or_else(|| ServiceError::invalid("template", format!("no template {:?}", spec.template)))?
                .rootfs
                .clone(),
        };
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
            rootfs,
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
        match self.run_start_command(id, spec, handle, &client).await {
            (Some(handle), Ok(())) => Ok((handle, client)),
            (Some(handle), Err(e)) => {
                self.destroy_handle(handle).await;
                Err(e)
            }
            // A backend task panicked holding the handle: the sandbox is garbage for gc.
            (None, result) => Err(result.err().unwrap_or_else(|| {
                ServiceError::internal("start a sandbox's start command", &"the handle was lost")
            })),
        }
    }

    /// Tears a sandbox down on the backend (logging, not returning, a failure: the state is already
    /// recorded and gc reclaims leftovers).
    pub(crate) async fn destroy_handle(&self, handle: SandboxHandle) {
        self.tear_down(handle, false).await;
    }

    /// [`Self::destroy_handle`], thawing a paused sandbox first (`thaw`) so that every process can
    /// take its SIGKILL at once.
    pub(crate) async fn tear_down(&self, handle: SandboxHandle, thaw: bool) {
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

    /// Records a new sandbox (`creating`) for `p`'s tenant and boots it on `volume`; the sandbox and
    /// its `sandbox.create` row, which [`Self::commit_created`] writes when it moves to `running`.
    /// Until then a crash leaves a sandbox nobody was told about, which recovery removes.
    pub(crate) async fn boot_recorded(
        &self,
        p: &Principal,
        plan: CreatePlan,
        volume: paddock_types::VolumeSource,
        base_bytes: u64,
    ) -> Result<(SandboxId, paddock_store::NewAuditEntry), ServiceError> {
        let ids = self
            .record_creating(p, std::slice::from_ref(&plan), base_bytes)
            .await?;
        let id = ids
            .into_iter()
            .next()
            .ok_or_else(|| ServiceError::internal("record a new sandbox", &"no id was recorded"))?;
        self.boot_record(p, id, plan, volume).await
    }

    /// Records one new sandbox (`creating`) per plan for `p`'s tenant, all in one transaction (all
    /// or none; a fork's copies then start booting together); their ids, in the plans' order. Each
    /// sandbox's volume mounts and network are recorded with it, each volume checked to still exist
    /// in the same transaction (a concurrent delete either sees the mount or wins).
    pub(crate) async fn record_creating(
        &self,
        p: &Principal,
        plans: &[CreatePlan],
        base_bytes: u64,
    ) -> Result<Vec<SandboxId>, ServiceError> {
        let now = now_ms();
        let mut ids = Vec::with_capacity(plans.len());
        let mut rows = Vec::with_capacity(plans.len());
        for plan in plans {
            let id = new_sandbox_id();
            let new = NewSandbox {
                id: id.to_string(),
                tenant: Some(p.tenant.clone()),
                state: SandboxState::Creating,
                profile: plan.spec.template.clone(),
                spec_json: encode_spec(&plan.spec)?,
                labels: plan.labels.clone(),
                memory_bytes: plan.memory_bytes,
                cpu_millis: plan.cpu_millis,
                disk_bytes: crate::core::quota::sandbox_storage(&plan.spec.limits, 0),
                base_bytes,
                created_at_ms: now,
                expires_at_ms: Some(now + plan.timeout_ms),
            };
            let mounts: Vec<_> = plan
                .spec
                .volumes
                .iter()
                .map(|v| VolumeMountRecord {
                    sandbox_id: id.to_string(),
                    volume_id: v.volume.to_string(),
                    path: v.path.to_string(),
                    read_only: v.read_only,
                })
                .collect();
            let network = plan
                .network
                .as_ref()
                .map(|n| Self::network_record(&id, n))
                .transpose()?;
            ids.push(id);
            rows.push((new, mounts, network));
        }
        let tenant = p.tenant.clone();
        let defaults = self.quota_defaults();
        self.db("record a new sandbox", move |s| {
            s.transaction(|tx| {
                for (new, mounts, network) in &rows {
                    tx.insert_sandbox_checked(new, &defaults)?;
                    for m in mounts {
                        tx.insert_volume_mount(&tenant, m)?;
                    }
                    if let Some(n) = network {
                        tx.put_sandbox_network(n)?;
                    }
                }
                Ok::<_, paddock_store::StoreError>(())
            })
        })
        .await?;
        for _ in &ids {
            fault::point("create.recorded");
        }
        Ok(ids)
    }

    /// Boots sandbox `id`, recorded `creating` by [`Self::record_creating`], on `volume`; the
    /// sandbox and its `sandbox.create` row (see [`Self::boot_recorded`]). A failed boot ends the
    /// record (`failed`).
    pub(crate) async fn boot_record(
        &self,
        p: &Principal,
        id: SandboxId,
        plan: CreatePlan,
        volume: paddock_types::VolumeSource,
    ) -> Result<(SandboxId, paddock_store::NewAuditEntry), ServiceError> {
        let source = match &volume {
            paddock_types::VolumeSource::Snapshot(s) => format!("snapshot {s}"),
            paddock_types::VolumeSource::Sandbox(s) => format!("fork of {s}"),
            paddock_types::VolumeSource::Template | paddock_types::VolumeSource::Stopped => "boot".to_owned(),
        };
        let (handle, client) = match self.boot(&id, &plan.spec, volume).await {
            Ok(booted) => booted,
            Err(e) => {
                let reason = format!("create_failed: {}", e.message);
                self.end_sandbox(
                    id.as_str(),
                    Transition::Fail,
                    &reason,
                    Some(p),
                    AuditAction::SandboxCreate,
                )
                .await?;
                return Err(e);
            }
        };
        let owner = Ownership {
            tenant: Some(p.tenant.clone()),
            spec: plan.spec.clone(),
        };
        let sb = Arc::new(LiveSandbox::new(id.clone(), client, handle, owner));
        lock(&self.inner.live).insert(id.clone(), sb);
        let entry = AuditEntry::ok(p, AuditAction::SandboxCreate, Some(id.as_str()))
            .detail(audit::Booted {
                template: plan.spec.template.clone(),
                source,
                volumes: plan.spec.volumes.iter().map(|v| v.volume.to_string()).collect(),
            })
            .into_row();
        fault::point("create.booted");
        Ok((id, entry))
    }

    /// Moves booted sandbox `id` from `creating` to `running` with its `sandbox.create` row.
    pub(crate) async fn commit_created(
        &self,
        p: &Principal,
        id: &str,
        entry: paddock_store::NewAuditEntry,
    ) -> Result<SandboxInfo, ServiceError> {
        let sid = id.to_string();
        let record = self
            .db("record a started sandbox", move |s| {
                s.transaction(|tx| {
                    audit::record(tx, Transition::Boot.change(), &sid, None, &entry)?;
                    Ok::<_, paddock_store::StoreError>(())
                })?;
                s.get_sandbox(&sid)
            })
            .await?;
        match record {
            Some(r) if r.state == SandboxState::Running => Ok(info_from_record(&r)),
            _ => {
                self.end_sandbox(
                    id,
                    Transition::Lose,
                    "recording failed",
                    Some(p),
                    AuditAction::SandboxLost,
                )
                .await?;
                Err(ServiceError::new(
                    ErrorCode::Internal,
                    "the sandbox could not be recorded",
                ))
            }
        }
    }
}
