//! File bodies.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKindBody {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (never followed).
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// A file's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileEntry {
    /// Its name.
    pub name: String,
    /// Its absolute path inside the sandbox.
    pub path: String,
    /// What it is.
    pub kind: FileKindBody,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (e.g. 420 = 0o644).
    pub mode: u32,
    /// Owner uid inside the sandbox.
    pub uid: u32,
    /// Owner gid inside the sandbox.
    pub gid: u32,
    /// Modification time (RFC 3339).
    pub modified_at: String,
    /// Where a symlink points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

/// `GET .../files/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FileList {
    /// The entries, sorted by name.
    pub entries: Vec<FileEntry>,
}

/// `PUT .../files` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WrittenFile {
    /// The file's path.
    pub path: String,
    /// Bytes written.
    pub bytes: u64,
}

/// `POST .../files/mkdir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// Absolute path of the directory.
    pub path: String,
    /// Create missing parents, and succeed if it exists.
    #[serde(default)]
    pub parents: bool,
    /// Permission bits (default 0o755).
    #[serde(default)]
    pub mode: Option<u32>,
    /// Owner (the sandbox's default user when absent).
    #[serde(default)]
    pub user: Option<String>,
    /// The approval it runs under, when the sandbox's approval policy asks (the id an
    /// `approval_pending` answer named, once approved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

/// `POST .../files/rename`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenameRequest {
    /// Existing path.
    pub from: String,
    /// New path.
    pub to: String,
    /// The approval it runs under, when the sandbox's approval policy asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

/// What happened to a watched path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WatchEventKind {
    /// Created.
    Create,
    /// Content written.
    Modify,
    /// Removed.
    Remove,
    /// Renamed away from this path.
    RenameFrom,
    /// Renamed to this path.
    RenameTo,
    /// Metadata changed.
    Attrib,
    /// Events were lost (the consumer was too slow); re-list the directory.
    Overflow,
    /// The watched directory is gone; the stream ends.
    Ended,
}

/// One event of `GET .../files/watch` (NDJSON or SSE).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WatchEvent {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// What happened.
    pub kind: WatchEventKind,
    /// The path is a directory.
    pub is_dir: bool,
}
