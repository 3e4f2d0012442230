//! The fake's storage ([`StorageBackend`]): snapshots as copies of a sandbox's tree, their tar
//! export and import, named volumes (trees with a size limit) and diffs. Trees are copied out of the
//! lock before slow work (an export to a slow reader, a diff), so the agents are never held up.

use paddock_types::diff::{DiffOptions, TreeDiff};
use paddock_types::{ByteSize, SnapshotId, TemplateId, VolumeId};

use super::agent::lock;
use super::diff::diff_trees;
use super::lifecycle::live_mut;
use super::state::Disk;
use super::transfer::{read_tree, write_tree};
use super::tree::empty_volume;
use super::FakeBackend;
use crate::{
    BuiltLayer, ExportOptions, ImportLimits, RuntimeError, SandboxHandle, SnapshotUsage, StorageBackend,
    TemplateBuilt, TemplateLimits, TemplateProgress, TemplateSource, TransferSummary, VolumeUsage,
};

fn no_snapshot(snapshot: &SnapshotId) -> RuntimeError {
    RuntimeError::InvalidSpec(format!("snapshot {snapshot} does not exist"))
}

impl StorageBackend for FakeBackend {
    fn snapshot_sandbox(&self, handle: &SandboxHandle, snapshot: &SnapshotId) -> Result<(), RuntimeError> {
        self.shared.faults.take("snapshot_sandbox")?;
        let mut state = lock(&self.shared.state);
        if state.snapshots.contains_key(snapshot) {
            return Err(RuntimeError::InvalidSpec(format!(
                "snapshot {snapshot} exists already"
            )));
        }
        let tree = live_mut(&mut state, handle)?.disk.tree.clone();
        state.snapshots.insert(snapshot.clone(), tree);
        Ok(())
    }

    fn delete_snapshot(&self, snapshot: &SnapshotId) -> Result<bool, RuntimeError> {
        self.shared.faults.take("delete_snapshot")?;
        Ok(lock(&self.shared.state).snapshots.remove(snapshot).is_some())
    }

    fn snapshot_usage(&self, snapshot: &SnapshotId) -> Result<SnapshotUsage, RuntimeError> {
        self.shared.faults.take("snapshot_usage")?;
        let state = lock(&self.shared.state);
        let bytes = state
            .snapshots
            .get(snapshot)
            .ok_or_else(|| no_snapshot(snapshot))?
            .data_bytes();
        // Nothing is shared between copies: everything a snapshot refers to is its own.
        Ok(SnapshotUsage {
            referenced_bytes: bytes,
            exclusive_bytes: bytes,
        })
    }

    fn list_snapshots(&self) -> Result<Vec<SnapshotId>, RuntimeError> {
        self.shared.faults.take("list_snapshots")?;
        Ok(lock(&self.shared.state).snapshots.keys().cloned().collect())
    }

    fn export_snapshot(
        &self,
        snapshot: &SnapshotId,
        options: &ExportOptions,
        out: &mut dyn std::io::Write,
    ) -> Result<TransferSummary, RuntimeError> {
        self.shared.faults.take("export_snapshot")?;
        let tree = lock(&self.shared.state)
            .snapshots
            .get(snapshot)
            .cloned()
            .ok_or_else(|| no_snapshot(snapshot))?;
        write_tree(&tree, options, out)
    }

    fn import_snapshot(
        &self,
        snapshot: &SnapshotId,
        input: &mut dyn std::io::Read,
        limits: &ImportLimits,
    ) -> Result<TransferSummary, RuntimeError> {
        self.shared.faults.take("import_snapshot")?;
        if lock(&self.shared.state).snapshots.contains_key(snapshot) {
            return Err(RuntimeError::InvalidSpec(format!(
                "snapshot {snapshot} already exists"
            )));
        }
        let (tree, summary) = read_tree(input, limits, true)?;
        let mut state = lock(&self.shared.state);
        if state.snapshots.contains_key(snapshot) {
            return Err(RuntimeError::InvalidSpec(format!(
                "snapshot {snapshot} already exists"
            )));
        }
        state.snapshots.insert(snapshot.clone(), tree);
        Ok(summary)
    }

    fn create_volume(&self, volume: &VolumeId, size: Option<ByteSize>) -> Result<(), RuntimeError> {
        self.shared.faults.take("create_volume")?;
        let mut state = lock(&self.shared.state);
        if state.volumes.contains_key(volume) {
            return Err(RuntimeError::InvalidSpec(format!(
                "volume {volume} exists already"
            )));
        }
        state.volumes.insert(
            volume.clone(),
            Disk {
                tree: empty_volume(),
                limit: size.map(u64::from),
            },
        );
        Ok(())
    }

    fn delete_volume(&self, volume: &VolumeId) -> Result<bool, RuntimeError> {
        self.shared.faults.take("delete_volume")?;
        Ok(lock(&self.shared.state).volumes.remove(volume).is_some())
    }

    fn volume_usage(&self, volume: &VolumeId) -> Result<VolumeUsage, RuntimeError> {
        self.shared.faults.take("volume_usage")?;
        let state = lock(&self.shared.state);
        let disk = state
            .volumes
            .get(volume)
            .ok_or_else(|| RuntimeError::InvalidSpec(format!("volume {volume} does not exist")))?;
        Ok(VolumeUsage {
            bytes: disk.tree.data_bytes(),
            limit: disk.limit,
        })
    }

    fn list_volumes(&self) -> Result<Vec<VolumeId>, RuntimeError> {
        self.shared.faults.take("list_volumes")?;
        Ok(lock(&self.shared.state).volumes.keys().cloned().collect())
    }

    fn diff_sandbox(
        &self,
        handle: &SandboxHandle,
        snapshot: &SnapshotId,
        options: &DiffOptions,
    ) -> Result<TreeDiff, RuntimeError> {
        self.shared.faults.take("diff_sandbox")?;
        let (old, new) = {
            let mut state = lock(&self.shared.state);
            let old = state
                .snapshots
                .get(snapshot)
                .cloned()
                .ok_or_else(|| no_snapshot(snapshot))?;
            (old, live_mut(&mut state, handle)?.disk.tree.clone())
        };
        diff_trees(&old, &new, options).map_err(|e| RuntimeError::InvalidSpec(e.0))
    }

    /// Reads the layout for real (the image's manifest and config, checked as the native backend
    /// checks them) but unpacks nothing.
    fn build_template(
        &self,
        template: &TemplateId,
        source: &TemplateSource,
        _limits: &TemplateLimits,
        progress: &mut dyn FnMut(TemplateProgress),
    ) -> Result<TemplateBuilt, RuntimeError> {
        self.shared.faults.take("build_template")?;
        if lock(&self.shared.state).templates.contains_key(template) {
            return Err(RuntimeError::InvalidSpec(format!(
                "template {template} already exists"
            )));
        }
        let TemplateSource::ImageLayout { path, reference } = source;
        let layout = crate::native::image::ImageLayout::open(path).map_err(RuntimeError::Image)?;
        let manifest = layout
            .resolve(reference.as_deref())
            .map_err(RuntimeError::Image)?;
        progress(TemplateProgress::Resolved {
            digest: manifest.digest.to_string(),
            layers: manifest.layers.len(),
        });
        let mut layers = Vec::new();
        for (index, layer) in manifest.layers.iter().enumerate() {
            progress(TemplateProgress::Layer {
                index,
                digest: layer.digest.to_string(),
                size: layer.size,
                cached: false,
            });
            layers.push(BuiltLayer {
                digest: layer.digest.to_string(),
                size: layer.size,
                cached: false,
            });
        }
        // Nothing is unpacked: the fake's tree holds its blobs' bytes.
        let bytes = layers.iter().map(|l| l.size).sum();
        let built = TemplateBuilt {
            digest: manifest.digest.to_string(),
            config: manifest.config,
            layers,
            added_default_user: false,
            bytes,
        };
        lock(&self.shared.state)
            .templates
            .insert(template.clone(), built.clone());
        Ok(built)
    }

    fn delete_template(&self, template: &TemplateId) -> Result<bool, RuntimeError> {
        self.shared.faults.take("delete_template")?;
        Ok(lock(&self.shared.state).templates.remove(template).is_some())
    }

    fn template_bytes(&self, template: &TemplateId) -> Result<u64, RuntimeError> {
        lock(&self.shared.state)
            .templates
            .get(template)
            .map(|t| t.bytes)
            .ok_or_else(|| RuntimeError::InvalidSpec(format!("template {template} does not exist")))
    }

    fn list_templates(&self) -> Result<Vec<TemplateId>, RuntimeError> {
        Ok(lock(&self.shared.state).templates.keys().cloned().collect())
    }

    fn cached_prefix(&self, chain: &[String]) -> Result<usize, RuntimeError> {
        let state = lock(&self.shared.state);
        Ok(chain
            .iter()
            .take_while(|k| state.layer_cache.contains_key(*k))
            .count())
    }

    fn cache_template(&self, template: &TemplateId, key: &str, bytes: u64) -> Result<(), RuntimeError> {
        self.shared.faults.take("cache_template")?;
        let mut state = lock(&self.shared.state);
        let built = state
            .templates
            .get(template)
            .cloned()
            .ok_or_else(|| RuntimeError::InvalidSpec(format!("template {template} does not exist")))?;
        state
            .layer_cache
            .entry(key.to_owned())
            .or_insert(TemplateBuilt { bytes, ..built });
        Ok(())
    }

    fn template_from_cache(
        &self,
        template: &TemplateId,
        chain: &[String],
    ) -> Result<Option<TemplateBuilt>, RuntimeError> {
        self.shared.faults.take("template_from_cache")?;
        let mut state = lock(&self.shared.state);
        if state.templates.contains_key(template) {
            return Err(RuntimeError::InvalidSpec(format!(
                "template {template} already exists"
            )));
        }
        let Some(cached) = chain.last().and_then(|k| state.layer_cache.get(k)).cloned() else {
            return Ok(None);
        };
        let built = TemplateBuilt {
            layers: Vec::new(),
            ..cached
        };
        state.templates.insert(template.clone(), built.clone());
        Ok(Some(built))
    }

    fn template_with_dirs(
        &self,
        template: &TemplateId,
        from: &TemplateId,
        from_bytes: u64,
        chain: &[String],
        _dirs: &[String],
    ) -> Result<TemplateBuilt, RuntimeError> {
        self.shared.faults.take("template_with_dirs")?;
        let mut state = lock(&self.shared.state);
        if state.templates.contains_key(template) {
            return Err(RuntimeError::InvalidSpec(format!(
                "template {template} already exists"
            )));
        }
        let source = state
            .templates
            .get(from)
            .cloned()
            .ok_or_else(|| RuntimeError::InvalidSpec(format!("template {from} does not exist")))?;
        let last = chain
            .last()
            .ok_or_else(|| RuntimeError::InvalidSpec("an empty chain".into()))?;
        let built = TemplateBuilt {
            layers: Vec::new(),
            bytes: from_bytes,
            ..source
        };
        state.layer_cache.insert(last.clone(), built.clone());
        state.templates.insert(template.clone(), built.clone());
        Ok(built)
    }

    fn template_from_snapshot(
        &self,
        template: &TemplateId,
        snapshot: &SnapshotId,
        chain: &[String],
        config: &paddock_types::ImageConfig,
        snapshot_bytes: u64,
    ) -> Result<u64, RuntimeError> {
        self.shared.faults.take("template_from_snapshot")?;
        let mut state = lock(&self.shared.state);
        if !state.snapshots.contains_key(snapshot) {
            return Err(no_snapshot(snapshot));
        }
        let last = chain
            .last()
            .ok_or_else(|| RuntimeError::InvalidSpec("an empty chain".into()))?;
        let built = TemplateBuilt {
            digest: format!("recipe:{last}"),
            config: config.clone(),
            layers: Vec::new(),
            added_default_user: false,
            bytes: snapshot_bytes,
        };
        state.layer_cache.insert(last.clone(), built.clone());
        state.templates.insert(template.clone(), built);
        Ok(snapshot_bytes)
    }
}
