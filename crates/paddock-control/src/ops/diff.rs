//! Diff: what changed in a sandbox's files since one of its snapshots (the newest checkpoint by
//! default), read from storage, so a paused sandbox can be diffed too.

use paddock_types::SandboxId;
use paddock_types::SnapshotId;

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// What changed in a sandbox's files since one of its snapshots (the newest checkpoint by default).
    pub async fn diff_sandbox(
        &self,
        p: &Principal,
        id: &SandboxId,
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
            .on_live_handle(&sb, "diff a sandbox", move |b, handle| {
                b.diff_sandbox(handle, &snapshot, &options)
            })
            .await?;
        self.audit(
            AuditEntry::ok(p, AuditAction::SandboxDiff, Some(id)).detail(audit::SandboxDiffed {
                snapshot: record.id.clone(),
                entries: diff.entries.len(),
            }),
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
