//! Moving a snapshot between hosts as a tar stream: [`export`] writes a snapshot's tree as a POSIX
//! (pax) tar archive, [`import`] unpacks an untrusted one into a staging subvolume that the pool then
//! makes a read-only snapshot (`native/staging.rs`). Both walk trees
//! descriptor-relative without following symlinks; neither holds a whole archive in memory.
//!
//! This module does not know tenants or records, and does not stream over a network: the caller
//! hands it a reader or a writer and runs it on a blocking thread.

mod export;
mod import;
pub(crate) mod pax;
#[cfg(test)]
mod tests;

use std::io::{Read, Write};

use paddock_types::SnapshotId;
use serde::{Deserialize, Serialize};

use super::staging::{Area, Staging};
use super::NativeBackend;
use crate::RuntimeError;

/// Bounds of one import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImportLimits {
    /// Most bytes of archive read (headers and padding included). Past it the import fails with
    /// [`RuntimeError::ArchiveTooLarge`](crate::RuntimeError). The staging subvolume's disk limit is
    /// derived from it ([`staging_disk_limit`]).
    pub max_bytes: u64,
    /// Most members (files, directories, links).
    pub max_entries: u64,
}

impl Default for ImportLimits {
    fn default() -> Self {
        Self {
            max_bytes: 10 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// What one export wrote or one import read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferSummary {
    /// Bytes of archive.
    pub bytes: u64,
    /// Members (directories, files, symlinks, hard links).
    pub entries: u64,
    /// Bytes of regular files' contents.
    pub data_bytes: u64,
    /// Fifos, sockets and devices left out of an export.
    pub skipped: u64,
    /// Members of an export whose setuid or setgid bit was cleared (see [`ExportOptions`]).
    #[serde(default)]
    pub setid_cleared: u64,
}

/// How an export writes its archive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportOptions {
    /// Keep setuid and setgid bits. By default they are cleared from every member (and counted in
    /// [`TransferSummary::setid_cleared`]): the archive's owners are the sandbox's ids, so a file the
    /// sandbox's root made setuid would unpack, for a host root extracting with permissions, as a
    /// setuid-root program of the sandbox's choosing.
    pub keep_setid: bool,
}

/// The disk limit of an import's staging subvolume, for an archive of at most `max_bytes`.
///
/// What is unpacked is never more file data than the archive held (the reader stops at
/// `max_bytes`, and sparse members are refused), but btrfs spends more than tar counts: data in
/// 4 KiB blocks where tar pads to 512 bytes (a file of 2049 bytes is 3072 bytes of archive and
/// 4096 of disk), its own metadata, and room reserved before each step. An archive of exactly
/// `max_bytes` must unpack, so the limit leaves half again and 16 MiB for that; it stays the
/// backstop on the disk one import can write, and meeting it is the archive's failure (too
/// large), not the pool's.
pub(crate) fn staging_disk_limit(max_bytes: u64) -> u64 {
    max_bytes.saturating_add(max_bytes / 2).saturating_add(16 << 20)
}

impl NativeBackend {
    /// [`StorageBackend::export_snapshot`](crate::StorageBackend::export_snapshot).
    pub(super) fn export(
        &self,
        snapshot: &SnapshotId,
        options: &ExportOptions,
        out: &mut dyn Write,
    ) -> Result<TransferSummary, RuntimeError> {
        let root = self.pool.existing_snapshot(snapshot)?;
        let summary = export::export_tree(&root, self.config.ids, options, out)?;
        tracing::debug!(
            snapshot = %snapshot,
            bytes = summary.bytes,
            entries = summary.entries,
            skipped = summary.skipped,
            setid_cleared = summary.setid_cleared,
            "snapshot exported"
        );
        Ok(summary)
    }

    /// [`StorageBackend::import_snapshot`](crate::StorageBackend::import_snapshot).
    pub(super) fn import(
        &self,
        snapshot: &SnapshotId,
        input: &mut dyn Read,
        limits: &ImportLimits,
    ) -> Result<TransferSummary, RuntimeError> {
        if self.pool.snapshot_path(snapshot).exists() {
            return Err(RuntimeError::InvalidSpec(format!(
                "snapshot {snapshot} already exists"
            )));
        }
        // Dropped on any error: the staging subvolume is deleted then.
        let staging = Staging::begin(
            self.pool.root(),
            Area::Imports,
            snapshot.as_str(),
            None,
            staging_disk_limit(limits.max_bytes),
        )?;
        let summary = import::import_tree(staging.path(), self.config.ids, input, limits)?;
        staging.finish()?;
        tracing::debug!(
            snapshot = %snapshot,
            bytes = summary.bytes,
            entries = summary.entries,
            "snapshot imported"
        );
        Ok(summary)
    }
}
