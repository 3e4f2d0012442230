//! Snapshots, forks, step transactions (checkpoint / rollback / commit) and pause / resume.
//!
//! A snapshot is a read-only capture of a sandbox's writable file system taken with its processes
//! frozen for the instant (crash-consistent); it holds files, never process memory. Its storage lives
//! in the pool, its record (owner, name, labels) in the store; the record is written with its audit
//! row in one transaction, and storage without a record is garbage (collected at startup).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use paddock_runtime::agent_client::AgentClient;
use paddock_runtime::{Backend, SandboxHandle};
use paddock_store::{NewSnapshot, QuotaRequest, SnapshotFilter, SnapshotKind, SnapshotRecord, StoreError};
use paddock_types::api::{
    CreateSnapshotRequest, ErrorCode, ForkRequest, ForkResult, ListSnapshotsQuery, RollbackRequest,
    SandboxInfo, SnapshotInfo, SnapshotKindBody, SnapshotList,
};
use paddock_types::{SandboxId, SnapshotId, VolumeSource};

use crate::lifecycle::{row_with_time, runtime_error};
use crate::live::LiveSandbox;
use crate::service::{lock, now_ms, rfc3339, AuditEntry};
use crate::{Principal, SandboxService, ServiceError};

/// The most copies one fork makes.
pub const MAX_FORKS: u32 = 100;
/// How many copies of a fork boot at once.
const FORK_CONCURRENCY: usize = 16;
pub(crate) const MAX_NAME_LEN: usize = 256;

pub(crate) fn snapshot_not_found(id: &str) -> ServiceError {
    ServiceError::new(ErrorCode::SnapshotNotFound, format!("snapshot {id} not found"))
}

fn kind_body(kind: SnapshotKind) -> SnapshotKindBody {
    match kind {
        SnapshotKind::Snapshot => SnapshotKindBody::Snapshot,
        SnapshotKind::Checkpoint => SnapshotKindBody::Checkpoint,
    }
}

pub(crate) fn info(r: &SnapshotRecord) -> SnapshotInfo {
    SnapshotInfo {
        id: r.id.clone(),
        sandbox_id: r.sandbox_id.clone(),
        kind: kind_body(r.kind),
        name: r.name.clone(),
        labels: r.labels.clone(),
        created_at: rfc3339(r.created_at_ms),
        referenced_bytes: None,
        exclusive_bytes: None,
        storage_bytes: r.storage_bytes,
    }
}

pub(crate) fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ServiceError> {
    for (k, v) in labels {
        if k.is_empty() || k.len() > MAX_NAME_LEN || v.len() > MAX_NAME_LEN {
            return Err(ServiceError::invalid(
                format!("labels.{k}"),
                format!("label keys are 1-{MAX_NAME_LEN} bytes, values at most {MAX_NAME_LEN}"),
            ));
        }
    }
    Ok(())
}

impl SandboxService {
    /// A live sandbox of `p`'s tenant that is not paused (its agent answers).
    pub(crate) fn refuse_paused(&self, sb: &LiveSandbox) -> Result<(), ServiceError> {
        if sb.is_paused() {
            return Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {} is paused; resume it first", sb.id),
            ));
        }
        Ok(())
    }

    /// Takes a snapshot of sandbox `id` (its processes frozen for the instant of the capture).
    pub async fn create_snapshot(
        &self,
        p: &Principal,
        id: &str,
        req: CreateSnapshotRequest,
    ) -> Result<SnapshotInfo, ServiceError> {
        if req.name.as_ref().is_some_and(|n| n.len() > MAX_NAME_LEN) {
            return Err(ServiceError::invalid(
                "name",
                format!("at most {MAX_NAME_LEN} bytes"),
            ));
        }
        check_labels(&req.labels)?;
        // The capture needs no agent: a paused sandbox can be snapshotted (and stays paused).
        let sb = self.owned_live_any(p, id).await?;
        let record = self
            .take_snapshot(
                p,
                &sb,
                SnapshotKind::Snapshot,
                req.name,
                req.labels,
                "snapshot.create",
            )
            .await?;
        Ok(info(&record))
    }

    /// Captures `sb`'s files as a snapshot of `kind` and records it, charged its sandbox's base plus
    /// what the sandbox had written (see `quota.rs`); refused first if the tenant is at its
    /// snapshot or storage quota, and again (atomically) when recorded.
    async fn take_snapshot(
        &self,
        p: &Principal,
        sb: &Arc<LiveSandbox>,
        kind: SnapshotKind,
        name: Option<String>,
        labels: BTreeMap<String, String>,
        action: &'static str,
    ) -> Result<SnapshotRecord, ServiceError> {
        let started = Instant::now();
        let base_bytes = self.owned_record(p, &sb.id).await?.base_bytes;
        let request = QuotaRequest {
            snapshots: 1,
            storage_bytes: base_bytes,
            ..QuotaRequest::default()
        };
        self.precheck_quota(p, action, Some(&sb.id), request).await?;
        let snapshot = SnapshotId::from_random(rand::random());
        let written = {
            let guard = sb.handle.lock().await;
            let handle = guard.as_ref().ok_or_else(|| {
                ServiceError::new(
                    ErrorCode::SandboxNotRunning,
                    format!("sandbox {} is ending", sb.id),
                )
            })?;
            // A few milliseconds of ioctls and cgroup writes: off the async workers' queue.
            let backend = &self.inner.backend;
            crate::service::blocking(|| {
                tokio::runtime::Handle::current().block_on(backend.snapshot_sandbox(handle, &snapshot))
            })
            .map_err(|e| runtime_error("snapshot a sandbox", e))?;
            // The capture committed the pool's transaction, so the quota group's count covers every
            // byte the snapshot can hold of the sandbox's own writes (later writes only add to it).
            let usage = backend.sandbox_usage(handle).await;
            match usage {
                Ok(usage) => usage.disk_bytes,
                Err(e) => {
                    let _ = backend.delete_snapshot(&snapshot).await;
                    return Err(runtime_error("measure a snapshot", e));
                }
            }
        };
        let new = NewSnapshot {
            id: snapshot.to_string(),
            tenant: p.tenant.clone(),
            sandbox_id: Some(sb.id.clone()),
            kind,
            name,
            labels,
            created_at_ms: now_ms(),
            storage_bytes: base_bytes.saturating_add(written),
        };
        let row = AuditEntry::ok(p, action, Some(&sb.id))
            .detail(serde_json::json!({
                "snapshot": snapshot.to_string(),
                "kind": kind.as_str(),
                "storage_bytes": new.storage_bytes,
            }))
            .into_row();
        let (record, defaults) = (new.clone(), self.quota_defaults());
        let stored = self
            .db("record a snapshot", move |s| {
                s.transaction(|tx| {
                    tx.insert_snapshot_checked(&record, &defaults)?;
                    tx.append_audit(&row_with_time(row))?;
                    Ok::<_, StoreError>(())
                })
            })
            .await;
        if let Err(e) = stored {
            // Storage without a record is garbage: remove it now rather than at the next start.
            let _ = self.inner.backend.delete_snapshot(&snapshot).await;
            return self.audit_refusal(p, action, Some(&sb.id), Err(e)).await;
        }
        self.inner
            .metrics
            .observe_snapshot(kind.as_str(), started.elapsed());
        Ok(SnapshotRecord {
            id: new.id,
            tenant: new.tenant,
            sandbox_id: new.sandbox_id,
            kind: new.kind,
            name: new.name,
            labels: new.labels,
            created_at_ms: new.created_at_ms,
            deleted_at_ms: None,
            storage_bytes: new.storage_bytes,
        })
    }

    /// A snapshot of `p`'s tenant that still exists.
    pub(crate) async fn owned_snapshot(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<SnapshotRecord, ServiceError> {
        let sid = id.to_owned();
        let record = self.db("read a snapshot", move |s| s.get_snapshot(&sid)).await?;
        match record {
            Some(r) if r.tenant == p.tenant && r.deleted_at_ms.is_none() => Ok(r),
            _ => Err(snapshot_not_found(id)),
        }
    }

    /// One snapshot, with its storage figures.
    pub async fn get_snapshot(&self, p: &Principal, id: &str) -> Result<SnapshotInfo, ServiceError> {
        let record = self.owned_snapshot(p, id).await?;
        let mut body = info(&record);
        if let Ok(snapshot) = record.id.parse::<SnapshotId>() {
            // Maps every file's extents (about 20 ms per 1,000 files): on a blocking thread.
            let backend = self.inner.backend.clone();
            let runtime = tokio::runtime::Handle::current();
            let usage = tokio::task::spawn_blocking(move || {
                runtime.block_on(async move { backend.snapshot_usage(&snapshot).await })
            })
            .await;
            if let Ok(Ok(usage)) = usage {
                body.referenced_bytes = Some(usage.referenced_bytes);
                body.exclusive_bytes = Some(usage.exclusive_bytes);
            }
        }
        Ok(body)
    }

    /// The caller's snapshots.
    pub async fn list_snapshots(
        &self,
        p: &Principal,
        q: ListSnapshotsQuery,
    ) -> Result<SnapshotList, ServiceError> {
        let kind = match q.kind.as_deref() {
            None => None,
            Some("snapshot") => Some(SnapshotKind::Snapshot),
            Some("checkpoint") => Some(SnapshotKind::Checkpoint),
            Some(other) => {
                return Err(ServiceError::invalid(
                    "kind",
                    format!("unknown kind {other:?}: use snapshot or checkpoint"),
                ))
            }
        };
        let limit = crate::paging::page_limit(q.limit)?;
        let filter = SnapshotFilter {
            tenant: Some(p.tenant.clone()),
            sandbox_id: q.sandbox.clone(),
            kind,
            after_id: q.cursor.clone(),
            limit: limit + 1,
        };
        let mut records = self
            .db("list snapshots", move |s| s.list_snapshots(&filter))
            .await?;
        let next_cursor = crate::paging::finish_page(&mut records, limit, |r| r.id.clone());
        Ok(SnapshotList {
            snapshots: records.iter().map(info).collect(),
            next_cursor,
        })
    }

    /// Deletes a snapshot and frees what only it holds.
    pub async fn delete_snapshot(&self, p: &Principal, id: &str) -> Result<(), ServiceError> {
        let record = self.owned_snapshot(p, id).await?;
        self.drop_snapshot(Some(p), &record, "snapshot.delete").await
    }

    /// Marks `record` deleted (with its audit row), then removes its storage.
    async fn drop_snapshot(
        &self,
        p: Option<&Principal>,
        record: &SnapshotRecord,
        action: &'static str,
    ) -> Result<(), ServiceError> {
        let row = AuditEntry {
            principal: p,
            tenant: Some(record.tenant.clone()),
            action,
            sandbox: record.sandbox_id.as_deref(),
            outcome: "ok".into(),
            detail: serde_json::json!({ "snapshot": record.id, "kind": record.kind.as_str() }),
        }
        .into_row();
        let sid = record.id.clone();
        let deleted = self
            .db("delete a snapshot", move |s| {
                s.transaction(|tx| {
                    let deleted = tx.mark_snapshot_deleted(&sid, now_ms())?;
                    if deleted {
                        tx.append_audit(&row_with_time(row))?;
                    }
                    Ok::<_, StoreError>(deleted)
                })
            })
            .await?;
        if !deleted {
            return Err(snapshot_not_found(&record.id));
        }
        if let Ok(snapshot) = record.id.parse::<SnapshotId>() {
            let backend = self.inner.backend.clone();
            let delete = async move {
                if let Err(e) = backend.delete_snapshot(&snapshot).await {
                    tracing::warn!(snapshot = %snapshot, error = %e, "snapshot storage not freed; gc will");
                }
            };
            // A step transaction's checkpoint (commit, or consumed by its rollback) is deleted off the
            // agent's path: the record is gone already, and storage without a record is garbage the
            // next start collects if this is interrupted. An explicit delete frees it before answering.
            if matches!(action, "sandbox.commit" | "snapshot.consume") {
                let runtime = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || runtime.block_on(delete));
            } else {
                delete.await;
            }
        }
        Ok(())
    }

    /// `checkpoint`: a snapshot to return to with `rollback` or drop with `commit`.
    pub async fn checkpoint(&self, p: &Principal, id: &str) -> Result<SnapshotInfo, ServiceError> {
        let sb = self.owned_live_any(p, id).await?;
        let record = self
            .take_snapshot(
                p,
                &sb,
                SnapshotKind::Checkpoint,
                None,
                BTreeMap::new(),
                "sandbox.checkpoint",
            )
            .await?;
        self.prepare_rollback(&sb, &record.id);
        Ok(info(&record))
    }

    /// Lets the backend prepare a rollback of `sb` to `snapshot` now, in the background (a boot of a
    /// copy), so that the rollback itself is a switch (see `Backend::prepare_rollback`).
    fn prepare_rollback(&self, sb: &Arc<LiveSandbox>, snapshot: &str) {
        let Ok(snapshot) = snapshot.parse::<SnapshotId>() else {
            return;
        };
        let (service, sb) = (self.clone(), sb.clone());
        tokio::spawn(async move {
            let guard = sb.handle.lock().await;
            let Some(handle) = guard.as_ref() else { return };
            let backend = &service.inner.backend;
            let prepared = crate::service::blocking(|| {
                tokio::runtime::Handle::current().block_on(backend.prepare_rollback(handle, &snapshot))
            });
            if let Err(e) = prepared {
                tracing::debug!(sandbox_id = %sb.id, snapshot = %snapshot, error = %e, "rollback not prepared; a rollback will restart the sandbox");
            }
        });
    }

    /// Releases a prepared rollback of `sb` (its checkpoint is gone), in the background.
    fn discard_rollback(&self, sb: &Arc<LiveSandbox>) {
        let (service, sb) = (self.clone(), sb.clone());
        tokio::spawn(async move {
            let guard = sb.handle.lock().await;
            let Some(handle) = guard.as_ref() else { return };
            let backend = &service.inner.backend;
            let _ = crate::service::blocking(|| {
                tokio::runtime::Handle::current().block_on(backend.discard_rollback(handle))
            });
        });
    }

    /// Snapshot `snapshot` of `p`'s tenant, or with `None` the newest checkpoint of sandbox `id`
    /// (`snapshot_not_found` when it has none).
    async fn snapshot_or_checkpoint(
        &self,
        p: &Principal,
        id: &str,
        snapshot: Option<&str>,
    ) -> Result<SnapshotRecord, ServiceError> {
        if let Some(s) = snapshot {
            return self.owned_snapshot(p, s).await;
        }
        let sid = id.to_owned();
        self.db("read a checkpoint", move |s| s.latest_checkpoint(&sid))
            .await?
            .ok_or_else(|| {
                ServiceError::new(
                    ErrorCode::SnapshotNotFound,
                    format!("sandbox {id} has no checkpoint"),
                )
            })
    }

    /// `commit`: drops the newest checkpoint (the step is kept).
    pub async fn commit(&self, p: &Principal, id: &str) -> Result<SnapshotInfo, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let record = self.snapshot_or_checkpoint(p, id, None).await?;
        self.drop_snapshot(Some(p), &record, "sandbox.commit").await?;
        self.discard_rollback(&sb);
        Ok(info(&record))
    }

    /// Returns the sandbox's files to one of its snapshots (the newest checkpoint by default, which
    /// this consumes); its processes restart, its id stays.
    pub async fn rollback(
        &self,
        p: &Principal,
        id: &str,
        req: RollbackRequest,
    ) -> Result<SandboxInfo, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let record = self
            .snapshot_or_checkpoint(p, id, req.snapshot.as_deref())
            .await?;
        if record.sandbox_id.as_deref() != Some(id) {
            return Err(ServiceError::invalid(
                "snapshot",
                format!(
                    "snapshot {} was not taken of this sandbox; create a sandbox from it instead",
                    record.id
                ),
            ));
        }
        let snapshot: SnapshotId = record
            .id
            .parse()
            .map_err(|e| ServiceError::internal("parse a snapshot id", &e))?;
        let started = Instant::now();
        // The handle's lock is the sandbox's operation lock, held until the rolled-back sandbox is
        // in place: an end (kill, expiry, stop, the reaper) coming meanwhile waits for it and ends
        // the new sandbox, or, if it took the old one out of the live map first, the commit below
        // sees that and tears down what the rollback made. No init is left that nothing holds.
        sb.set_restarting(true);
        let mut guard = sb.handle.lock().await;
        let handle = guard.take().ok_or_else(|| {
            ServiceError::new(ErrorCode::SandboxNotRunning, format!("sandbox {id} is ending"))
        })?;
        let backend = self.inner.backend.clone();
        let runtime = tokio::runtime::Handle::current();
        let restarted = tokio::task::spawn_blocking(move || {
            runtime.block_on(async move { backend.rollback_sandbox(handle, &snapshot).await })
        })
        .await
        .map_err(|e| ServiceError::internal("roll a sandbox back", &e))?;
        let handle = match restarted {
            Ok(handle) => handle,
            Err(e) => {
                // The backend removed everything of the sandbox.
                drop(guard);
                let error = runtime_error("roll a sandbox back", e);
                self.end_sandbox(
                    id,
                    paddock_store::SandboxState::Failed,
                    "rollback_failed",
                    Some(p),
                    "sandbox.lost",
                )
                .await?;
                return Err(error);
            }
        };
        let committed = self.commit_restart(p, &sb, guard, handle).await;
        sb.set_restarting(false);
        committed?;
        // Its files are the snapshot's now: so is what it is charged beyond its disk limit.
        self.rebase_sandbox(id, record.storage_bytes).await?;
        let consumed = req.snapshot.is_none();
        let row = AuditEntry::ok(p, "sandbox.rollback", Some(id))
            .detail(serde_json::json!({ "snapshot": record.id, "consumed": consumed }))
            .into_row();
        self.db("record a rollback", move |s| {
            s.append_audit(&row_with_time(row)).map(|_| ())
        })
        .await?;
        if consumed {
            self.drop_snapshot(Some(p), &record, "snapshot.consume").await?;
        }
        // The sandbox's newest remaining checkpoint (if any) is the next rollback's target.
        let sid = id.to_owned();
        if let Ok(Some(next)) = self
            .db("read a checkpoint", move |s| s.latest_checkpoint(&sid))
            .await
        {
            if let Some(live) = self.live_sandbox(id) {
                self.prepare_rollback(&live, &next.id);
            }
        }
        self.inner.metrics.observe_snapshot("rollback", started.elapsed());
        self.get_sandbox(p, id).await
    }

    /// Puts a restarted sandbox's new handle and agent connection in place of `old`, whose handle
    /// lock (`guard`, emptied) the caller held through the restart. The live map is changed only if
    /// it still holds `old`: if an end took it out meanwhile, the new sandbox is destroyed here
    /// (the end found no handle to destroy) and the restart fails with `sandbox_not_running`.
    async fn commit_restart(
        &self,
        p: &Principal,
        old: &Arc<LiveSandbox>,
        guard: tokio::sync::MutexGuard<'_, Option<SandboxHandle>>,
        handle: SandboxHandle,
    ) -> Result<(), ServiceError> {
        let client = match AgentClient::connect(&handle.agent_socket).await {
            Ok(c) => c,
            Err(e) => {
                let error = ServiceError::internal("connect to a restarted agent", &e);
                drop(guard);
                self.destroy_handle(handle).await;
                self.end_sandbox(
                    &old.id,
                    paddock_store::SandboxState::Failed,
                    "rollback_failed",
                    Some(p),
                    "sandbox.lost",
                )
                .await?;
                return Err(error);
            }
        };
        let owner = lock(&old.owner).clone();
        let fresh = Arc::new(LiveSandbox::new(old.id.clone(), client, handle, owner));
        let replaced = {
            let mut live = lock(&self.inner.live);
            match live.get(&old.id) {
                Some(current) if Arc::ptr_eq(current, old) => {
                    live.insert(old.id.clone(), fresh.clone());
                    true
                }
                _ => false,
            }
        };
        drop(guard);
        if !replaced {
            if let Some(handle) = fresh.handle.lock().await.take() {
                self.destroy_handle(handle).await;
            }
            return Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {} ended during its rollback", old.id),
            ));
        }
        Ok(())
    }

    /// Forks a sandbox into `count` new ones that start as copies of its files.
    pub async fn fork_sandbox(
        &self,
        p: &Principal,
        id: &str,
        req: ForkRequest,
    ) -> Result<ForkResult, ServiceError> {
        if req.count == 0 || req.count > MAX_FORKS {
            return Err(ServiceError::invalid(
                "count",
                format!("count must be between 1 and {MAX_FORKS}"),
            ));
        }
        if let Some(labels) = &req.labels {
            check_labels(labels)?;
        }
        let sb = self.owned_live(p, id).await?;
        let source = self.owned_record(p, id).await?;
        // Every copy counts as a new sandbox of the source's size (and starts from at least the
        // source's base): a fork the quota cannot take is refused before anything is made.
        let spec = sb.spec();
        let copy = QuotaRequest {
            sandboxes: 1,
            memory_bytes: source.memory_bytes,
            cpu_millis: u64::from(source.cpu_millis),
            storage_bytes: crate::quota::sandbox_storage(&spec.limits, source.base_bytes),
            ..QuotaRequest::default()
        };
        let base_snapshot = QuotaRequest {
            snapshots: 1,
            storage_bytes: source.base_bytes,
            ..QuotaRequest::default()
        };
        self.precheck_quota(
            p,
            "sandbox.fork",
            Some(id),
            copy.times(u64::from(req.count)).plus(base_snapshot),
        )
        .await?;
        let base = self
            .take_snapshot(
                p,
                &sb,
                SnapshotKind::Snapshot,
                Some(format!("fork of {id}")),
                BTreeMap::new(),
                "sandbox.fork",
            )
            .await?;
        let snapshot: SnapshotId = base
            .id
            .parse()
            .map_err(|e| ServiceError::internal("parse a snapshot id", &e))?;
        let labels = req.labels.clone().unwrap_or_else(|| source.labels.clone());
        // The copies get the same network policy and secrets (each with its own link and CA).
        let (network, secrets) = match self.network_of(id).await? {
            Some((policy, secrets)) => (Some(policy), secrets),
            None => (None, Vec::new()),
        };
        let request = paddock_types::api::CreateSandboxRequest {
            network,
            secrets,
            template: Some(spec.template.clone()),
            limits: paddock_types::api::LimitsRequest {
                memory: spec.limits.memory,
                cpus: spec.limits.cpus,
                pids: spec.limits.pids,
                disk: spec.limits.disk,
            },
            env: spec.env.clone(),
            workdir: spec.workdir.clone(),
            user: Some(spec.user.clone()),
            labels,
            timeout_secs: req.timeout_secs,
            snapshot: None,
            on_timeout: Some(spec.on_timeout),
            audit_exec_diff: spec.audit_exec_diff,
            // Volumes are shared, not copied: the copies mount the same ones.
            volumes: spec
                .volumes
                .iter()
                .map(|v| paddock_types::api::VolumeMountRequest {
                    volume: v.volume.to_string(),
                    path: v.path.to_string(),
                    read_only: v.read_only,
                })
                .collect(),
        };
        // The copies boot concurrently: their volume snapshots join the same btrfs transaction commits
        // and their setups overlap each other's waits.
        use futures_util::stream::{self, StreamExt};
        let results: Vec<Result<SandboxInfo, ServiceError>> = stream::iter(0..req.count)
            .map(|_| {
                self.create_from_volume(
                    p,
                    request.clone(),
                    VolumeSource::Snapshot(snapshot.clone()),
                    base.storage_bytes,
                )
            })
            .buffered(FORK_CONCURRENCY)
            .collect()
            .await;
        let mut created = Vec::with_capacity(results.len());
        let mut failure = None;
        for result in results {
            match result {
                Ok(info) => created.push(info),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        // The copies share the snapshot's extents; the snapshot itself is no longer needed.
        self.drop_snapshot(Some(p), &base, "snapshot.delete").await?;
        if let Some(e) = failure {
            // All or nothing: a fork that cannot make every copy makes none.
            for info in &created {
                let _ = self.kill_sandbox(p, &info.id).await;
            }
            return Err(e);
        }
        Ok(ForkResult { sandboxes: created })
    }

    /// Freezes every process of the sandbox (no CPU used, memory kept).
    pub async fn pause_sandbox(&self, p: &Principal, id: &str) -> Result<SandboxInfo, ServiceError> {
        self.set_frozen(p, id, true).await
    }

    /// Thaws a paused sandbox, or boots a stopped one again on its files. Either way, a timeout that
    /// paused or stopped it starts again.
    pub async fn resume_sandbox(&self, p: &Principal, id: &str) -> Result<SandboxInfo, ServiceError> {
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
    async fn set_frozen(&self, p: &Principal, id: &str, frozen: bool) -> Result<SandboxInfo, ServiceError> {
        let sb = self.owned_live_any(p, id).await?;
        if sb.is_paused() != frozen {
            {
                let guard = sb.handle.lock().await;
                let handle = guard.as_ref().ok_or_else(|| {
                    ServiceError::new(ErrorCode::SandboxNotRunning, format!("sandbox {id} is ending"))
                })?;
                let backend = &self.inner.backend;
                let result = if frozen {
                    backend.pause_sandbox(handle).await
                } else {
                    backend.resume_sandbox(handle).await
                };
                result.map_err(|e| {
                    runtime_error(
                        if frozen {
                            "pause a sandbox"
                        } else {
                            "resume a sandbox"
                        },
                        e,
                    )
                })?;
            }
            sb.set_paused(frozen);
            self.record_pause(p, id, frozen).await?;
        }
        self.get_sandbox(p, id).await
    }

    async fn record_pause(&self, p: &Principal, id: &str, paused: bool) -> Result<(), ServiceError> {
        let action = if paused { "sandbox.pause" } else { "sandbox.resume" };
        let row = AuditEntry::ok(p, action, Some(id)).into_row();
        let sid = id.to_owned();
        self.db("record a pause", move |s| {
            s.transaction(|tx| {
                tx.set_sandbox_paused(&sid, paused)?;
                tx.append_audit(&row_with_time(row))?;
                Ok::<_, StoreError>(())
            })
        })
        .await
    }

    /// Storage of snapshots the store does not know (a crash between capture and record, or a
    /// deletion whose storage removal failed) is removed; records whose storage is gone are marked
    /// deleted.
    pub(crate) async fn collect_snapshot_garbage(&self) -> Result<(), ServiceError> {
        let known = self.db("list snapshots", |s| s.existing_snapshot_ids()).await?;
        let on_disk = self
            .inner
            .backend
            .list_snapshots()
            .map_err(|e| runtime_error("list snapshots", e))?;
        for snapshot in &on_disk {
            if !known.iter().any(|k| *k == snapshot.to_string()) {
                tracing::info!(snapshot = %snapshot, "removing unrecorded snapshot storage");
                let _ = self.inner.backend.delete_snapshot(snapshot).await;
            }
        }
        for id in known {
            if !on_disk.iter().any(|s| s.to_string() == id) {
                tracing::warn!(snapshot = %id, "snapshot storage is gone; marking it deleted");
                let sid = id.clone();
                self.db("mark a snapshot deleted", move |s| {
                    s.mark_snapshot_deleted(&sid, now_ms())
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Drops a sandbox's checkpoints when it ends (step transactions do not outlive their sandbox).
    pub(crate) async fn drop_checkpoints(&self, sandbox: &SandboxId) {
        let filter = SnapshotFilter {
            sandbox_id: Some(sandbox.to_string()),
            kind: Some(SnapshotKind::Checkpoint),
            limit: 1000,
            ..Default::default()
        };
        let Ok(records) = self
            .db("list checkpoints", move |s| s.list_snapshots(&filter))
            .await
        else {
            return;
        };
        for record in records {
            if let Err(e) = self.drop_snapshot(None, &record, "snapshot.delete").await {
                tracing::warn!(snapshot = %record.id, error = %e, "checkpoint not dropped");
            }
        }
    }
}

impl SandboxService {
    /// What changed in a sandbox's files since one of its snapshots (the newest checkpoint by default).
    pub async fn diff_sandbox(
        &self,
        p: &Principal,
        id: &str,
        q: paddock_types::api::DiffQuery,
    ) -> Result<paddock_types::api::DiffResult, ServiceError> {
        use paddock_runtime::native::diff::{Change, DiffOptions, EntryKind};
        use paddock_types::api::{ChangeBody, DiffEntryBody, DiffResult};
        // Reads the pool, not the agent: a paused sandbox can be diffed.
        let sb = self.owned_live_any(p, id).await?;
        let record = self.snapshot_or_checkpoint(p, id, q.snapshot.as_deref()).await?;
        let snapshot: SnapshotId = record
            .id
            .parse()
            .map_err(|e| ServiceError::internal("parse a snapshot id", &e))?;
        let options = DiffOptions {
            text_diff: q.text.unwrap_or(false),
            max_entries: 100_000,
            ..DiffOptions::default()
        };
        let diff = {
            let guard = sb.handle.lock().await;
            let handle = guard.as_ref().ok_or_else(|| {
                ServiceError::new(ErrorCode::SandboxNotRunning, format!("sandbox {id} is ending"))
            })?;
            let backend = &self.inner.backend;
            crate::service::blocking(|| {
                tokio::runtime::Handle::current().block_on(backend.diff_sandbox(handle, &snapshot, &options))
            })
            .map_err(|e| runtime_error("diff a sandbox", e))?
        };
        self.audit(
            AuditEntry::ok(p, "sandbox.diff", Some(id))
                .detail(serde_json::json!({ "snapshot": record.id, "entries": diff.entries.len() })),
        )
        .await?;
        Ok(DiffResult {
            snapshot: record.id,
            added: diff.added,
            modified: diff.modified,
            deleted: diff.deleted,
            truncated: diff.truncated,
            entries: diff
                .entries
                .into_iter()
                .map(|e| DiffEntryBody {
                    path: e.path,
                    change: match e.change {
                        Change::Added => ChangeBody::Added,
                        Change::Modified => ChangeBody::Modified,
                        Change::Deleted => ChangeBody::Deleted,
                        Change::TypeChanged => ChangeBody::TypeChanged,
                    },
                    kind: match e.kind {
                        EntryKind::File => "file",
                        EntryKind::Dir => "dir",
                        EntryKind::Symlink => "symlink",
                        EntryKind::Other => "other",
                    }
                    .to_owned(),
                    old_size: e.old_size,
                    new_size: e.new_size,
                    unified: e.unified,
                })
                .collect(),
        })
    }
}
