//! Snapshots: create, get, list, delete, and checkpoints (a snapshot to roll back to).
//!
//! A snapshot is a read-only capture of a sandbox's writable file system taken with its processes
//! frozen for the instant (crash-consistent); it holds files, never process memory. Its storage lives
//! in the pool, its record (owner, name, labels) in the store; the record is written with its audit
//! row in one transaction, and storage without a record is garbage (collected at startup).

use std::collections::BTreeMap;

use paddock_store::{SnapshotFilter, SnapshotKind};
use paddock_types::api::{CreateSnapshotRequest, ListSnapshotsQuery, SnapshotInfo, SnapshotList};
use paddock_types::SandboxId;
use paddock_types::SnapshotId;

use crate::core::access::info;
use crate::core::audit::AuditAction;
use crate::core::error::stored_snapshot_id;
use crate::lifecycle::capture::Capture;
use crate::plan::labels::{check_snapshot_labels, MAX_NAME_LEN};
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// Takes a snapshot of sandbox `id` (its processes frozen for the instant of the capture).
    pub async fn create_snapshot(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: CreateSnapshotRequest,
    ) -> Result<SnapshotInfo, ServiceError> {
        if req.name.as_ref().is_some_and(|n| n.len() > MAX_NAME_LEN) {
            return Err(ServiceError::invalid(
                "name",
                format!("at most {MAX_NAME_LEN} bytes"),
            ));
        }
        check_snapshot_labels(&req.labels)?;
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
                AuditAction::SnapshotCreate,
            )
            .await?;
        Ok(info(&record))
    }

    /// One snapshot, with its storage figures.
    pub async fn get_snapshot(&self, p: &Principal, id: &SnapshotId) -> Result<SnapshotInfo, ServiceError> {
        let record = self.owned_snapshot(p, id).await?;
        let mut body = info(&record);
        {
            let snapshot = id.clone();
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
        let limit = crate::core::paging::page_limit(q.limit)?;
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
        let next_cursor = crate::core::paging::finish_page(&mut records, limit, |r| r.id.clone());
        Ok(SnapshotList {
            snapshots: records.iter().map(info).collect(),
            next_cursor,
        })
    }

    /// Deletes a snapshot and frees what only it holds.
    pub async fn delete_snapshot(&self, p: &Principal, id: &SnapshotId) -> Result<(), ServiceError> {
        let record = self.owned_snapshot(p, id).await?;
        self.drop_snapshot(Some(p), &record, AuditAction::SnapshotDelete)
            .await
    }

    /// `checkpoint`: a snapshot to return to with `rollback` or drop with `commit`.
    pub async fn checkpoint(&self, p: &Principal, id: &SandboxId) -> Result<SnapshotInfo, ServiceError> {
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
                AuditAction::SandboxCheckpoint,
            )
            .await?;
        self.prepare_rollback(&sb, stored_snapshot_id(&record.id)?);
        Ok(info(&record))
    }
}

impl SandboxService {}
