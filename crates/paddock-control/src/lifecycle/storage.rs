//! Snapshot, volume and stopped-sandbox storage: dropping snapshots with their records, freeing
//! storage off the request path, and reclaiming storage no record owns.

use paddock_store::{NewAuditEntry, SandboxState, SnapshotRecord, StoreError, StoreTx};
use paddock_types::{SandboxId, SnapshotId};

use crate::core::audit::{self, AuditAction, AuditEntry, Detail};
use crate::core::error::snapshot_not_found;
use crate::core::error::stored_snapshot_id;
use crate::core::service::runtime_error;
use crate::core::time::now_ms;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// Marks `record` deleted (with its audit row), then removes its storage.
    pub(crate) async fn drop_snapshot(
        &self,
        p: Option<&Principal>,
        record: &SnapshotRecord,
        action: AuditAction,
    ) -> Result<(), ServiceError> {
        let row = AuditEntry::by(
            p,
            Some(record.tenant.clone()),
            action,
            record.sandbox_id.as_deref(),
        )
        .detail(audit::SnapshotRef {
            snapshot: record.id.clone(),
            kind: record.kind.as_str(),
        })
        .into_row();
        let sid = record.id.clone();
        let deleted = self
            .db("delete a snapshot", move |s| {
                s.transaction(|tx| {
                    let deleted = tx.mark_snapshot_deleted(&sid, now_ms())?;
                    if deleted {
                        audit::append(tx, &row)?;
                    }
                    Ok::<_, StoreError>(deleted)
                })
            })
            .await?;
        if !deleted {
            return Err(snapshot_not_found(&record.id));
        }
        {
            let snapshot = stored_snapshot_id(&record.id)?;
            // A step transaction's checkpoint (commit, or consumed by its rollback) is deleted off the
            // agent's path: the record is gone already, and storage without a record is garbage the
            // next start collects if this is interrupted. An explicit delete frees it before answering.
            if matches!(action, AuditAction::SandboxCommit | AuditAction::SnapshotConsume) {
                self.free_snapshot_storage(vec![snapshot]);
            } else {
                self.free_snapshot_now(snapshot).await;
            }
        }
        Ok(())
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
            if !known.iter().any(|k| *k == *snapshot) {
                tracing::info!(snapshot = %snapshot, "removing unrecorded snapshot storage");
                self.free_snapshot_now(snapshot.clone()).await;
            }
        }
        for id in known {
            if !on_disk.iter().any(|s| *s == id) {
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

    /// Frees the storage of one snapshot before returning: one whose record is gone, or that was
    /// never recorded (best effort: a failure is logged, and storage without a record is garbage the
    /// next start collects).
    pub(crate) async fn free_snapshot_now(&self, snapshot: SnapshotId) {
        let freed = self
            .on_backend("delete a snapshot", move |b| {
                b.delete_snapshot(&snapshot).map_err(|e| (snapshot, e))
            })
            .await;
        if let Ok(Err((snapshot, e))) = freed {
            tracing::warn!(snapshot = %snapshot, error = %e, "snapshot storage not freed; the next start will");
        }
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
            if let Err(e) = self
                .drop_snapshot(None, &record, AuditAction::SnapshotDelete)
                .await
            {
                tracing::warn!(snapshot = %record.id, error = %e, "checkpoint not dropped");
            }
        }
        Ok(())
    }

    /// Storage of volumes the store does not know (a crash between creation and record, or a
    /// deletion whose storage removal failed) is removed; records whose storage is gone are marked
    /// deleted.
    pub(crate) async fn collect_volume_garbage(&self) -> Result<(), ServiceError> {
        let known = self.db("list volumes", |s| s.existing_volume_ids()).await?;
        let on_disk = self
            .on_backend("list volumes", |b| b.list_volumes())
            .await?
            .map_err(|e| runtime_error("list volumes", e))?;
        for volume in &on_disk {
            if !known.iter().any(|k| *k == volume.as_str()) {
                tracing::info!(volume = %volume, "removing unrecorded volume storage");
                let volume = volume.clone();
                let _ = self
                    .on_backend("delete a volume", move |b| b.delete_volume(&volume))
                    .await;
            }
        }
        for id in known {
            if !on_disk.iter().any(|v| v.as_str() == id) {
                tracing::warn!(volume = %id, "volume storage is gone; marking it deleted");
                let vid = id.clone();
                self.db("mark a volume deleted", move |s| {
                    s.mark_volume_deleted(&vid, now_ms())
                })
                .await?;
            }
        }
        Ok(())
    }

    /// Templates: a build that died with the previous server loses its record (its staging files
    /// are the backend's gc's), template storage the store does not know is removed, and a pulled
    /// image left in the pull directory is deleted.
    pub(crate) async fn collect_template_garbage(&self) -> Result<(), ServiceError> {
        let unfinished = self
            .db("forget unfinished templates", |s| s.forget_unfinished_templates())
            .await?;
        for id in &unfinished {
            tracing::info!(template = %id, "a template build was interrupted by a restart; its record is removed");
        }
        if let Some(dir) = &self.inner.config.images.pull_dir {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                // Names this server made (`tp-...`); the directory is the server's own.
                if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                    tracing::warn!(path = %entry.path().display(), error = %e, "pulled image not removed");
                }
            }
        }
        let known = self.db("list templates", |s| s.existing_template_ids()).await?;
        let on_disk = self
            .on_backend("list templates", |b| b.list_templates())
            .await?
            .map_err(|e| runtime_error("list templates", e))?;
        for template in on_disk {
            if !known.iter().any(|k| *k == template.as_str()) {
                tracing::info!(template = %template, "removing unrecorded template storage");
                let _ = self
                    .on_backend("delete a template", move |b| b.delete_template(&template))
                    .await;
            }
        }
        // Templates built before their storage was charged: measured once, then charged.
        let uncharged = self
            .db("list uncharged templates", |s| s.uncharged_templates())
            .await?;
        for id in uncharged {
            let Ok(template) = id.parse::<paddock_types::TemplateId>() else {
                continue;
            };
            let measured = self
                .on_backend("measure a template", move |b| b.template_bytes(&template))
                .await?;
            match measured {
                Ok(bytes) => {
                    let tid = id.clone();
                    self.db("charge a template", move |s| s.set_template_storage(&tid, bytes))
                        .await?;
                    tracing::info!(template = %id, bytes, "template charged what it holds");
                }
                Err(e) => tracing::warn!(template = %id, error = %e, "template not measured"),
            }
        }
        Ok(())
    }

    /// Deletes kept file systems of sandboxes the store does not say are stopped (a crash between
    /// the backend's stop or delete and the store's record).
    /// The kept file system of a sandbox whose stop or resume a crash interrupted (an intent in
    /// `intents`) is not garbage: recovery settles it.
    pub(crate) async fn collect_stopped_garbage(
        &self,
        intents: &[paddock_store::IntentRecord],
    ) -> Result<(), ServiceError> {
        for id in self
            .on_backend("list stopped sandboxes", |b| b.list_stopped())
            .await?
        {
            let sid = id.to_string();
            if intents.iter().any(|i| {
                i.sandbox_id == sid
                    && matches!(
                        i.op,
                        paddock_store::IntentOp::Stop | paddock_store::IntentOp::Resume
                    )
            }) {
                continue;
            }
            let record = self.db("read a sandbox", move |s| s.get_sandbox(&sid)).await?;
            if record.is_some_and(|r| r.state == SandboxState::Stopped) {
                continue;
            }
            tracing::info!(sandbox_id = %id, "deleting the kept files of a sandbox that is not stopped");
            self.free_stopped(id).await;
        }
        Ok(())
    }

    /// Deletes a stopped sandbox's kept files (logging a failure: the next start deletes what is
    /// left, storage without a stopped record).
    pub(crate) async fn free_stopped(&self, id: SandboxId) {
        let deleted = self
            .on_backend("delete a stopped file system", move |b| {
                b.delete_stopped(&id).map_err(|e| (id, e))
            })
            .await;
        if let Ok(Err((id, e))) = deleted {
            tracing::warn!(sandbox_id = %id, error = %e, "stopped file system not freed; the next start will");
        }
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
        row.action = AuditAction::SnapshotDelete.as_str().to_owned();
        row.outcome = "ok".to_owned();
        row.sandbox_id = Some(sandbox.to_owned());
        row.detail = audit::SnapshotRef {
            snapshot: record.id.clone(),
            kind: record.kind.as_str(),
        }
        .to_value();
        audit::append(tx, &row)?;
    }
    Ok(dropped.iter().filter_map(|r| r.id.parse().ok()).collect())
}
