//! Image templates on the native backend: a read-only subvolume `<pool>/images/<tp-id>` holding an
//! image's whole tree, built from an OCI image layout in a staging subvolume (`native/staging.rs`,
//! area `builds`) that appears in place only when complete.
//!
//! Layers are cached ([`cache`]): after each layer, the tree so far is kept as a read-only
//! subvolume `<pool>/layers/<key>`, keyed by the chain of layer digests up to it, so a build of an
//! image sharing its first layers with an earlier one starts from a snapshot of them (no unpacking,
//! no storage). A cached tree is deleted when no template (or build in progress) names it.
//!
//! What a template adds to the image ([`finish`]): the directories paddock binds (`etc`, `home`,
//! `root`, `tmp`), the user `user` when the image has none, and its record
//! (`.paddock-template.json` at its root, which sandboxes never see: they see the top level through
//! the mount plan's binds only).
//!
//! This module does not fetch images (the control plane pulls into a layout first), know template
//! names or tenants, or decide who may use a template.

mod cache;
mod derive;
mod finish;

use std::os::fd::AsFd;

use paddock_types::TemplateId;

use super::image::{apply_layer, ImageLayout, LayerLimits};
use super::staging::{Area, Staging};
use super::NativeBackend;
use crate::{BuiltLayer, RuntimeError, TemplateBuilt, TemplateLimits, TemplateProgress, TemplateSource};

pub(crate) use cache::collect_unused_layers;

impl NativeBackend {
    /// [`crate::StorageBackend::build_template`].
    pub(super) fn build_template(
        &self,
        template: &TemplateId,
        source: &TemplateSource,
        limits: &TemplateLimits,
        progress: &mut dyn FnMut(TemplateProgress),
    ) -> Result<TemplateBuilt, RuntimeError> {
        let pool_root = self.pool.root();
        if std::fs::symlink_metadata(self.pool.image_path(template)).is_ok() {
            return Err(RuntimeError::InvalidSpec(format!(
                "template {template} already exists"
            )));
        }
        let TemplateSource::ImageLayout { path, reference } = source;
        let layout = ImageLayout::open(path).map_err(RuntimeError::Image)?;
        let manifest = layout
            .resolve(reference.as_deref())
            .map_err(RuntimeError::Image)?;
        progress(TemplateProgress::Resolved {
            digest: manifest.digest.to_string(),
            layers: manifest.layers.len(),
        });
        let keys = cache::chain_keys(manifest.layers.iter().map(|l| l.digest));
        // Under the cache's lock: the longest cached prefix, the staging subvolume seeded from it
        // (with its lock), and the claim on the chains this build names, so gc (which takes the
        // same lock) sees a running build's claim with its lock held, and keeps those chains.
        let (cached, seed_bytes, staging, claim) = {
            let _lock = cache::lock(pool_root)?;
            let cached = cache::longest_cached(pool_root, &keys);
            let seed = cached.map(|n| cache::layer_path(pool_root, &keys[n - 1]));
            let seed_bytes = match cached {
                Some(n) => cache::bytes(pool_root, &keys[n - 1])?,
                None => 0,
            };
            let staging = Staging::begin(
                pool_root,
                Area::Builds,
                template.as_str(),
                seed.as_deref(),
                limits.max_bytes,
            )?;
            let claim = cache::BuildClaim::write(pool_root, template, &keys)?;
            (cached.unwrap_or(0), seed_bytes, staging, claim)
        };
        let layer_limits = LayerLimits {
            max_bytes: limits.max_layer_bytes,
            max_entries: limits.max_layer_entries,
        };
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for (index, layer) in manifest.layers.iter().enumerate() {
            let hit = index < cached;
            if !hit {
                let root = rustix::fs::open(
                    staging.path(),
                    rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )
                .map_err(|e| super::pool::pool_err("open", staging.path())(e.into()))?;
                let reader = layout.open_layer(layer).map_err(RuntimeError::Image)?;
                let summary = apply_layer(root.as_fd(), reader, &self.config.ids, layer_limits)
                    .map_err(RuntimeError::Image)?;
                tracing::debug!(template = %template, layer = %layer.digest, bytes = summary.data_bytes, "layer applied");
                crate::fault::point("template.layer_applied");
                cache::insert(pool_root, &keys[index], staging.path(), || {
                    Ok(seed_bytes.saturating_add(self.written(staging.path())?))
                })?;
                crate::fault::point("template.layer_cached");
            }
            progress(TemplateProgress::Layer {
                index,
                digest: layer.digest.to_string(),
                size: layer.size,
                cached: hit,
            });
            layers.push(BuiltLayer {
                digest: layer.digest.to_string(),
                size: layer.size,
                cached: hit,
            });
        }
        let added_default_user = finish::complete(staging.path(), self.config.ids)?;
        finish::write_record(
            staging.path(),
            &finish::TemplateRecord {
                version: finish::RECORD_VERSION,
                chain: keys,
                digest: manifest.digest.to_string(),
                config: manifest.config.clone(),
            },
            self.config.ids,
        )?;
        crate::fault::point("template.finishing");
        let path = staging.finish()?;
        crate::fault::point("template.built");
        drop(claim);
        Ok(TemplateBuilt {
            digest: manifest.digest.to_string(),
            config: manifest.config,
            layers,
            added_default_user,
            bytes: seed_bytes.saturating_add(self.written(&path)?),
        })
    }

    /// Bytes the subvolume at `path` wrote itself (its simple-quota group's count: current once a
    /// transaction committed after the writes).
    fn written(&self, path: &std::path::Path) -> Result<u64, RuntimeError> {
        Ok(self.pool.subvolume_usage(path)?.bytes)
    }

    /// [`crate::StorageBackend::delete_template`].
    pub(super) fn delete_template(&self, template: &TemplateId) -> Result<bool, RuntimeError> {
        let path = self.pool.image_path(template);
        let images = path.parent().unwrap_or(self.pool.root()).to_owned();
        let existed = match std::fs::symlink_metadata(&path) {
            Ok(_) => {
                super::staging::delete(&images, template.as_str())
                    .map_err(super::pool::pool_err("delete", &path))?;
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(super::pool::pool_err("stat", &path)(e)),
        };
        collect_unused_layers(self.pool.root());
        Ok(existed)
    }

    /// [`crate::StorageBackend::template_bytes`]: the bytes its files refer to, measured from
    /// their extents (`snapshot_usage.rs`; its cost grows with the number of files). Only for
    /// templates recorded without their figure, once.
    pub(super) fn template_bytes(&self, template: &TemplateId) -> Result<u64, RuntimeError> {
        let path = self.pool.existing_image(template)?;
        Ok(super::snapshot_usage::measure(&path)?.referenced_bytes)
    }

    /// [`crate::StorageBackend::list_templates`].
    pub(super) fn list_templates(&self) -> Result<Vec<TemplateId>, RuntimeError> {
        let dir = self.pool.root().join("images");
        let mut out = Vec::new();
        match std::fs::read_dir(&dir) {
            Ok(rd) => {
                for entry in rd.flatten() {
                    if let Some(id) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
                        out.push(id);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(super::pool::pool_err("list", &dir)(e)),
        }
        out.sort();
        Ok(out)
    }
}
