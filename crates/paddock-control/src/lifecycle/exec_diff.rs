//! `audit_exec_diff`: the file changes of every process, recorded in the audit log.
//!
//! Before a process of such a sandbox starts, its file system is snapshotted (crash-consistent, as any
//! snapshot; the snapshot has no store record, so if the server dies before it is deleted, the garbage
//! collection at the next start removes it). When the process has exited, the sandbox is diffed
//! against it (metadata, and contents only where size and change time cannot tell) and a
//! `process.diff` row records the counts and the first [`MAX_AUDITED_PATHS`] changed paths; then the
//! snapshot is deleted. Changes made meanwhile by other processes of the sandbox are in the diff too.

use std::sync::Arc;

use paddock_types::diff::{Change, DiffOptions};
use paddock_types::SnapshotId;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::LiveSandbox;
use crate::{Principal, SandboxService, ServiceError};

/// Changed paths listed in one `process.diff` row (the counts cover them all).
pub(crate) const MAX_AUDITED_PATHS: usize = 100;

impl SandboxService {
    /// Snapshots `sb` before a process starts, if its sandbox records exec diffs.
    pub(crate) async fn exec_diff_base(
        &self,
        sb: &Arc<LiveSandbox>,
    ) -> Result<Option<SnapshotId>, ServiceError> {
        if !sb.spec().audit_exec_diff {
            return Ok(None);
        }
        let base = SnapshotId::from_random(rand::random());
        let taken = base.clone();
        self.on_live_handle(sb, "snapshot a sandbox before a process", move |b, handle| {
            b.snapshot_sandbox(handle, &taken)
        })
        .await?;
        Ok(Some(base))
    }

    /// Deletes an exec-diff snapshot (best effort: gc removes what is left).
    pub(crate) async fn drop_exec_diff_base(&self, base: &SnapshotId) {
        self.free_snapshot_now(base.clone()).await;
    }

    /// Diffs `sb` against `base` after process `pid` ended, records `process.diff`, deletes `base`.
    pub(crate) async fn record_exec_diff(
        &self,
        sb: &Arc<LiveSandbox>,
        p: &Principal,
        pid: u32,
        base: SnapshotId,
    ) {
        let options = DiffOptions {
            text_diff: false,
            max_entries: 10_000,
            ..DiffOptions::default()
        };
        let against = base.clone();
        let diff = match self
            .on_handle(sb, "diff a sandbox after a process", move |b, handle| {
                b.diff_sandbox(handle, &against, &options)
            })
            .await
        {
            Ok(Some(diff)) => diff.map_err(|e| e.to_string()),
            Ok(None) => Err(format!("sandbox {} is ending", sb.id)),
            Err(e) => Err(e.to_string()),
        };
        let entry = match diff {
            Ok(diff) => {
                let paths = diff
                    .entries
                    .iter()
                    .take(MAX_AUDITED_PATHS)
                    .map(|e| audit::DiffPath {
                        path: e.path.clone(),
                        change: match e.change {
                            Change::Added => "added",
                            Change::Modified => "modified",
                            Change::Deleted => "deleted",
                            Change::TypeChanged => "type_changed",
                        },
                        size: e.new_size.or(e.old_size),
                    })
                    .collect();
                AuditEntry::ok(p, AuditAction::ProcessDiff, Some(&sb.id)).detail(audit::ProcessDiffed {
                    pid,
                    added: diff.added,
                    modified: diff.modified,
                    deleted: diff.deleted,
                    bytes_added: diff.bytes_added,
                    bytes_deleted: diff.bytes_deleted,
                    truncated: diff.truncated || diff.entries.len() > MAX_AUDITED_PATHS,
                    paths,
                })
            }
            Err(message) => AuditEntry::ok(p, AuditAction::ProcessDiff, Some(&sb.id))
                .outcome("error")
                .detail(audit::ProcessDiffFailed { pid, message }),
        };
        if let Err(e) = self.audit(entry).await {
            tracing::error!(sandbox_id = %sb.id, pid, error = %e, "cannot record a process diff");
        }
        self.drop_exec_diff_base(&base).await;
    }
}
