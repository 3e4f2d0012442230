//! Snapshots of a running sandbox, and pausing it: both are the cgroup2 freezer.
//!
//! A snapshot is crash-consistent: every process of the sandbox is frozen (stopped at its next return
//! to user space, so no write is half-issued), the sandbox's subvolume is snapshotted read-only into
//! `<pool>/snapshots/<id>` (the ioctl flushes the dirty data first and commits a transaction), and the
//! sandbox is thawed. What the snapshot holds is what the processes had written when they stopped, as
//! after a power cut at that instant; their memory is not captured. A paused sandbox is already frozen
//! and stays so. A fork freezes its sandbox the same way (`freeze_held`) for as long as it makes
//! its copies' volumes straight from the sandbox's.

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use paddock_types::SnapshotId;

use super::{NativeBackend, NativeSandbox};
use crate::{RuntimeError, SandboxHandle};

/// How long freezing may take before the snapshot or pause gives up (a process stuck in the kernel,
/// e.g. on a hung network file system, cannot stop).
const FREEZE_DEADLINE: Duration = Duration::from_secs(5);

impl NativeBackend {
    /// [`StorageBackend::snapshot_sandbox`](crate::StorageBackend::snapshot_sandbox).
    pub(super) fn snapshot(&self, handle: &SandboxHandle, snapshot: &SnapshotId) -> Result<(), RuntimeError> {
        let sb = handle.native()?;
        let _guard = sb.freezer.lock().unwrap_or_else(PoisonError::into_inner);
        let start = Instant::now();
        let paused = freeze_unless_frozen(sb)?;
        let frozen = start.elapsed();
        crate::fault::point("snapshot.frozen");
        let taken = self.pool.create_snapshot(handle.id.as_str(), snapshot);
        let snapshotted = start.elapsed();
        // Thawed whether or not the snapshot worked.
        let thawed = if paused { Ok(()) } else { sb.cgroup.thaw() };
        tracing::debug!(
            sandbox_id = %handle.id,
            snapshot = %snapshot,
            paused,
            freeze_us = frozen.as_micros() as u64,
            snapshot_us = (snapshotted - frozen).as_micros() as u64,
            thaw_us = (start.elapsed() - snapshotted).as_micros() as u64,
            "snapshot taken"
        );
        taken.and(thawed)
    }

    /// [`SandboxBackend::pause_sandbox`](crate::SandboxBackend::pause_sandbox).
    pub(super) fn pause(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let sb = handle.native()?;
        let _guard = sb.freezer.lock().unwrap_or_else(PoisonError::into_inner);
        sb.cgroup.freeze(FREEZE_DEADLINE)?;
        tracing::debug!(sandbox_id = %handle.id, "paused");
        Ok(())
    }

    /// [`SandboxBackend::freeze_sandbox`](crate::SandboxBackend::freeze_sandbox).
    pub(super) fn freeze_held(&self, handle: &SandboxHandle) -> Result<bool, RuntimeError> {
        let sb = handle.native()?;
        let _guard = sb.freezer.lock().unwrap_or_else(PoisonError::into_inner);
        let start = Instant::now();
        let was_frozen = freeze_unless_frozen(sb)?;
        if !was_frozen {
            tracing::debug!(sandbox_id = %handle.id, freeze_us = start.elapsed().as_micros() as u64, "frozen");
        }
        Ok(was_frozen)
    }

    /// [`SandboxBackend::resume_sandbox`](crate::SandboxBackend::resume_sandbox).
    pub(super) fn resume(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        let sb = handle.native()?;
        let _guard = sb.freezer.lock().unwrap_or_else(PoisonError::into_inner);
        sb.cgroup.thaw()?;
        tracing::debug!(sandbox_id = %handle.id, "resumed");
        Ok(())
    }
}

/// Freezes `sb` unless it is frozen already (paused); whether it was. The caller holds `sb.freezer`.
fn freeze_unless_frozen(sb: &NativeSandbox) -> Result<bool, RuntimeError> {
    if sb.cgroup.frozen()? {
        return Ok(true);
    }
    sb.cgroup.freeze(FREEZE_DEADLINE)?;
    Ok(false)
}
