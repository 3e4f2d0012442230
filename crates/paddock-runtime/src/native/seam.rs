//! The native backend behind the seam: each trait method names the inherent method (in the module of
//! its step) that does the work.

use paddock_types::diff::{DiffOptions, TreeDiff};
use paddock_types::{ByteSize, Limits, SandboxId, SandboxSpec, SnapshotId, TemplateId, VolumeId};

use super::NativeBackend;
use crate::{
    Adoption, Capabilities, ExportOptions, ImportLimits, PortSocket, RuntimeError, SandboxBackend,
    SandboxHandle, SandboxUsage, SnapshotUsage, StorageBackend, TemplateBuilt, TemplateLimits,
    TemplateProgress, TemplateSource, TransferSummary, VolumeUsage,
};

impl SandboxBackend for NativeBackend {
    fn capabilities(&self) -> Capabilities {
        NativeBackend::capabilities(self)
    }

    fn create_sandbox(&self, spec: &SandboxSpec) -> Result<SandboxHandle, RuntimeError> {
        self.create(spec)
    }

    fn destroy_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError> {
        self.destroy(handle)
    }

    fn collect_garbage(&self) -> Result<Vec<String>, RuntimeError> {
        self.collect_garbage_now()
    }

    fn settle_teardowns(&self, timeout: std::time::Duration) -> bool {
        self.deferred.settle(timeout)
    }

    fn stop_sandbox(&self, handle: SandboxHandle) -> Result<(), RuntimeError> {
        self.stop(handle)
    }

    fn delete_stopped(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        self.pool.delete_stopped(id.as_str())
    }

    fn park_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        self.park(id)
    }

    fn list_stopped(&self) -> Vec<SandboxId> {
        self.pool
            .list_stopped()
            .into_iter()
            .filter_map(|id| id.parse().ok())
            .collect()
    }

    fn adopt_sandbox(&self, id: &SandboxId) -> Result<Adoption, RuntimeError> {
        self.adopt(id)
    }

    fn sandbox_usage(&self, handle: &SandboxHandle) -> Result<SandboxUsage, RuntimeError> {
        self.usage(handle)
    }

    fn update_limits(&self, handle: &SandboxHandle, limits: &Limits) -> Result<(), RuntimeError> {
        self.set_limits(handle, limits)
    }

    fn reclaim_sandbox(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        self.reclaim_unowned(id)
    }

    fn pause_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.pause(handle)
    }

    fn resume_sandbox(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.resume(handle)
    }

    fn freeze_sandbox(&self, handle: &SandboxHandle) -> Result<bool, RuntimeError> {
        self.freeze_held(handle)
    }

    fn prepare_rollback(&self, handle: &SandboxHandle, snapshot: &SnapshotId) -> Result<(), RuntimeError> {
        self.prepare(handle, snapshot)
    }

    fn discard_rollback(&self, handle: &SandboxHandle) -> Result<(), RuntimeError> {
        self.discard_prepared(handle.native()?);
        Ok(())
    }

    fn rollback_sandbox(
        &self,
        handle: SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<SandboxHandle, RuntimeError> {
        self.rollback(handle, snapshot)
    }

    fn open_port(&self, handle: &SandboxHandle, port: u16) -> Result<PortSocket, RuntimeError> {
        super::ports::open_port(handle.native()?, port)
    }
}

impl StorageBackend for NativeBackend {
    fn snapshot_sandbox(&self, handle: &SandboxHandle, snapshot: &SnapshotId) -> Result<(), RuntimeError> {
        self.snapshot(handle, snapshot)
    }

    fn delete_snapshot(&self, snapshot: &SnapshotId) -> Result<bool, RuntimeError> {
        self.pool.delete_snapshot(snapshot)
    }

    fn snapshot_usage(&self, snapshot: &SnapshotId) -> Result<SnapshotUsage, RuntimeError> {
        super::snapshot_usage::measure(&self.pool.existing_snapshot(snapshot)?)
    }

    fn list_snapshots(&self) -> Result<Vec<SnapshotId>, RuntimeError> {
        self.pool.list_snapshots()
    }

    fn export_snapshot(
        &self,
        snapshot: &SnapshotId,
        options: &ExportOptions,
        out: &mut dyn std::io::Write,
    ) -> Result<TransferSummary, RuntimeError> {
        self.export(snapshot, options, out)
    }

    fn import_snapshot(
        &self,
        snapshot: &SnapshotId,
        input: &mut dyn std::io::Read,
        limits: &ImportLimits,
    ) -> Result<TransferSummary, RuntimeError> {
        self.import(snapshot, input, limits)
    }

    fn create_volume(&self, volume: &VolumeId, size: Option<ByteSize>) -> Result<(), RuntimeError> {
        self.pool.create_named_volume(volume, size)
    }

    fn delete_volume(&self, volume: &VolumeId) -> Result<bool, RuntimeError> {
        self.pool.delete_named_volume(volume)
    }

    fn volume_usage(&self, volume: &VolumeId) -> Result<VolumeUsage, RuntimeError> {
        self.pool.named_volume_usage(volume)
    }

    fn list_volumes(&self) -> Result<Vec<VolumeId>, RuntimeError> {
        self.pool.list_named_volumes()
    }

    fn diff_sandbox(
        &self,
        handle: &SandboxHandle,
        snapshot: &SnapshotId,
        options: &DiffOptions,
    ) -> Result<TreeDiff, RuntimeError> {
        let old = self.pool.existing_snapshot(snapshot)?;
        let new = self.pool.volume_path(handle.id.as_str());
        super::diff::diff_trees(&old, &new, options).map_err(|e| RuntimeError::Pool {
            what: "diff",
            path: new.clone(),
            source: std::io::Error::other(e.to_string()),
        })
    }

    fn build_template(
        &self,
        template: &TemplateId,
        source: &TemplateSource,
        limits: &TemplateLimits,
        progress: &mut dyn FnMut(TemplateProgress),
    ) -> Result<TemplateBuilt, RuntimeError> {
        NativeBackend::build_template(self, template, source, limits, progress)
    }

    fn delete_template(&self, template: &TemplateId) -> Result<bool, RuntimeError> {
        NativeBackend::delete_template(self, template)
    }

    fn list_templates(&self) -> Result<Vec<TemplateId>, RuntimeError> {
        NativeBackend::list_templates(self)
    }

    fn template_bytes(&self, template: &TemplateId) -> Result<u64, RuntimeError> {
        NativeBackend::template_bytes(self, template)
    }

    fn cached_prefix(&self, chain: &[String]) -> Result<usize, RuntimeError> {
        NativeBackend::cached_prefix(self, chain)
    }

    fn cache_template(&self, template: &TemplateId, key: &str, bytes: u64) -> Result<(), RuntimeError> {
        NativeBackend::cache_template(self, template, key, bytes)
    }

    fn template_from_cache(
        &self,
        template: &TemplateId,
        chain: &[String],
    ) -> Result<Option<TemplateBuilt>, RuntimeError> {
        NativeBackend::template_from_cache(self, template, chain)
    }

    fn template_with_dirs(
        &self,
        template: &TemplateId,
        from: &TemplateId,
        from_bytes: u64,
        chain: &[String],
        dirs: &[String],
    ) -> Result<TemplateBuilt, RuntimeError> {
        NativeBackend::template_with_dirs(self, template, from, from_bytes, chain, dirs)
    }

    fn template_from_snapshot(
        &self,
        template: &TemplateId,
        snapshot: &SnapshotId,
        chain: &[String],
        config: &paddock_types::ImageConfig,
        snapshot_bytes: u64,
    ) -> Result<u64, RuntimeError> {
        NativeBackend::template_from_snapshot(self, template, snapshot, chain, config, snapshot_bytes)
    }
}
