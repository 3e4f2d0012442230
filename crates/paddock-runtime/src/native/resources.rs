//! What a running sandbox uses, and changing its limits while it runs.

use paddock_types::Limits;

use super::NativeBackend;
use crate::{RuntimeError, SandboxHandle, SandboxUsage};

impl NativeBackend {
    /// [`SandboxBackend::sandbox_usage`](crate::SandboxBackend::sandbox_usage): cgroup counters plus the sandbox
    /// subvolume's quota group.
    pub(super) fn usage(&self, handle: &SandboxHandle) -> Result<SandboxUsage, RuntimeError> {
        let cgroup = handle.native()?.cgroup.usage()?;
        let disk = self.pool.volume_usage(handle.id.as_str())?;
        Ok(SandboxUsage {
            cpu_time_us: cgroup.cpu_time_us,
            memory_bytes: cgroup.memory_bytes,
            memory_peak_bytes: cgroup.memory_peak_bytes,
            pids: cgroup.pids,
            disk_bytes: disk.bytes,
            disk_limit_bytes: disk.limit,
        })
    }

    /// [`SandboxBackend::update_limits`](crate::SandboxBackend::update_limits): the same cgroup files and quota
    /// group limit creation writes.
    pub(super) fn set_limits(&self, handle: &SandboxHandle, limits: &Limits) -> Result<(), RuntimeError> {
        handle.native()?.cgroup.set_limits(limits)?;
        self.pool.set_disk_limit(handle.id.as_str(), limits.disk)?;
        tracing::debug!(sandbox_id = %handle.id, ?limits, "limits updated");
        Ok(())
    }
}
