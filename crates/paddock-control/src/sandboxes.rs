//! Sandbox lifecycle operations: create (claim or boot), get, list, timeout, kill, usage.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use paddock_runtime::fault;
use paddock_store::{Claim, NewSandbox, SandboxFilter, SandboxRecord, SandboxState, VolumeMountRecord};
use paddock_types::api::{
    CreateSandboxRequest, ErrorCode, LimitsRequest, ListSandboxesQuery, SandboxInfo, SandboxList,
    SandboxStateBody, SandboxUsageBody, SetTimeoutRequest, TemplateInfo, TemplateList, VolumeMountInfo,
};
use paddock_types::{EnvVar, Limits, SandboxId, SandboxPath, UserSpec};

use crate::lifecycle::{new_sandbox_id, row_with_time, runtime_error};
use crate::live::{LiveSandbox, Ownership, StoredSpec};
use crate::service::{lock, now_ms, rfc3339, AuditEntry};
use crate::{Principal, SandboxService, ServiceError};

/// The template every server has.
pub(crate) const DEFAULT_TEMPLATE: &str = "default";
const MAX_LABELS: usize = 64;
const MAX_LABEL_LEN: usize = 256;
const MAX_ENV: usize = 1024;

/// A validated create request.
pub(crate) struct CreatePlan {
    spec: StoredSpec,
    labels: BTreeMap<String, String>,
    timeout_ms: i64,
    memory_bytes: u64,
    cpu_millis: u32,
    /// Its network, when it has one.
    network: Option<crate::network::NetworkPlan>,
}

impl SandboxService {
    /// Creates a sandbox (a claim from the template's warm pool when one is ready).
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant))]
    pub async fn create_sandbox(
        &self,
        p: &Principal,
        req: CreateSandboxRequest,
    ) -> Result<SandboxInfo, ServiceError> {
        let started = Instant::now();
        let result = self.create_planned(p, req, started).await;
        if let Err(e) = &result {
            // Refusals are recorded too (a failed boot already wrote its own row).
            if matches!(e.code, ErrorCode::QuotaExceeded | ErrorCode::InvalidRequest) {
                let entry = AuditEntry::ok(p, "sandbox.create", None)
                    .outcome(e.code.as_str())
                    .detail(serde_json::json!({ "field": e.field, "message": e.message }));
                self.audit(entry).await?;
            }
        }
        result
    }

    async fn create_planned(
        &self,
        p: &Principal,
        req: CreateSandboxRequest,
        started: Instant,
    ) -> Result<SandboxInfo, ServiceError> {
        if let Some(snapshot) = req.snapshot.clone() {
            let record = self.owned_snapshot(p, &snapshot).await.map_err(|mut e| {
                e.field = Some("snapshot".into());
                e
            })?;
            let id: paddock_types::SnapshotId = record
                .id
                .parse()
                .map_err(|e| ServiceError::internal("parse a snapshot id", &e))?;
            let info = self
                .create_from_volume(
                    p,
                    req,
                    paddock_types::VolumeSource::Snapshot(id),
                    record.storage_bytes,
                )
                .await?;
            self.inner.metrics.observe_create("snapshot", started.elapsed());
            return Ok(info);
        }
        let plan = self.plan_request(p, req).await?;
        // A warm sandbox was booted without volumes or a network: one that has either boots cold.
        let warm = self.inner.config.templates[&plan.spec.template].warm_pool_size > 0
            && plan.spec.volumes.is_empty()
            && plan.network.is_none();
        if warm {
            if let Some(info) = self.claim_warm(p, &plan).await? {
                self.inner.metrics.observe_create("pool", started.elapsed());
                return Ok(info);
            }
        }
        let info = self.create_cold(p, plan).await?;
        self.inner.metrics.observe_create("boot", started.elapsed());
        Ok(info)
    }

    /// [`Self::plan_create`] plus the volumes the request mounts, resolved for `p`'s tenant.
    pub(crate) async fn plan_request(
        &self,
        p: &Principal,
        req: CreateSandboxRequest,
    ) -> Result<CreatePlan, ServiceError> {
        let volumes = self.resolve_volume_mounts(p, &req.volumes).await?;
        let network = self
            .plan_network(p, req.network.clone(), req.secrets.clone())
            .await?;
        let mut plan = self.plan_create(req)?;
        plan.spec.volumes = volumes;
        plan.spec.network = network.is_some();
        plan.network = network;
        Ok(plan)
    }

    fn plan_create(&self, req: CreateSandboxRequest) -> Result<CreatePlan, ServiceError> {
        let config = &self.inner.config;
        let template = req.template.unwrap_or_else(|| DEFAULT_TEMPLATE.to_owned());
        if !config.templates.contains_key(&template) {
            return Err(ServiceError::invalid(
                "template",
                format!(
                    "no template {template:?}; this server has: {}",
                    config.templates.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        let limits = merge_limits(&config.default_limits, &req.limits);
        check_limits(&limits, &config.max_limits)?;
        let user = match req.user {
            Some(u) => u
                .parse::<UserSpec>()
                .map_err(|e| ServiceError::invalid("user", e.to_string()))?
                .to_string(),
            None => UserSpec::default_user().to_string(),
        };
        if let Some(dir) = &req.workdir {
            dir.parse::<SandboxPath>()
                .map_err(|e| ServiceError::invalid("workdir", e.to_string()))?;
        }
        check_env("env", &req.env)?;
        if req.labels.len() > MAX_LABELS {
            return Err(ServiceError::invalid(
                "labels",
                format!("at most {MAX_LABELS} labels"),
            ));
        }
        for (k, v) in &req.labels {
            if k.is_empty() || k.len() > MAX_LABEL_LEN || v.len() > MAX_LABEL_LEN || k.contains(['=', ',']) {
                return Err(ServiceError::invalid(
                    format!("labels.{k}"),
                    format!("label keys are 1-{MAX_LABEL_LEN} characters without '=' or ',', values at most {MAX_LABEL_LEN}"),
                ));
            }
        }
        let timeout = match req.timeout_secs {
            Some(0) => {
                return Err(ServiceError::invalid(
                    "timeout_secs",
                    "timeout_secs must be at least 1",
                ))
            }
            Some(s) => std::time::Duration::from_secs(s),
            None => config.default_timeout,
        };
        if timeout > config.max_timeout {
            return Err(ServiceError::invalid(
                "timeout_secs",
                format!("at most {} seconds", config.max_timeout.as_secs()),
            ));
        }
        let memory_bytes = limits.memory.map_or(0, u64::from);
        let cpu_millis = limits.cpus.map_or_else(host_millicpus, |c| c.millicpus());
        Ok(CreatePlan {
            spec: StoredSpec {
                template,
                limits,
                env: req.env,
                workdir: req.workdir,
                user,
                on_timeout: req.on_timeout.unwrap_or_default(),
                audit_exec_diff: req.audit_exec_diff,
                timeout_ms: Some(timeout.as_millis() as i64),
                volumes: Vec::new(),
                network: false,
            },
            network: None,
            labels: req.labels,
            timeout_ms: timeout.as_millis() as i64,
            memory_bytes,
            cpu_millis,
        })
    }

    /// Claims a warm sandbox for `p`'s tenant; `None` when the pool is empty.
    async fn claim_warm(
        &self,
        p: &Principal,
        plan: &CreatePlan,
    ) -> Result<Option<SandboxInfo>, ServiceError> {
        let now = now_ms();
        let claim = Claim {
            memory_bytes: plan.memory_bytes,
            cpu_millis: plan.cpu_millis,
            disk_bytes: crate::quota::sandbox_storage(&plan.spec.limits, 0),
            labels: plan.labels.clone(),
            spec_json: encode_spec(&plan.spec)?,
            expires_at_ms: Some(now + plan.timeout_ms),
            now_ms: now,
        };
        let (template, tenant) = (plan.spec.template.clone(), p.tenant.clone());
        let entry = AuditEntry::ok(p, "sandbox.create", None)
            .detail(serde_json::json!({ "template": template, "source": "pool" }))
            .into_row();
        let defaults = self.quota_defaults();
        let claimed = self
            .db("claim a warm sandbox", move |s| {
                s.transaction(|tx| {
                    let Some(record) = tx.claim_warm_sandbox(&template, &tenant, &claim, &defaults)? else {
                        return Ok(None);
                    };
                    let mut row = row_with_time(entry);
                    row.sandbox_id = Some(record.id.clone());
                    tx.append_audit(&row)?;
                    Ok::<_, paddock_store::StoreError>(Some(record))
                })
            })
            .await?;
        self.inner.pool_wakeup.notify_waiters();
        let Some(record) = claimed else {
            return Ok(None);
        };
        let Some(sb) = self.live_sandbox(&record.id) else {
            // Recorded as warm but not held here (cannot normally happen): end it, boot instead.
            self.end_sandbox(
                &record.id,
                SandboxState::Failed,
                "warm sandbox missing",
                None,
                "sandbox.lost",
            )
            .await?;
            return Ok(None);
        };
        if sb.spec().limits != plan.spec.limits {
            let limits = plan.spec.limits.clone();
            let result = self
                .on_handle(&sb, "apply limits", move |b, handle| {
                    b.update_limits(handle, &limits)
                })
                .await?
                .unwrap_or(Ok(()));
            if let Err(e) = result {
                let error = runtime_error("apply limits to a claimed sandbox", e);
                self.end_sandbox(
                    &record.id,
                    SandboxState::Failed,
                    "applying limits failed",
                    Some(p),
                    "sandbox.lost",
                )
                .await?;
                return Err(error);
            }
        }
        *lock(&sb.owner) = Ownership {
            tenant: Some(p.tenant.clone()),
            spec: plan.spec.clone(),
        };
        Ok(Some(info_from_record(&record)))
    }

    /// Boots a new sandbox for `p`'s tenant whose files start as `volume` (a snapshot's, for forks and
    /// creations from a snapshot), which is charged `base_bytes` against the storage quota.
    pub(crate) async fn create_from_volume(
        &self,
        p: &Principal,
        req: CreateSandboxRequest,
        volume: paddock_types::VolumeSource,
        base_bytes: u64,
    ) -> Result<SandboxInfo, ServiceError> {
        let plan = self.plan_request(p, req).await?;
        self.create_cold_from(p, plan, volume, base_bytes).await
    }

    /// Boots a new sandbox for `p`'s tenant.
    async fn create_cold(&self, p: &Principal, plan: CreatePlan) -> Result<SandboxInfo, ServiceError> {
        self.create_cold_from(p, plan, paddock_types::VolumeSource::Template, 0)
            .await
    }

    async fn create_cold_from(
        &self,
        p: &Principal,
        plan: CreatePlan,
        volume: paddock_types::VolumeSource,
        base_bytes: u64,
    ) -> Result<SandboxInfo, ServiceError> {
        let (id, entry) = self.boot_recorded(p, plan, volume, base_bytes).await?;
        self.commit_created(p, id.as_str(), entry).await
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
        let id = new_sandbox_id();
        let now = now_ms();
        let new = NewSandbox {
            id: id.to_string(),
            tenant: Some(p.tenant.clone()),
            state: SandboxState::Creating,
            profile: plan.spec.template.clone(),
            spec_json: encode_spec(&plan.spec)?,
            labels: plan.labels.clone(),
            memory_bytes: plan.memory_bytes,
            cpu_millis: plan.cpu_millis,
            disk_bytes: crate::quota::sandbox_storage(&plan.spec.limits, 0),
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
        let tenant = p.tenant.clone();
        let network = plan
            .network
            .as_ref()
            .map(|n| Self::network_record(&id, n))
            .transpose()?;
        // The sandbox, the volumes it mounts and its network are recorded together, each volume
        // checked to still exist in the same transaction (a concurrent delete either sees this mount
        // or wins).
        let defaults = self.quota_defaults();
        self.db("record a new sandbox", move |s| {
            s.transaction(|tx| {
                tx.insert_sandbox_checked(&new, &defaults)?;
                for m in &mounts {
                    tx.insert_volume_mount(&tenant, m)?;
                }
                if let Some(n) = &network {
                    tx.put_sandbox_network(n)?;
                }
                Ok::<_, paddock_store::StoreError>(())
            })
        })
        .await?;
        fault::point("create.recorded");
        let volume_name = match &volume {
            paddock_types::VolumeSource::Snapshot(s) => Some(s.to_string()),
            paddock_types::VolumeSource::Template | paddock_types::VolumeSource::Stopped => None,
        };
        let (handle, client) = match self.boot(&id, &plan.spec, volume).await {
            Ok(booted) => booted,
            Err(e) => {
                let reason = format!("create_failed: {}", e.message);
                self.end_sandbox(
                    id.as_str(),
                    SandboxState::Failed,
                    &reason,
                    Some(p),
                    "sandbox.create",
                )
                .await?;
                return Err(e);
            }
        };
        let owner = Ownership {
            tenant: Some(p.tenant.clone()),
            spec: plan.spec.clone(),
        };
        let source = match &volume_name {
            Some(snapshot) => format!("snapshot {snapshot}"),
            None => "boot".to_owned(),
        };
        let sb = Arc::new(LiveSandbox::new(id.to_string(), client, handle, owner));
        lock(&self.inner.live).insert(id.to_string(), sb);
        let entry = AuditEntry::ok(p, "sandbox.create", Some(id.as_str()))
            .detail(serde_json::json!({
                "template": plan.spec.template,
                "source": source,
                "volumes": plan.spec.volumes.iter().map(|v| v.volume.to_string()).collect::<Vec<_>>(),
            }))
            .into_row();
        fault::point("create.booted");
        Ok((id, entry))
    }

    /// Moves booted sandbox `id` from `creating` to `running` with its `sandbox.create` row.
    async fn commit_created(
        &self,
        p: &Principal,
        id: &str,
        entry: paddock_store::NewAuditEntry,
    ) -> Result<SandboxInfo, ServiceError> {
        let sid = id.to_string();
        let record = self
            .db("record a started sandbox", move |s| {
                s.transaction(|tx| {
                    if tx.transition_sandbox(
                        &sid,
                        &[SandboxState::Creating],
                        SandboxState::Running,
                        now_ms(),
                        None,
                    )? {
                        tx.append_audit(&row_with_time(entry))?;
                    }
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
                    SandboxState::Failed,
                    "recording failed",
                    Some(p),
                    "sandbox.lost",
                )
                .await?;
                Err(ServiceError::new(
                    ErrorCode::Internal,
                    "the sandbox could not be recorded",
                ))
            }
        }
    }

    /// The record of sandbox `id` if `p`'s tenant owns it.
    pub(crate) async fn owned_record(&self, p: &Principal, id: &str) -> Result<SandboxRecord, ServiceError> {
        let sid = id.to_owned();
        let record = self.db("read a sandbox", move |s| s.get_sandbox(&sid)).await?;
        match record {
            Some(r) if r.tenant.as_deref() == Some(p.tenant.as_str()) => Ok(r),
            _ => Err(ServiceError::sandbox_not_found(id)),
        }
    }

    /// The live sandbox `id` if `p`'s tenant owns it (without a store read on the hot path).
    pub(crate) async fn owned_live(&self, p: &Principal, id: &str) -> Result<Arc<LiveSandbox>, ServiceError> {
        let sb = self.owned_live_any(p, id).await?;
        self.refuse_paused(&sb)?;
        Ok(sb)
    }

    /// Like [`Self::owned_live`], paused sandboxes included (for pause, resume and kill).
    pub(crate) async fn owned_live_any(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<Arc<LiveSandbox>, ServiceError> {
        if let Some(sb) = self.live_sandbox(id) {
            if sb.tenant().as_deref() == Some(p.tenant.as_str()) {
                return Ok(sb);
            }
            return Err(ServiceError::sandbox_not_found(id));
        }
        let record = self.owned_record(p, id).await?;
        self.refuse_recovering(id)?;
        Err(ServiceError::new(
            ErrorCode::SandboxNotRunning,
            format!("sandbox {id} is {}", record.state.as_str()),
        ))
    }

    /// One sandbox of the caller's tenant.
    pub async fn get_sandbox(&self, p: &Principal, id: &str) -> Result<SandboxInfo, ServiceError> {
        Ok(info_from_record(&self.owned_record(p, id).await?))
    }

    /// The caller's sandboxes, filtered and paginated.
    pub async fn list_sandboxes(
        &self,
        p: &Principal,
        q: ListSandboxesQuery,
    ) -> Result<SandboxList, ServiceError> {
        let states = match q.state.as_deref() {
            None | Some("running") => vec![SandboxState::Creating, SandboxState::Running],
            Some("all") => vec![
                SandboxState::Creating,
                SandboxState::Running,
                SandboxState::Stopped,
                SandboxState::Killed,
                SandboxState::Expired,
                SandboxState::Failed,
            ],
            Some(s) => match s {
                "creating" => vec![SandboxState::Creating],
                "stopped" => vec![SandboxState::Stopped],
                "killed" => vec![SandboxState::Killed],
                "expired" => vec![SandboxState::Expired],
                "failed" => vec![SandboxState::Failed],
                other => {
                    return Err(ServiceError::invalid(
                        "state",
                        format!(
                            "unknown state {other:?}: use running, creating, stopped, killed, expired, failed or all"
                        ),
                    ))
                }
            },
        };
        let mut labels = BTreeMap::new();
        if let Some(spec) = &q.label {
            for pair in spec.split(',').filter(|s| !s.is_empty()) {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| ServiceError::invalid("label", format!("{pair:?} is not key=value")))?;
                labels.insert(k.to_owned(), v.to_owned());
            }
        }
        let limit = crate::paging::page_limit(q.limit)?;
        let filter = SandboxFilter {
            tenant: Some(p.tenant.clone()),
            states,
            labels,
            after_id: q.cursor.clone(),
            limit: limit + 1,
        };
        let mut records = self
            .db("list sandboxes", move |s| s.list_sandboxes(&filter))
            .await?;
        let next_cursor = crate::paging::finish_page(&mut records, limit, |r| r.id.clone());
        Ok(SandboxList {
            sandboxes: records.iter().map(info_from_record).collect(),
            next_cursor,
        })
    }

    /// Sets the sandbox to expire `timeout_secs` from now.
    pub async fn set_timeout(
        &self,
        p: &Principal,
        id: &str,
        req: SetTimeoutRequest,
    ) -> Result<SandboxInfo, ServiceError> {
        let max = self.inner.config.max_timeout;
        if req.timeout_secs == 0 || req.timeout_secs > max.as_secs() {
            return Err(ServiceError::invalid(
                "timeout_secs",
                format!("timeout_secs must be between 1 and {}", max.as_secs()),
            ));
        }
        self.owned_live(p, id).await?;
        let expires = now_ms() + (req.timeout_secs as i64) * 1000;
        let entry = AuditEntry::ok(p, "sandbox.timeout", Some(id))
            .detail(serde_json::json!({ "timeout_secs": req.timeout_secs }))
            .into_row();
        let sid = id.to_owned();
        let record = self
            .db("set a sandbox's timeout", move |s| {
                s.transaction(|tx| {
                    if tx.set_sandbox_expiry(&sid, Some(expires))? {
                        tx.append_audit(&row_with_time(entry))?;
                    }
                    Ok::<_, paddock_store::StoreError>(())
                })?;
                s.get_sandbox(&sid)
            })
            .await?;
        record
            .map(|r| info_from_record(&r))
            .ok_or_else(|| ServiceError::sandbox_not_found(id))
    }

    /// Kills the sandbox and removes everything of it.
    #[tracing::instrument(skip_all, fields(sandbox_id = %id))]
    pub async fn kill_sandbox(&self, p: &Principal, id: &str) -> Result<(), ServiceError> {
        let record = self.owned_record(p, id).await?;
        self.refuse_recovering(id)?;
        if record.state == SandboxState::Stopped {
            return self.kill_stopped(p, id).await;
        }
        if !record.state.is_live() {
            return Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {id} is already {}", record.state.as_str()),
            ));
        }
        let ended = self
            .end_sandbox(id, SandboxState::Killed, "killed", Some(p), "sandbox.kill")
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

    /// What the sandbox uses now.
    pub async fn sandbox_usage(&self, p: &Principal, id: &str) -> Result<SandboxUsageBody, ServiceError> {
        // Read from cgroups and the pool, not the agent: a paused sandbox answers too.
        let sb = self.owned_live_any(p, id).await?;
        let limits = sb.spec().limits;
        let usage = self
            .on_handle(&sb, "read a sandbox's usage", |b, handle| b.sandbox_usage(handle))
            .await?
            .ok_or_else(|| ServiceError::sandbox_ending(id))?
            .map_err(|e| runtime_error("read a sandbox's usage", e))?;
        Ok(SandboxUsageBody {
            cpu_time_us: usage.cpu_time_us,
            memory_bytes: usage.memory_bytes,
            memory_peak_bytes: usage.memory_peak_bytes,
            memory_limit_bytes: limits.memory.map(u64::from),
            pids: usage.pids,
            disk_bytes: usage.disk_bytes,
            disk_limit_bytes: usage.disk_limit_bytes.or(limits.disk.map(u64::from)),
        })
    }

    /// The templates sandboxes can be created from.
    pub fn templates(&self) -> TemplateList {
        TemplateList {
            templates: self
                .inner
                .config
                .templates
                .iter()
                .map(|(name, t)| TemplateInfo {
                    name: name.clone(),
                    warm_pool_size: t.warm_pool_size,
                })
                .collect(),
        }
    }
}

fn merge_limits(defaults: &Limits, req: &LimitsRequest) -> Limits {
    Limits {
        memory: req.memory.or(defaults.memory),
        cpus: req.cpus.or(defaults.cpus),
        pids: req.pids.or(defaults.pids),
        disk: req.disk.or(defaults.disk),
    }
}

/// Refuses limits outside their absolute bounds or above `max`, naming the field (`limits.pids`).
pub(crate) fn check_limits(limits: &Limits, max: &Limits) -> Result<(), ServiceError> {
    paddock_types::check_limits(limits, max, host_millicpus())
        .map_err(|e| ServiceError::invalid(format!("limits.{}", e.field), e.reason))
}

pub(crate) fn check_env(field: &str, env: &BTreeMap<String, String>) -> Result<(), ServiceError> {
    if env.len() > MAX_ENV {
        return Err(ServiceError::invalid(
            field,
            format!("at most {MAX_ENV} variables"),
        ));
    }
    for (k, v) in env {
        // A name holding '=' would parse as a different name and value; the agent refuses it.
        if k.contains('=') {
            return Err(ServiceError::invalid(
                format!("{field}.{k}"),
                format!("invalid environment variable name {k:?}: names cannot contain '='"),
            ));
        }
        format!("{k}={v}")
            .parse::<EnvVar>()
            .map_err(|e| ServiceError::invalid(format!("{field}.{k}"), e.to_string()))?;
    }
    Ok(())
}

fn host_millicpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32) * 1000
}

fn encode_spec(spec: &StoredSpec) -> Result<String, ServiceError> {
    serde_json::to_string(spec).map_err(|e| ServiceError::internal("encode a sandbox spec", &e))
}

pub(crate) fn state_body(state: SandboxState) -> SandboxStateBody {
    match state {
        SandboxState::Warm | SandboxState::Creating => SandboxStateBody::Creating,
        SandboxState::Running => SandboxStateBody::Running,
        SandboxState::Stopped => SandboxStateBody::Stopped,
        SandboxState::Killed => SandboxStateBody::Killed,
        SandboxState::Expired => SandboxStateBody::Expired,
        SandboxState::Failed => SandboxStateBody::Failed,
    }
}

pub(crate) fn info_from_record(r: &SandboxRecord) -> SandboxInfo {
    let spec: Option<StoredSpec> = serde_json::from_str(&r.spec_json).ok();
    SandboxInfo {
        id: r.id.clone(),
        tenant: r.tenant.clone().unwrap_or_default(),
        state: state_body(r.state),
        template: r.profile.clone(),
        limits: spec.as_ref().map(|s| s.limits.clone()).unwrap_or_default(),
        env_keys: spec
            .as_ref()
            .map(|s| s.env.keys().cloned().collect())
            .unwrap_or_default(),
        workdir: spec.as_ref().and_then(|s| s.workdir.clone()),
        user: spec.as_ref().map(|s| s.user.clone()).unwrap_or_default(),
        labels: r.labels.clone(),
        volumes: spec
            .as_ref()
            .map(|s| {
                s.volumes
                    .iter()
                    .map(|v| VolumeMountInfo {
                        volume: v.volume.to_string(),
                        path: v.path.to_string(),
                        read_only: v.read_only,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        created_at: rfc3339(r.claimed_at_ms.unwrap_or(r.created_at_ms)),
        expires_at: r.expires_at_ms.map(rfc3339),
        ended_at: r.ended_at_ms.map(rfc3339),
        end_reason: r.end_reason.clone(),
        paused: r.paused,
        on_timeout: spec.as_ref().map(|s| s.on_timeout).unwrap_or_default(),
        audit_exec_diff: spec.as_ref().is_some_and(|s| s.audit_exec_diff),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_types::ByteSize;

    #[test]
    fn request_limits_override_defaults_field_by_field() {
        let defaults = Limits::default();
        let req = LimitsRequest {
            memory: Some(ByteSize::mib(256)),
            ..Default::default()
        };
        let merged = merge_limits(&defaults, &req);
        assert_eq!(merged.memory, Some(ByteSize::mib(256)));
        assert_eq!(merged.pids, defaults.pids);
        assert_eq!(merged.disk, defaults.disk);
    }

    #[test]
    fn limits_outside_their_bounds_name_the_field() {
        let max = Limits {
            memory: None,
            cpus: None,
            pids: Some(10),
            disk: None,
        };
        let with_pids = |pids| Limits {
            pids,
            ..Limits::default()
        };
        assert!(check_limits(&with_pids(Some(10)), &max).is_ok());
        let e = check_limits(&with_pids(Some(11)), &max).expect_err("above the cap");
        assert_eq!(e.field.as_deref(), Some("limits.pids"));
        // No limit at all is more than any cap.
        let e = check_limits(&with_pids(None), &max).expect_err("unlimited");
        assert_eq!(e.code, ErrorCode::InvalidRequest);
        let e = check_limits(&with_pids(Some(1)), &max).expect_err("below the minimum");
        assert_eq!(e.field.as_deref(), Some("limits.pids"));
        let tiny = Limits {
            memory: Some(paddock_types::ByteSize::bytes(1)),
            ..Limits::default()
        };
        let e = check_limits(&tiny, &Limits::default()).expect_err("1 byte of memory");
        assert_eq!(e.field.as_deref(), Some("limits.memory"));
    }

    #[test]
    fn env_keys_are_validated() {
        let mut env = BTreeMap::new();
        env.insert("GOOD".to_owned(), "x=y".to_owned());
        assert!(check_env("env", &env).is_ok());
        let mut bad = env.clone();
        bad.insert("A=B".to_owned(), "x".to_owned());
        let e = check_env("env", &bad).expect_err("'=' in a name");
        assert_eq!(e.field.as_deref(), Some("env.A=B"));
        env.insert(String::new(), "v".to_owned());
        let e = check_env("env", &env).expect_err("empty key");
        assert_eq!(e.field.as_deref(), Some("env."));
    }

    #[test]
    fn warm_and_creating_look_like_creating() {
        assert_eq!(state_body(SandboxState::Warm), SandboxStateBody::Creating);
        assert_eq!(state_body(SandboxState::Expired), SandboxStateBody::Expired);
    }
}
