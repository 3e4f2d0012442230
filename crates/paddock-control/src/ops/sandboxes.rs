//! Sandbox operations: create (claim from a warm pool or boot), list, timeout, usage, templates.
//! Get is `core::access`, kill is `lifecycle::end`.

use std::collections::BTreeMap;
use std::time::Instant;

use paddock_store::{Claim, SandboxFilter, SandboxState};
use paddock_types::api::{
    CreateSandboxRequest, ErrorCode, ListSandboxesQuery, SandboxInfo, SandboxList, SandboxUsageBody,
    SetTimeoutRequest,
};

use crate::core::access::info_from_record;
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::{lock, Ownership};
use crate::core::service::runtime_error;
use crate::core::time::now_ms;
use crate::lifecycle::states::Transition;
use crate::plan::create::{encode_spec, CreatePlan};
use crate::{Principal, SandboxService, ServiceError};
use paddock_types::SandboxId;

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
            // Refusals are recorded too, whatever the caller got wrong (a failed boot already wrote
            // its own row).
            if matches!(
                e.code,
                ErrorCode::QuotaExceeded
                    | ErrorCode::InvalidRequest
                    | ErrorCode::SnapshotNotFound
                    | ErrorCode::VolumeNotFound
                    | ErrorCode::Unsupported
            ) {
                let entry = AuditEntry::ok(p, AuditAction::SandboxCreate, None)
                    .outcome(e.code.as_str())
                    .detail(audit::Refusal {
                        field: e.field.clone(),
                        message: e.message.clone(),
                    });
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
            let image = self
                .snapshot_template(p, &record, req.template.as_deref())
                .await?;
            let plan = self.plan_request_with(p, req, image).await?;
            let info = self
                .create_cold_from(
                    p,
                    plan,
                    paddock_types::VolumeSource::Snapshot(id),
                    record.storage_bytes,
                )
                .await?;
            self.inner.metrics.observe_create("snapshot", started.elapsed());
            return Ok(info);
        }
        let plan = self.plan_request(p, req).await?;
        // A warm sandbox was booted without volumes or a network: one that has either boots cold.
        let warm = self
            .inner
            .config
            .templates
            .get(&plan.spec.template)
            .is_some_and(|t| t.warm_pool_size > 0)
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

    /// Claims a warm sandbox for `p`'s tenant; `None` when the pool is empty.
    async fn claim_warm(
        &self,
        p: &Principal,
        plan: &CreatePlan,
    ) -> Result<Option<SandboxInfo>, ServiceError> {
        self.inner.activity.touch();
        let now = now_ms();
        let claim = Claim {
            memory_bytes: plan.memory_bytes,
            cpu_millis: plan.cpu_millis,
            disk_bytes: crate::core::quota::sandbox_storage(&plan.spec.limits, 0),
            labels: plan.labels.clone(),
            spec_json: encode_spec(&plan.spec)?,
            expires_at_ms: Some(now + plan.timeout_ms),
            now_ms: now,
        };
        let (template, tenant) = (plan.spec.template.clone(), p.tenant.clone());
        let entry = AuditEntry::ok(p, AuditAction::SandboxCreate, None)
            .detail(audit::Claimed {
                template: template.clone(),
                source: "pool",
            })
            .into_row();
        let defaults = self.quota_defaults();
        let claimed = self
            .db("claim a warm sandbox", move |s| {
                s.transaction(|tx| {
                    // The state table's `Claim` (warm → running), applied by the store with the
                    // quota check.
                    let Some(record) = tx.claim_warm_sandbox(&template, &tenant, &claim, &defaults)? else {
                        return Ok(None);
                    };
                    let mut row = entry;
                    row.sandbox_id = Some(record.id.clone());
                    audit::append(tx, &row)?;
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
                Transition::Lose,
                "warm sandbox missing",
                None,
                AuditAction::SandboxLost,
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
                    Transition::Lose,
                    "applying limits failed",
                    Some(p),
                    AuditAction::SandboxLost,
                )
                .await?;
                return Err(error);
            }
        }
        let pooled = sb.spec();
        let same_processes = pooled.env == plan.spec.env
            && pooled.user == plan.spec.user
            && pooled.workdir == plan.spec.workdir;
        *lock(&sb.owner) = Ownership {
            tenant: Some(p.tenant.clone()),
            spec: plan.spec.clone(),
        };
        if same_processes {
            // The contexts the pool started ahead are the claimer's now: its audit log says so
            // (op `warm`), as it says when a request starts one.
            let handed: Vec<_> = sb.contexts.lock().await.iter().map(|c| c.info()).collect();
            for info in handed {
                self.audit_context(p, &record.id, "warm", &info).await?;
            }
        } else {
            // Kernels started ahead run with the pool's environment and user: stop them; the
            // first cell starts its context with the request's.
            let stale = std::mem::take(&mut *sb.contexts.lock().await);
            if !stale.is_empty() {
                let sb = sb.clone();
                tokio::spawn(async move {
                    for context in stale {
                        let _ = sb.client.kernel_shutdown(&context.kernel_id).await;
                    }
                });
            }
        }
        Ok(Some(info_from_record(&record)))
    }

    /// The image template a sandbox made from `snapshot` starts on: the one its files were made
    /// from (their top level is that template's, which the mount plan binds). A request naming
    /// another template is refused: the files would not fit it.
    async fn snapshot_template(
        &self,
        p: &Principal,
        snapshot: &paddock_store::SnapshotRecord,
        requested: Option<&str>,
    ) -> Result<Option<crate::plan::template::ResolvedTemplate>, ServiceError> {
        let requested_image = match requested {
            None => None,
            Some(name) => match self.inner.config.templates.get(name) {
                Some(t) if t.is_built() => Some(self.configured_template(name).await?.id),
                Some(_) => None,
                None => self.resolve_template(&p.tenant, name).await?.map(|t| t.id),
            },
        };
        let Some(id) = &snapshot.template_id else {
            if requested_image.is_some() {
                return Err(ServiceError::invalid(
                    "template",
                    format!(
                        "snapshot {} holds a tree of the host's layout, not of an image template: create it without `template`",
                        snapshot.id
                    ),
                ));
            }
            return Ok(None);
        };
        // The snapshot keeps its template from deletion: the tenant's own, or the server's.
        let mut found = self.resolve_template(&p.tenant, id).await?;
        if found.is_none() {
            found = self
                .resolve_template(crate::core::principal::ADMIN_TENANT, id)
                .await?;
        }
        let found = found.ok_or_else(|| {
            ServiceError::internal("read a snapshot's template", &format!("template {id} is gone"))
        })?;
        if requested.is_some() && requested_image.as_ref() != Some(&found.id) {
            return Err(ServiceError::invalid(
                "template",
                format!(
                    "snapshot {} was taken of a sandbox of template {id}: a sandbox made from it uses that template (leave `template` out)",
                    snapshot.id
                ),
            ));
        }
        Ok(Some(found))
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
        let limit = crate::core::paging::page_limit(q.limit)?;
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
        let next_cursor = crate::core::paging::finish_page(&mut records, limit, |r| r.id.clone());
        Ok(SandboxList {
            sandboxes: records.iter().map(info_from_record).collect(),
            next_cursor,
        })
    }

    /// Sets the sandbox to expire `timeout_secs` from now.
    pub async fn set_timeout(
        &self,
        p: &Principal,
        id: &SandboxId,
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
        let entry = AuditEntry::ok(p, AuditAction::SandboxTimeout, Some(id))
            .detail(audit::Timeout {
                timeout_secs: req.timeout_secs,
            })
            .into_row();
        let sid = id.to_owned();
        let record = self
            .db("set a sandbox's timeout", move |s| {
                s.transaction(|tx| {
                    if tx.set_sandbox_expiry(&sid, Some(expires))? {
                        audit::append(tx, &entry)?;
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

    /// What the sandbox uses now.
    pub async fn sandbox_usage(
        &self,
        p: &Principal,
        id: &SandboxId,
    ) -> Result<SandboxUsageBody, ServiceError> {
        // Read from cgroups and the pool, not the agent: a paused sandbox answers too.
        let sb = self.owned_live_any(p, id).await?;
        let limits = sb.spec().limits;
        let usage = self
            .on_live_handle(&sb, "read a sandbox's usage", |b, handle| b.sandbox_usage(handle))
            .await?;
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
}
