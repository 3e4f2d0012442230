//! The result of comparing a sandbox's files with a snapshot of them, and the bounds of the
//! comparison: data shared by the backends that compute diffs and the control plane that serves
//! them. The comparison itself is the backend's (`paddock_runtime::native::diff`).

use serde::{Deserialize, Serialize};

/// What to compare and how much work to spend on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiffOptions {
    /// Most entries in the result; the walk stops there and sets [`TreeDiff::truncated`].
    pub max_entries: usize,
    /// Most directory entries read from both trees together (the walk's work and memory); the walk
    /// stops there and sets `truncated`.
    pub max_scanned: u64,
    /// Deepest entries listed (a top-level directory such as `home` is at depth 1). Directories at
    /// this depth are listed but not entered, and `truncated` is set if there is one.
    pub max_depth: usize,
    /// Most bytes read from one file (each side) to compare contents; an equally sized file with a
    /// changed `ctime` that is larger counts as modified without being read.
    pub max_compare_bytes: u64,
    /// Most bytes read for content comparison (and text diffs) in all; past it, files that need
    /// reading count as modified without being read.
    pub max_total_compare_bytes: u64,
    /// Whether to produce unified diffs of changed text files.
    pub text_diff: bool,
    /// Largest file (each side) a text diff is made for.
    pub max_text_bytes: u64,
    /// Most bytes of unified diffs in all; once a diff would exceed it, no further diffs are made.
    pub max_total_text_bytes: u64,
    /// Subtrees to limit the comparison to, relative to the volume (`home/user`; a leading `/` is
    /// ignored). Empty means the whole tree. Each named path is itself compared, and may be a file.
    pub paths: Vec<String>,
}

impl Default for DiffOptions {
    fn default() -> Self {
        Self {
            max_entries: 1_000_000,
            max_scanned: 10_000_000,
            max_depth: 128,
            max_compare_bytes: 64 << 20,
            max_total_compare_bytes: 1 << 30,
            text_diff: false,
            max_text_bytes: 1 << 20,
            max_total_text_bytes: 16 << 20,
            paths: Vec::new(),
        }
    }
}

/// The differences between two trees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeDiff {
    /// Changed paths, depth-first, siblings in byte order.
    pub entries: Vec<DiffEntry>,
    /// The walk stopped at a bound (`max_entries`, `max_scanned`, `max_depth`): entries and counts
    /// are then incomplete.
    pub truncated: bool,
    /// Entries `Added`.
    pub added: u64,
    /// Entries `Modified` or `TypeChanged`.
    pub modified: u64,
    /// Entries `Deleted`.
    pub deleted: u64,
    /// Total size of regular files that appeared (added, or a path that became a file).
    pub bytes_added: u64,
    /// Total size of regular files that disappeared (deleted, or a path that stopped being a file).
    pub bytes_deleted: u64,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffEntry {
    /// The path as the sandbox sees it: the volume's top-level directories (`etc`, `home`, `root`,
    /// `tmp`) are the sandbox's `/etc`, `/home`, ...; bytes that are not UTF-8 are shown as U+FFFD.
    pub path: String,
    /// What happened to it.
    pub change: Change,
    /// Its kind: in `new`, or in `old` when deleted.
    pub kind: EntryKind,
    /// Size in `old` (files and symlinks).
    pub old_size: Option<u64>,
    /// Size in `new` (files and symlinks).
    pub new_size: Option<u64>,
    /// The permission bits (including setuid, setgid, sticky) differ.
    pub mode_changed: bool,
    /// The owning user or group differs.
    pub owner_changed: bool,
    /// A unified diff (`--- a/path`, `+++ b/path`, `/dev/null` for an absent side, 3 lines of
    /// context), for text files when asked for and within the bounds.
    pub unified: Option<String>,
}

/// How a path changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Only in `new`.
    Added,
    /// In both, of the same type, different.
    Modified,
    /// Only in `old`.
    Deleted,
    /// In both, of different types (a file became a directory, a fifo a socket, ...).
    TypeChanged,
}

/// The kind of a file system entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// A fifo, socket or device node (compared by metadata only).
    Other,
}
