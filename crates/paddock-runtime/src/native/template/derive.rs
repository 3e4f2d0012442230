//! Templates made from other trees than an image's layers, for recipes: a template kept in the
//! layer cache under a key of the caller's ([`NativeBackend::cache_template`]), a template made
//! from a cached tree ([`NativeBackend::template_from_cache`]) and one made from a sandbox's
//! snapshot (a step's result, [`NativeBackend::template_from_snapshot`]), cached as it is made.
//!
//! Keys are the caller's (a recipe's step chain), checked to be 64 hex digits (they name
//! subvolumes). Trees are completed and recorded as image builds are (`finish.rs`).

use std::path::Path;

use paddock_types::{ImageConfig, SnapshotId, TemplateId};

use super::cache::{self, BuildClaim};
use super::finish::{self, TemplateRecord, RECORD_VERSION};
use crate::native::staging::{Area, Staging};
use crate::native::NativeBackend;
use crate::{RuntimeError, TemplateBuilt};

/// What completing a derived tree may write (directories, accounts, the record): its staging
/// subvolume's disk limit.
const DERIVED_MAX_BYTES: u64 = 64 << 20;

/// A staging subvolume for `template` seeded from the tree `seed`, and the build's claim on
/// `chain`. The caller holds the cache's lock, so gc sees the claim with the staging lock held.
fn stage(
    pool_root: &Path,
    template: &TemplateId,
    seed: &Path,
    chain: &[String],
) -> Result<(Staging, BuildClaim), RuntimeError> {
    let staging = Staging::begin(
        pool_root,
        Area::Builds,
        template.as_str(),
        Some(seed),
        DERIVED_MAX_BYTES,
    )?;
    let claim = BuildClaim::write(pool_root, template, chain)?;
    Ok((staging, claim))
}

fn check_chain(chain: &[String]) -> Result<&String, RuntimeError> {
    let valid = |k: &String| k.len() == 64 && k.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    match chain.last() {
        Some(last) if chain.iter().all(valid) => Ok(last),
        _ => Err(RuntimeError::InvalidSpec(
            "a template's chain is a non-empty list of 64-hex-digit keys".into(),
        )),
    }
}

impl NativeBackend {
    fn refuse_existing(&self, template: &TemplateId) -> Result<(), RuntimeError> {
        if std::fs::symlink_metadata(self.pool.image_path(template)).is_ok() {
            return Err(RuntimeError::InvalidSpec(format!(
                "template {template} already exists"
            )));
        }
        Ok(())
    }

    /// [`crate::StorageBackend::cached_prefix`].
    pub(in crate::native) fn cached_prefix(&self, chain: &[String]) -> Result<usize, RuntimeError> {
        if chain.is_empty() {
            return Ok(0);
        }
        check_chain(chain)?;
        let pool_root = self.pool.root();
        let _lock = cache::lock(pool_root)?;
        Ok(chain
            .iter()
            .take_while(|k| std::fs::symlink_metadata(cache::layer_path(pool_root, k)).is_ok())
            .count())
    }

    /// [`crate::StorageBackend::cache_template`].
    pub(in crate::native) fn cache_template(
        &self,
        template: &TemplateId,
        key: &str,
        bytes: u64,
    ) -> Result<(), RuntimeError> {
        check_chain(&[key.to_owned()])?;
        let path = self.pool.existing_image(template)?;
        cache::insert(self.pool.root(), key, &path, || Ok(bytes))
    }

    /// [`crate::StorageBackend::template_from_cache`].
    pub(in crate::native) fn template_from_cache(
        &self,
        template: &TemplateId,
        chain: &[String],
    ) -> Result<Option<TemplateBuilt>, RuntimeError> {
        let last = check_chain(chain)?;
        self.refuse_existing(template)?;
        let pool_root = self.pool.root();
        let (staging, claim, seed_bytes) = {
            let _lock = cache::lock(pool_root)?;
            let seed = cache::layer_path(pool_root, last);
            if std::fs::symlink_metadata(&seed).is_err() {
                return Ok(None);
            }
            let seed_bytes = cache::bytes(pool_root, last)?;
            let (staging, claim) = stage(pool_root, template, &seed, chain)?;
            (staging, claim, seed_bytes)
        };
        // The cached tree's own record, host-written when it was cached (the root of a tree is
        // never a sandbox's to write).
        let cached = finish::read_record(staging.path()).ok();
        let (digest, config) = cached.map_or_else(
            || (format!("recipe:{last}"), ImageConfig::default()),
            |r| (r.digest, r.config),
        );
        let (added_default_user, bytes) =
            self.finish_derived(staging, claim, chain, &digest, &config, seed_bytes)?;
        Ok(Some(TemplateBuilt {
            digest,
            config,
            layers: Vec::new(),
            added_default_user,
            bytes,
        }))
    }

    /// [`crate::StorageBackend::template_from_snapshot`].
    pub(in crate::native) fn template_from_snapshot(
        &self,
        template: &TemplateId,
        snapshot: &SnapshotId,
        chain: &[String],
        config: &ImageConfig,
        snapshot_bytes: u64,
    ) -> Result<u64, RuntimeError> {
        let last = check_chain(chain)?;
        self.refuse_existing(template)?;
        let pool_root = self.pool.root();
        let source = self.pool.existing_snapshot(snapshot)?;
        let (staging, claim) = {
            let _lock = cache::lock(pool_root)?;
            stage(pool_root, template, &source, chain)?
        };
        let digest = format!("recipe:{last}");
        let (_, bytes) = self.finish_derived(staging, claim, chain, &digest, config, snapshot_bytes)?;
        Ok(bytes)
    }

    /// [`crate::StorageBackend::template_with_dirs`].
    pub(in crate::native) fn template_with_dirs(
        &self,
        template: &TemplateId,
        from: &TemplateId,
        from_bytes: u64,
        chain: &[String],
        dirs: &[String],
    ) -> Result<TemplateBuilt, RuntimeError> {
        check_chain(chain)?;
        self.refuse_existing(template)?;
        let pool_root = self.pool.root();
        let source = self.pool.existing_image(from)?;
        // The source's own record, host-written when it was made.
        let record = finish::read_record(&source)
            .map_err(crate::native::pool::pool_err("read the record of", &source))?;
        let (staging, claim) = {
            let _lock = cache::lock(pool_root)?;
            stage(pool_root, template, &source, chain)?
        };
        finish::add_top_level_dirs(staging.path(), dirs, self.config.ids)?;
        let (added_default_user, bytes) =
            self.finish_derived(staging, claim, chain, &record.digest, &record.config, from_bytes)?;
        Ok(TemplateBuilt {
            digest: record.digest,
            config: record.config,
            layers: Vec::new(),
            added_default_user,
            bytes,
        })
    }

    /// Completes, records and caches (as the chain's last key) the tree in `staging` (seeded from a
    /// tree holding `seed_bytes`), then moves it into place; returns whether it added the user
    /// `user`, and what the template holds.
    fn finish_derived(
        &self,
        staging: Staging,
        claim: BuildClaim,
        chain: &[String],
        digest: &str,
        config: &ImageConfig,
        seed_bytes: u64,
    ) -> Result<(bool, u64), RuntimeError> {
        let added = finish::complete(staging.path(), self.config.ids)?;
        finish::write_record(
            staging.path(),
            &TemplateRecord {
                version: RECORD_VERSION,
                chain: chain.to_vec(),
                digest: digest.to_owned(),
                config: config.clone(),
            },
            self.config.ids,
        )?;
        let last = chain.last().map(String::as_str).unwrap_or_default();
        cache::insert(self.pool.root(), last, Path::new(staging.path()), || {
            Ok(seed_bytes.saturating_add(self.written(staging.path())?))
        })?;
        crate::fault::point("template.finishing");
        let path = staging.finish()?;
        drop(claim);
        Ok((added, seed_bytes.saturating_add(self.written(&path)?)))
    }
}
