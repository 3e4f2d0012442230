//! The local OCI image layout a pull writes: `oci-layout`, `blobs/sha256/<hex>` (each written to
//! `<hex>.partial`, verified, then renamed), and `index.json` last, through a temporary file.

use std::collections::BTreeSet;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use crate::error::RegistryError;
use crate::manifest::MAX_MANIFEST_BYTES;

/// An image layout directory being written. Partial files it made are removed when it is dropped
/// without [`Layout::finish`]... or after it: a finished layout has none left.
#[derive(Debug)]
pub(crate) struct Layout {
    root: PathBuf,
    blobs: PathBuf,
    partials: BTreeSet<PathBuf>,
}

impl Layout {
    pub(crate) fn open(root: &Path) -> Result<Self, RegistryError> {
        let blobs = root.join("blobs/sha256");
        std::fs::create_dir_all(&blobs).map_err(|e| RegistryError::io("create", &blobs, e))?;
        let marker = root.join("oci-layout");
        if !marker.exists() {
            write_atomic(&marker, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        }
        Ok(Self {
            root: root.to_owned(),
            blobs,
            partials: BTreeSet::new(),
        })
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn blob_path(&self, hex: &str) -> PathBuf {
        self.blobs.join(hex)
    }

    /// Whether the blob is already here with the right content (hashed again: a layout another
    /// pull left may have been damaged). A wrong one is removed.
    pub(crate) fn has_blob(&self, hex: &str, size: u64) -> Result<bool, RegistryError> {
        let path = self.blob_path(hex);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(RegistryError::io("inspect", &path, e)),
        };
        if meta.is_file() && meta.len() == size {
            let mut hasher = Sha256::new();
            let mut file = std::fs::File::open(&path).map_err(|e| RegistryError::io("open", &path, e))?;
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = file
                    .read(&mut buf)
                    .map_err(|e| RegistryError::io("read", &path, e))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
            }
            if hex::encode(hasher.finalize()) == hex {
                return Ok(true);
            }
        }
        std::fs::remove_file(&path).map_err(|e| RegistryError::io("remove damaged blob", &path, e))?;
        Ok(false)
    }

    /// Writes bytes already verified against `hex` as a blob.
    pub(crate) fn put_verified_bytes(&mut self, hex: &str, bytes: &[u8]) -> Result<(), RegistryError> {
        if self.has_blob(hex, bytes.len() as u64)? {
            return Ok(());
        }
        let partial = self.begin_partial(hex);
        std::fs::write(&partial, bytes).map_err(|e| RegistryError::io("write", &partial, e))?;
        self.commit_partial(hex)
    }

    /// The `.partial` path for `hex`, recorded for removal.
    pub(crate) fn begin_partial(&mut self, hex: &str) -> PathBuf {
        let partial = self.blobs.join(format!("{hex}.partial"));
        self.partials.insert(partial.clone());
        partial
    }

    pub(crate) async fn create_partial(
        &mut self,
        hex: &str,
    ) -> Result<(tokio::fs::File, PathBuf), RegistryError> {
        let partial = self.begin_partial(hex);
        let file = tokio::fs::File::create(&partial)
            .await
            .map_err(|e| RegistryError::io("create", &partial, e))?;
        Ok((file, partial))
    }

    pub(crate) async fn sync(file: &mut tokio::fs::File, path: &Path) -> Result<(), RegistryError> {
        file.flush()
            .await
            .map_err(|e| RegistryError::io("write", path, e))?;
        file.sync_all()
            .await
            .map_err(|e| RegistryError::io("sync", path, e))
    }

    /// Renames a verified `.partial` into place.
    pub(crate) fn commit_partial(&mut self, hex: &str) -> Result<(), RegistryError> {
        let partial = self.blobs.join(format!("{hex}.partial"));
        let target = self.blob_path(hex);
        std::fs::rename(&partial, &target).map_err(|e| RegistryError::io("rename into place", &target, e))?;
        self.partials.remove(&partial);
        Ok(())
    }

    /// Writes `index.json` with `entry` in it: entries of other names are kept, one of the same
    /// `org.opencontainers.image.ref.name` is replaced.
    pub(crate) fn write_index(&self, entry: serde_json::Value) -> Result<(), RegistryError> {
        let path = self.root.join("index.json");
        let name = entry["annotations"][REF_NAME].clone();
        let mut manifests = Vec::new();
        match std::fs::File::open(&path) {
            Ok(f) => {
                let mut text = Vec::new();
                f.take(MAX_MANIFEST_BYTES as u64 + 1)
                    .read_to_end(&mut text)
                    .map_err(|e| RegistryError::io("read", &path, e))?;
                let old: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
                    RegistryError::InvalidOptions(format!(
                        "existing {} is not an image index: {e}",
                        path.display()
                    ))
                })?;
                if let Some(list) = old["manifests"].as_array() {
                    manifests.extend(
                        list.iter()
                            .filter(|m| m["annotations"][REF_NAME] != name)
                            .cloned(),
                    );
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RegistryError::io("open", &path, e)),
        }
        manifests.push(entry);
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": crate::manifest::OCI_INDEX,
            "manifests": manifests,
        });
        let bytes =
            serde_json::to_vec_pretty(&index).map_err(|e| RegistryError::InvalidOptions(e.to_string()))?;
        write_atomic(&path, &bytes)
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        for p in std::mem::take(&mut self.partials) {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The annotation naming an image in `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Writes a file through a temporary sibling, synced, then renamed over it.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), RegistryError> {
    use std::io::Write as _;
    let tmp = path.with_extension("tmp");
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(RegistryError::io("write", path, e));
    }
    Ok(())
}
