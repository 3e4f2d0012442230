//! Snapshots, forks, step transactions (checkpoint / rollback / commit), diffs.
//!
//! A snapshot captures a sandbox's writable file system (`/etc`, `/home`, `/root`, `/tmp`), not the
//! memory of its processes: restoring one restarts the sandbox's processes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// `POST /v1/sandboxes/{id}/snapshots`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    /// A name to recognise it by.
    #[serde(default)]
    pub name: Option<String>,
    /// Free-form labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// What a snapshot is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKindBody {
    /// Taken on request; kept until deleted.
    Snapshot,
    /// A step transaction's checkpoint: dropped by `commit`, consumed by `rollback`.
    Checkpoint,
}

/// A snapshot of a sandbox's file system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotInfo {
    /// Its id.
    pub id: String,
    /// The sandbox it was taken of; absent for a snapshot imported from an archive.
    #[serde(default)]
    pub sandbox_id: Option<String>,
    /// Snapshot or checkpoint.
    pub kind: SnapshotKindBody,
    /// Its name.
    #[serde(default)]
    pub name: Option<String>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// When it was taken (RFC 3339).
    pub created_at: String,
    /// Bytes it refers to (shared with its sandbox and other snapshots included), when known.
    #[serde(default)]
    pub referenced_bytes: Option<u64>,
    /// Bytes only it holds (what deleting it frees), when known.
    #[serde(default)]
    pub exclusive_bytes: Option<u64>,
    /// What it is charged against its tenant's storage quota: the most it can hold on its own (what
    /// its sandbox started from plus what the sandbox had written when it was taken; for an import,
    /// the archive's size).
    #[serde(default)]
    pub storage_bytes: u64,
}

/// `GET /v1/snapshots`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    /// The snapshots, in id order.
    pub snapshots: Vec<SnapshotInfo>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `GET /v1/snapshots` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListSnapshotsQuery {
    /// Only snapshots of this sandbox.
    #[serde(default)]
    pub sandbox: Option<String>,
    /// `snapshot` or `checkpoint`.
    #[serde(default)]
    pub kind: Option<String>,
    /// Page size (1-1000, default 100).
    #[serde(default)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[serde(default, deserialize_with = "super::cursor::deserialize_cursor")]
    pub cursor: Option<String>,
}

/// `GET /v1/snapshots/{id}/export` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExportSnapshotQuery {
    /// Keep setuid and setgid bits in the archive. By default they are cleared from every member:
    /// files the sandbox's root made are owned by uid 0 in the archive, and a host root unpacking it
    /// with permissions would otherwise create setuid-root programs of the sandbox's choosing.
    #[serde(default)]
    pub keep_setid: Option<bool>,
}

/// `POST /v1/snapshots/import` query: the request body is the tar archive.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ImportSnapshotQuery {
    /// A name to recognise it by.
    #[serde(default)]
    pub name: Option<String>,
    /// Labels as a JSON object (`{"k":"v"}`), URL-encoded.
    #[serde(default)]
    pub labels: Option<String>,
}

/// `POST /v1/sandboxes/{id}/fork`: `count` new sandboxes whose file systems start as copies of this
/// one's (copy-on-write), each with its own id, limits and processes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many copies (1-100).
    pub count: u32,
    /// Labels of the copies (the source's labels when absent).
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    /// Timeout of the copies (the server's default when absent).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// The sandboxes a fork made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ForkResult {
    /// The copies.
    pub sandboxes: Vec<super::SandboxInfo>,
}

/// `POST /v1/sandboxes/{id}/rollback`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    /// The snapshot to return to; the newest checkpoint when absent (which the rollback consumes).
    #[serde(default)]
    pub snapshot: Option<String>,
}

/// `GET /v1/sandboxes/{id}/diff` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DiffQuery {
    /// Compare with this snapshot; the newest checkpoint when absent.
    #[serde(default)]
    pub snapshot: Option<String>,
    /// Include unified diffs of changed text files.
    #[serde(default)]
    pub text: Option<bool>,
}

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChangeBody {
    /// New since the snapshot.
    Added,
    /// Content, mode, owner or link target changed.
    Modified,
    /// Gone since the snapshot.
    Deleted,
    /// A file became a directory or the like.
    TypeChanged,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DiffEntryBody {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// What happened.
    pub change: ChangeBody,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size before.
    #[serde(default)]
    pub old_size: Option<u64>,
    /// Size after.
    #[serde(default)]
    pub new_size: Option<u64>,
    /// Unified diff (text files, when asked for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unified: Option<String>,
}

/// `GET /v1/sandboxes/{id}/diff`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DiffResult {
    /// The snapshot compared with.
    pub snapshot: String,
    /// Changed paths, sorted.
    pub entries: Vec<DiffEntryBody>,
    /// Files added.
    pub added: u64,
    /// Files modified.
    pub modified: u64,
    /// Files deleted.
    pub deleted: u64,
    /// The listing stopped at the server's limit.
    pub truncated: bool,
}
