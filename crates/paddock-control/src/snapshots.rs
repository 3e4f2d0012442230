//! Snapshots, forks, step transactions (checkpoint / rollback / commit) and pause / resume.
//!
//! A snapshot is a read-only capture of a sandbox's writable file system taken with its processes
//! frozen for the instant (crash-consistent); it holds files, never process memory. Its storage lives
//! in the pool, its record (owner, name, labels) in the store; the record is written with its audit
//! row in one transaction, and storage without a record is garbage (collected at startup).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use paddock_runtime::fault;
use paddock_store::{
    IntentOp, NewSnapshot, QuotaRequest, SnapshotFilter, SnapshotKind, SnapshotRecord, StoreError,
};
use paddock_types::api::{
    CreateSnapshotRequest, ErrorCode, ForkRequest, ForkResult, ListSnapshotsQuery, SandboxInfo, SnapshotInfo,
    SnapshotKindBody, SnapshotList,
};
use paddock_types::{SnapshotId, VolumeSource};

use crate::lifecycle::{row_with_time, runtime_error};
use crate::live::LiveSandbox;
use crate::service::{now_ms, rfc3339, AuditEntry};
use crate::{Principal, SandboxService, ServiceError};
use paddock_store::{NewAuditEntry, StoreTx};

/// The most copies one fork makes.
pub const MAX_FORKS: u32 = 100;
/// How many copies of a fork boot at once.
const FORK_CONCURRENCY: usize = 16;
pub(crate) const MAX_NAME_LEN: usize = 256;

/// What a snapshot being taken is: its id (chosen by the caller, so that an intent can name it
/// first), kind, name and labels.
struct Capture {
    id: SnapshotId,
    kind: SnapshotKind,
    name: Option<String>,
    labels: BTreeMap<String, String>,
}

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
                Capture {
                    id: SnapshotId::from_random(rand::random()),
                    kind: SnapshotKind::Snapshot,
                    name: req.name,
                    labels: req.labels,
                },
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
        capture: Capture,
        action: &'static str,
    ) -> Result<SnapshotRecord, ServiceError> {
        let Capture {
            id: snapshot,
            kind,
            name,
            labels,
        } = capture;
        let started = Instant::now();
        let base_bytes = self.owned_record(p, &sb.id).await?.base_bytes;
        let request = QuotaRequest {
            snapshots: 1,
            storage_bytes: base_bytes,
            ..QuotaRequest::default()
        };
        self.precheck_quota(p, action, Some(&sb.id), request).await?;
        let taken = snapshot.clone();
        let written = self
            .on_handle(sb, "snapshot a sandbox", move |backend, handle| {
                backend
                    .snapshot_sandbox(handle, &taken)
                    .map_err(|e| runtime_error("snapshot a sandbox", e))?;
                // The capture committed the pool's transaction, so the quota group's count covers
                // every byte the snapshot can hold of the sandbox's own writes (later writes only add
                // to it).
                backend.sandbox_usage(handle).map(|u| u.disk_bytes).map_err(|e| {
                    let _ = backend.delete_snapshot(&taken);
                    runtime_error("measure a snapshot", e)
                })
            })
            .await?
            .ok_or_else(|| ServiceError::sandbox_ending(&sb.id))??;
        fault::point("snapshot.captured");
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
            let _ = self
                .on_backend("delete a snapshot", move |b| b.delete_snapshot(&snapshot))
                .await;
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
            // Maps every file's extents (about 20 ms per 1,000 files).
            let usage = self
                .on_backend("measure a snapshot", move |b| b.snapshot_usage(&snapshot))
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
    pub(crate) async fn drop_snapshot(
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
            let service = self.clone();
            let delete = async move {
                let deleted = service
                    .on_backend("delete a snapshot", move |b| {
                        b.delete_snapshot(&snapshot).map_err(|e| (snapshot, e))
                    })
                    .await;
                if let Ok(Err((snapshot, e))) = deleted {
                    tracing::warn!(snapshot = %snapshot, error = %e, "snapshot storage not freed; gc will");
                }
            };
            // A step transaction's checkpoint (commit, or consumed by its rollback) is deleted off the
            // agent's path: the record is gone already, and storage without a record is garbage the
            // next start collects if this is interrupted. An explicit delete frees it before answering.
            if matches!(action, "sandbox.commit" | "snapshot.consume") {
                tokio::spawn(delete);
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
                Capture {
                    id: SnapshotId::from_random(rand::random()),
                    kind: SnapshotKind::Checkpoint,
                    name: None,
                    labels: BTreeMap::new(),
                },
                "sandbox.checkpoint",
            )
            .await?;
        self.prepare_rollback(&sb, &record.id);
        Ok(info(&record))
    }

    /// Lets the backend prepare a rollback of `sb` to `snapshot` now, in the background (a boot of a
    /// copy), so that the rollback itself is a switch (see `SandboxBackend::prepare_rollback`).
    pub(crate) fn prepare_rollback(&self, sb: &Arc<LiveSandbox>, snapshot: &str) {
        let Ok(snapshot) = snapshot.parse::<SnapshotId>() else {
            return;
        };
        let (service, sb) = (self.clone(), sb.clone());
        tokio::spawn(async move {
            let prepared = service
                .on_handle(&sb, "prepare a rollback", move |b, handle| {
                    b.prepare_rollback(handle, &snapshot).map_err(|e| (snapshot, e))
                })
                .await;
            if let Ok(Some(Err((snapshot, e)))) = prepared {
                tracing::debug!(sandbox_id = %sb.id, snapshot = %snapshot, error = %e, "rollback not prepared; a rollback will restart the sandbox");
            }
        });
    }

    /// Releases a prepared rollback of `sb` (its checkpoint is gone), in the background.
    pub(crate) fn discard_rollback(&self, sb: &Arc<LiveSandbox>) {
        let (service, sb) = (self.clone(), sb.clone());
        tokio::spawn(async move {
            let _ = service
                .on_handle(&sb, "discard a rollback", |b, handle| b.discard_rollback(handle))
                .await;
        });
    }

    /// Snapshot `snapshot` of `p`'s tenant, or with `None` the newest checkpoint of sandbox `id`
    /// (`snapshot_not_found` when it has none).
    pub(crate) async fn snapshot_or_checkpoint(
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
        // The base snapshot is named in the fork's intent before it exists: a crash at any point
        // after leaves nothing of it (recovery drops it, or collects its unrecorded storage).
        let snapshot = SnapshotId::from_random(rand::random());
        let intent = self
            .begin_intent(id, IntentOp::Fork, Some(snapshot.as_str()), serde_json::json!({}))
            .await?;
        let base = match self
            .take_snapshot(
                p,
                &sb,
                Capture {
                    id: snapshot.clone(),
                    kind: SnapshotKind::Snapshot,
                    name: Some(format!("fork of {id}")),
                    labels: BTreeMap::new(),
                },
                "sandbox.fork",
            )
            .await
        {
            Ok(base) => base,
            Err(e) => {
                self.end_intent(intent).await;
                return Err(e);
            }
        };
        fault::point("fork.base_taken");
        let copied = self
            .fork_copies(p, &source, &spec, &req, &snapshot, base.storage_bytes)
            .await;
        let copies = match copied {
            Ok(copies) => copies,
            Err(e) => {
                self.drop_snapshot(Some(p), &base, "snapshot.delete").await?;
                self.end_intent(intent).await;
                return Err(e);
            }
        };
        fault::point("fork.copies_booted");
        // Every copy moves to `running` with its row, and the base goes, in one transaction with the
        // end of the intent: a crash before it leaves no copy, after it every one.
        let drop_row = AuditEntry::ok(p, "snapshot.delete", Some(id))
            .detail(serde_json::json!({ "snapshot": base.id, "kind": base.kind.as_str() }))
            .into_row();
        let (ids, base_id) = (copies.clone(), base.id.clone());
        let committed = self
            .db("record a fork", move |s| {
                s.transaction(|tx| {
                    for (copy, entry) in &ids {
                        let started = tx.transition_sandbox(
                            copy.as_str(),
                            &[paddock_store::SandboxState::Creating],
                            paddock_store::SandboxState::Running,
                            now_ms(),
                            None,
                        )?;
                        if !started {
                            return Ok(false);
                        }
                        tx.append_audit(&row_with_time(entry.clone()))?;
                    }
                    if tx.mark_snapshot_deleted(&base_id, now_ms())? {
                        tx.append_audit(&row_with_time(drop_row))?;
                    }
                    tx.end_intent(intent)?;
                    Ok::<_, StoreError>(true)
                })
            })
            .await;
        if !matches!(committed, Ok(true)) {
            for (copy, _) in &copies {
                let _ = self.kill_sandbox(p, copy.as_str()).await;
            }
            self.drop_snapshot(Some(p), &base, "snapshot.delete").await?;
            self.end_intent(intent).await;
            return Err(committed.err().unwrap_or_else(|| {
                ServiceError::new(
                    ErrorCode::SandboxNotRunning,
                    "a copy ended before the fork was recorded",
                )
            }));
        }
        self.free_snapshot_storage(vec![snapshot]);
        let mut sandboxes = Vec::with_capacity(copies.len());
        for (copy, _) in &copies {
            sandboxes.push(self.get_sandbox(p, copy.as_str()).await?);
        }
        Ok(ForkResult { sandboxes })
    }

    /// Boots `req.count` copies of sandbox `source` on `snapshot`, recorded `creating` (all or none:
    /// a failure ends those already made); each with its pending `sandbox.create` row.
    async fn fork_copies(
        &self,
        p: &Principal,
        source: &paddock_store::SandboxRecord,
        spec: &crate::live::StoredSpec,
        req: &ForkRequest,
        snapshot: &SnapshotId,
        base_bytes: u64,
    ) -> Result<Vec<(paddock_types::SandboxId, NewAuditEntry)>, ServiceError> {
        let labels = req.labels.clone().unwrap_or_else(|| source.labels.clone());
        // The copies get the same network policy and secrets (each with its own link and CA).
        let (network, secrets) = match self.network_of(&source.id).await? {
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
        let results: Vec<Result<_, ServiceError>> = stream::iter(0..req.count)
            .map(|_| async {
                let plan = self.plan_request(p, request.clone()).await?;
                self.boot_recorded(p, plan, VolumeSource::Snapshot(snapshot.clone()), base_bytes)
                    .await
            })
            .buffered(FORK_CONCURRENCY)
            .collect()
            .await;
        let mut created = Vec::with_capacity(results.len());
        let mut failure = None;
        for result in results {
            match result {
                Ok(copy) => created.push(copy),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            // All or nothing: a fork that cannot make every copy makes none.
            for (copy, _) in &created {
                let _ = self.kill_sandbox(p, copy.as_str()).await;
            }
            return Err(e);
        }
        Ok(created)
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
            let what = if frozen {
                "pause a sandbox"
            } else {
                "resume a sandbox"
            };
            self.on_handle(&sb, what, move |b, handle| {
                if frozen {
                    b.pause_sandbox(handle)
                } else {
                    b.resume_sandbox(handle)
                }
            })
            .await?
            .ok_or_else(|| ServiceError::sandbox_ending(id))?
            .map_err(|e| runtime_error(what, e))?;
            sb.set_paused(frozen);
            fault::point(if frozen { "pause.frozen" } else { "pause.thawed" });
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
            .on_backend("list snapshots", |b| b.list_snapshots())
            .await?
            .map_err(|e| runtime_error("list snapshots", e))?;
        for snapshot in &on_disk {
            if !known.iter().any(|k| *k == snapshot.to_string()) {
                tracing::info!(snapshot = %snapshot, "removing unrecorded snapshot storage");
                let snapshot = snapshot.clone();
                let _ = self
                    .on_backend("delete a snapshot", move |b| b.delete_snapshot(&snapshot))
                    .await;
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

    /// Frees the storage of snapshots whose records are marked deleted, on a blocking thread off the
    /// caller's path (what this misses, the next start collects: storage without a record).
    pub(crate) fn free_snapshot_storage(&self, snapshots: Vec<SnapshotId>) {
        if snapshots.is_empty() {
            return;
        }
        let service = self.clone();
        tokio::spawn(async move {
            let _ = service
                .on_backend("free snapshot storage", move |b| {
                    for snapshot in snapshots {
                        if let Err(e) = b.delete_snapshot(&snapshot) {
                            tracing::warn!(snapshot = %snapshot, error = %e, "snapshot storage not freed; the next start will");
                        }
                    }
                })
                .await;
        });
    }

    /// Checkpoints whose sandbox ended without them being dropped (a crash between the end and the
    /// drop, by an older paddock): their records are marked deleted, each with its audit row, and
    /// their storage freed.
    pub(crate) async fn drop_orphaned_checkpoints(&self) -> Result<(), ServiceError> {
        let orphans = self
            .db("list orphaned checkpoints", |s| s.orphaned_checkpoints())
            .await?;
        for record in orphans {
            tracing::info!(snapshot = %record.id, sandbox_id = ?record.sandbox_id, "dropping the checkpoint of an ended sandbox");
            if let Err(e) = self.drop_snapshot(None, &record, "snapshot.delete").await {
                tracing::warn!(snapshot = %record.id, error = %e, "checkpoint not dropped");
            }
        }
        Ok(())
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
        use paddock_types::api::{ChangeBody, DiffEntryBody, DiffResult};
        use paddock_types::diff::{Change, DiffOptions, EntryKind};
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
        let diff = self
            .on_handle(&sb, "diff a sandbox", move |b, handle| {
                b.diff_sandbox(handle, &snapshot, &options)
            })
            .await?
            .ok_or_else(|| ServiceError::sandbox_ending(id))?
            .map_err(|e| runtime_error("diff a sandbox", e))?;
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

/// Marks every checkpoint of `sandbox` deleted inside `tx` (step transactions do not outlive their
/// sandbox), each with a `snapshot.delete` row made from `who` (its principal and tenant); the
/// snapshots whose storage the caller frees once the transaction is committed.
pub(crate) fn drop_checkpoints_in(
    tx: &StoreTx<'_>,
    sandbox: &str,
    who: &NewAuditEntry,
) -> Result<Vec<SnapshotId>, StoreError> {
    let dropped = tx.drop_checkpoints_of(sandbox, now_ms())?;
    for record in &dropped {
        let mut row = who.clone();
        row.ts_ms = now_ms();
        row.action = "snapshot.delete".to_owned();
        row.outcome = "ok".to_owned();
        row.sandbox_id = Some(sandbox.to_owned());
        row.detail = serde_json::json!({ "snapshot": record.id, "kind": record.kind.as_str() });
        tx.append_audit(&row)?;
    }
    Ok(dropped.iter().filter_map(|r| r.id.parse().ok()).collect())
}
