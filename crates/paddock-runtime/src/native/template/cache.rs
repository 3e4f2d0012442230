//! The layer cache: `<pool>/layers/<key>`, read-only trees of an image's first layers.
//!
//! A key names the chain of layer digests from the bottom up to a layer (`sha256` of the previous
//! key and the layer's digest), so equal keys are equal trees (layers are applied by one function
//! with one id mapping). Lookups, insertions and collection take `<pool>/layers.lock`; a build
//! names the chains it will use in `<pool>/builds/<tp-id>.chains` (removed when it ends, by it or
//! by gc once its lock is free), and collection keeps what finished templates and running builds
//! name.
//!
//! What each cached tree holds (bytes of the pool, what a template made from it is charged) is kept
//! beside it in `<pool>/layers.bytes/<key>`: the pool's simple quotas charge an extent to the
//! subvolume that wrote it, so a snapshot's own count says nothing of what it keeps alive. The
//! figure is what the tree it was made from held plus what its build wrote; a tree cached without
//! one (a crash between the two, a pool from before) is measured once from its extents.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use paddock_sys::btrfs;
use paddock_types::TemplateId;

use super::finish::read_record;
use crate::native::image::Digest;
use crate::native::lock::StateLock;
use crate::native::pool::pool_err;
use crate::RuntimeError;

/// The chain keys of `layers`, bottom first ([`crate::image_chain_keys`]).
pub(super) fn chain_keys(layers: impl Iterator<Item = Digest>) -> Vec<String> {
    let digests: Vec<String> = layers.map(|d| d.to_string()).collect();
    crate::image_chain_keys(&digests)
}

fn layers_dir(pool_root: &Path) -> PathBuf {
    pool_root.join("layers")
}

fn bytes_dir(pool_root: &Path) -> PathBuf {
    pool_root.join("layers.bytes")
}

/// The longest figure [`bytes`] reads (a decimal `u64`).
const MAX_BYTES_TEXT: u64 = 20;

/// Where the tree of chain `key` is kept.
pub(super) fn layer_path(pool_root: &Path, key: &str) -> PathBuf {
    layers_dir(pool_root).join(key)
}

/// Takes the cache's lock (blocking).
pub(super) fn lock(pool_root: &Path) -> Result<StateLock, RuntimeError> {
    StateLock::acquire(&pool_root.join("layers.lock"))
}

/// How many of `keys` (from the bottom) the cache holds, as the longest cached prefix; `None` when
/// not even the first. The caller holds the lock.
pub(super) fn longest_cached(pool_root: &Path, keys: &[String]) -> Option<usize> {
    (1..=keys.len())
        .rev()
        .find(|&n| fs::symlink_metadata(layer_path(pool_root, &keys[n - 1])).is_ok_and(|m| m.is_dir()))
}

/// Keeps the tree at `tree` (a build's staging subvolume, just after the layer `key` ends) as the
/// cached chain `key`, unless the cache has it already; `bytes` then tells what it holds (called
/// once the snapshot committed the pool's transaction, so quota counts are current).
pub(super) fn insert(
    pool_root: &Path,
    key: &str,
    tree: &Path,
    bytes: impl FnOnce() -> Result<u64, RuntimeError>,
) -> Result<(), RuntimeError> {
    let dir = layers_dir(pool_root);
    fs::create_dir_all(&dir).map_err(pool_err("create", &dir))?;
    let _lock = lock(pool_root)?;
    let path = layer_path(pool_root, key);
    if fs::symlink_metadata(&path).is_ok() {
        return Ok(());
    }
    // A snapshot is made whole or not at all: a crash leaves no partial cache entry.
    btrfs::snapshot_subvolume(tree, &dir, key, true).map_err(pool_err("cache a layer as", &path))?;
    record_bytes(pool_root, key, bytes()?)
}

/// Writes what cached chain `key` holds (replacing it whole: a crash leaves the old figure or none).
fn record_bytes(pool_root: &Path, key: &str, bytes: u64) -> Result<(), RuntimeError> {
    let dir = bytes_dir(pool_root);
    fs::create_dir_all(&dir).map_err(pool_err("create", &dir))?;
    let path = dir.join(key);
    let partial = dir.join(format!(".{key}.partial"));
    fs::write(&partial, bytes.to_string()).map_err(pool_err("write", &partial))?;
    fs::rename(&partial, &path).map_err(pool_err("write", &path))
}

/// What cached chain `key` holds (bytes of the pool), measured from its extents and recorded when
/// no figure was recorded with it. The caller holds the lock.
pub(super) fn bytes(pool_root: &Path, key: &str) -> Result<u64, RuntimeError> {
    use std::io::Read as _;
    let path = bytes_dir(pool_root).join(key);
    // The server's own directory; still read as bounded text, never followed.
    let flags = rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::CLOEXEC;
    let recorded = rustix::fs::open(&path, flags, rustix::fs::Mode::empty())
        .map_err(io::Error::from)
        .and_then(|fd| {
            let mut text = String::new();
            fs::File::from(fd)
                .take(MAX_BYTES_TEXT + 1)
                .read_to_string(&mut text)?;
            Ok(text)
        });
    if let Some(bytes) = recorded.ok().and_then(|t| t.trim().parse::<u64>().ok()) {
        return Ok(bytes);
    }
    let measured = crate::native::snapshot_usage::measure(&layer_path(pool_root, key))?.referenced_bytes;
    record_bytes(pool_root, key, measured)?;
    Ok(measured)
}

/// A running build's claim on the chains it uses (`builds/<tp-id>.chains`), removed on drop.
#[derive(Debug)]
pub(super) struct BuildClaim {
    path: PathBuf,
}

impl BuildClaim {
    pub(super) fn write(
        pool_root: &Path,
        template: &TemplateId,
        keys: &[String],
    ) -> Result<Self, RuntimeError> {
        let dir = pool_root.join("builds");
        fs::create_dir_all(&dir).map_err(pool_err("create", &dir))?;
        let path = dir.join(format!("{template}.chains"));
        fs::write(&path, keys.join("\n")).map_err(pool_err("write", &path))?;
        Ok(Self { path })
    }
}

impl Drop for BuildClaim {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Deletes the cached chains that no template and no running build names; returns their keys.
/// A claim whose build is gone (its lock is free) is removed with them.
pub(crate) fn collect_unused_layers(pool_root: &Path) -> Vec<String> {
    let dir = layers_dir(pool_root);
    let Ok(_lock) = lock(pool_root) else {
        return Vec::new();
    };
    let mut used = BTreeSet::new();
    for entry in fs::read_dir(pool_root.join("images"))
        .into_iter()
        .flatten()
        .flatten()
    {
        match read_record(&entry.path()) {
            Ok(record) => used.extend(record.chain),
            // An image without a readable record keeps nothing; gc of templates decides about it.
            Err(e) => {
                tracing::warn!(template = %entry.path().display(), error = %e, "template record unreadable")
            }
        }
    }
    let builds = pool_root.join("builds");
    for entry in fs::read_dir(&builds).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(template) = name.strip_suffix(".chains") else {
            continue;
        };
        // No lock: the build ended (or died before taking it). A free lock: it died. (Never
        // `try_acquire` a missing lock: that would create the file.)
        let lock_path = builds.join(format!("{template}.lock"));
        let running = lock_path.exists() && matches!(StateLock::try_acquire(&lock_path), Ok(None));
        if running {
            if let Ok(text) = fs::read_to_string(entry.path()) {
                used.extend(text.lines().map(str::to_owned));
            }
        } else {
            let _ = fs::remove_file(entry.path());
        }
    }
    let mut removed = Vec::new();
    for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if used.contains(&name) {
            continue;
        }
        match crate::native::staging::delete(&dir, &name) {
            Ok(()) => removed.push(name),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(layer = %name, error = %e, "cached layer not removed; gc will retry"),
        }
    }
    // Figures of trees no longer cached (and partial writes of them).
    for entry in fs::read_dir(bytes_dir(pool_root)).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || fs::symlink_metadata(layer_path(pool_root, &name)).is_err() {
            let _ = fs::remove_file(entry.path());
        }
    }
    removed
}
