//! The new OCI image layout directory an archive is read into: created (mode 0700, refused if
//! it exists), filled with content-addressed blobs (each streamed to a `<n>.partial` file with a
//! running SHA-256, then renamed to its digest's name), and removed whole when dropped before
//! [`NewLayout::finish`].
//!
//! It never creates a file under a name taken from the archive and never follows a symlink: the
//! directory is new, only this code writes into it, and files are created with `create_new`.
//! Blobs are synced once, when the layout is finished, so that members dropped as unused (or a
//! hostile archive's thousands of tiny ones that end in an error) cost no sync.
//!
//! It does not know archive formats, nor judge member names: it names files itself.

use std::collections::{HashMap, HashSet};
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

use crate::error::RegistryError;
use crate::layout::write_atomic;
use crate::manifest::MAX_MANIFEST_BYTES;

/// A blob now in the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoredBlob {
    pub hex: String,
    pub size: u64,
    /// Its first bytes (at most four), to tell a layer's compression.
    pub head: Vec<u8>,
}

impl StoredBlob {
    pub(super) fn digest(&self) -> String {
        format!("sha256:{}", self.hex)
    }

    /// The OCI layer media type its magic bytes say.
    pub(super) fn layer_media_type(&self) -> &'static str {
        if self.head.starts_with(&[0x1f, 0x8b]) {
            "application/vnd.oci.image.layer.v1.tar+gzip"
        } else if self.head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            "application/vnd.oci.image.layer.v1.tar+zstd"
        } else {
            "application/vnd.oci.image.layer.v1.tar"
        }
    }
}

/// A blob being written: its `.partial` file and running hash.
#[derive(Debug)]
pub(super) struct BlobWriter {
    file: File,
    path: PathBuf,
    hasher: Sha256,
    size: u64,
    head: Vec<u8>,
}

impl BlobWriter {
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn write_io(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)?;
        self.hasher.update(bytes);
        self.size += bytes.len() as u64;
        let missing = 4usize.saturating_sub(self.head.len()).min(bytes.len());
        self.head.extend_from_slice(&bytes[..missing]);
        Ok(())
    }

    pub(super) fn write(&mut self, bytes: &[u8]) -> Result<(), RegistryError> {
        self.write_io(bytes)
            .map_err(|e| RegistryError::io("write", &self.path, e))
    }
}

/// The layout directory being written; removed when dropped unfinished.
#[derive(Debug)]
pub(super) struct NewLayout {
    root: PathBuf,
    blobs: PathBuf,
    /// Blobs in place, by hex: their sizes.
    stored: HashMap<String, u64>,
    next_partial: u64,
    finished: bool,
}

impl NewLayout {
    /// Creates `dest` (which must not exist; its parent must) and `blobs/sha256` in it.
    pub(super) fn create(dest: &Path) -> Result<Self, RegistryError> {
        let mut builder = DirBuilder::new();
        builder.mode(0o700);
        builder
            .create(dest)
            .map_err(|e| RegistryError::io("create the layout directory", dest, e))?;
        // From here on, dropping removes `dest`.
        let layout = Self {
            root: dest.to_owned(),
            blobs: dest.join("blobs/sha256"),
            stored: HashMap::new(),
            next_partial: 0,
            finished: false,
        };
        for dir in [dest.join("blobs"), layout.blobs.clone()] {
            builder
                .create(&dir)
                .map_err(|e| RegistryError::io("create", &dir, e))?;
        }
        Ok(layout)
    }

    /// Starts a blob of unknown digest.
    pub(super) fn begin_blob(&mut self) -> Result<BlobWriter, RegistryError> {
        let path = self.blobs.join(format!("{}.partial", self.next_partial));
        self.next_partial += 1;
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| RegistryError::io("create", &path, e))?;
        Ok(BlobWriter {
            file,
            path,
            hasher: Sha256::new(),
            size: 0,
            head: Vec::with_capacity(4),
        })
    }

    /// Renames a written blob to its digest's name (or drops it when a blob of that digest is
    /// already there).
    pub(super) fn commit_blob(&mut self, blob: BlobWriter) -> Result<StoredBlob, RegistryError> {
        let BlobWriter {
            file,
            path,
            hasher,
            size,
            head,
        } = blob;
        let hex = hex::encode(hasher.finalize());
        if self.stored.contains_key(&hex) {
            drop(file);
            std::fs::remove_file(&path).map_err(|e| RegistryError::io("remove duplicate", &path, e))?;
        } else {
            drop(file);
            let target = self.blobs.join(&hex);
            std::fs::rename(&path, &target)
                .map_err(|e| RegistryError::io("rename into place", &target, e))?;
            self.stored.insert(hex.clone(), size);
        }
        Ok(StoredBlob { hex, size, head })
    }

    /// Writes `bytes` as a blob.
    pub(super) fn put_bytes(&mut self, bytes: &[u8]) -> Result<StoredBlob, RegistryError> {
        let mut blob = self.begin_blob()?;
        blob.write(bytes)?;
        self.commit_blob(blob)
    }

    /// The size of the blob `hex`, if it is in the layout.
    pub(super) fn blob_size(&self, hex: &str) -> Option<u64> {
        self.stored.get(hex).copied()
    }

    /// Reads a JSON blob (a manifest, an index, a config): at most [`MAX_MANIFEST_BYTES`].
    pub(super) fn read_json_blob(&self, hex: &str, what: &str) -> Result<Vec<u8>, RegistryError> {
        let size = self
            .blob_size(hex)
            .ok_or_else(|| RegistryError::invalid_archive(format!("{what} is missing from the archive")))?;
        if size > MAX_MANIFEST_BYTES as u64 {
            return Err(RegistryError::TooLarge {
                what: what.into(),
                limit: MAX_MANIFEST_BYTES as u64,
            });
        }
        let path = self.blobs.join(hex);
        let mut bytes = Vec::with_capacity(size as usize);
        File::open(&path)
            .and_then(|f| f.take(MAX_MANIFEST_BYTES as u64).read_to_end(&mut bytes))
            .map_err(|e| RegistryError::io("read", &path, e))?;
        Ok(bytes)
    }

    /// Removes every blob but those in `keep` (members the image does not use).
    pub(super) fn remove_blobs_except(&mut self, keep: &HashSet<String>) -> Result<(), RegistryError> {
        let unused: Vec<String> = self
            .stored
            .keys()
            .filter(|h| !keep.contains(*h))
            .cloned()
            .collect();
        for hex in unused {
            let path = self.blobs.join(&hex);
            std::fs::remove_file(&path).map_err(|e| RegistryError::io("remove unused blob", &path, e))?;
            self.stored.remove(&hex);
        }
        Ok(())
    }

    /// Syncs the blobs, writes `oci-layout`, then `index.json` (last, through a temporary file),
    /// and keeps the layout.
    pub(super) fn finish(mut self, oci_layout: &[u8], index: &[u8]) -> Result<(), RegistryError> {
        for hex in self.stored.keys() {
            let path = self.blobs.join(hex);
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| RegistryError::io("sync", &path, e))?;
        }
        write_atomic(&self.root.join("oci-layout"), oci_layout)?;
        write_atomic(&self.root.join("index.json"), index)?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for NewLayout {
    fn drop(&mut self) {
        if !self.finished {
            // Best effort: the directory is ours alone, and an error here has no one to go to.
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The `oci-layout` file this code writes.
pub(super) const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

/// A JSON document's bytes, as this code writes them.
pub(super) fn json_bytes(value: &serde_json::Value) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(value)
        .map_err(|e| RegistryError::invalid_archive(format!("JSON encoding failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_media_types_follow_magic_bytes() {
        let blob = |head: &[u8]| StoredBlob {
            hex: String::new(),
            size: 0,
            head: head.to_vec(),
        };
        assert_eq!(
            blob(&[0x1f, 0x8b, 8, 0]).layer_media_type(),
            "application/vnd.oci.image.layer.v1.tar+gzip"
        );
        assert_eq!(
            blob(&[0x28, 0xb5, 0x2f, 0xfd]).layer_media_type(),
            "application/vnd.oci.image.layer.v1.tar+zstd"
        );
        assert_eq!(
            blob(b"etc/").layer_media_type(),
            "application/vnd.oci.image.layer.v1.tar"
        );
        assert_eq!(
            blob(b"").layer_media_type(),
            "application/vnd.oci.image.layer.v1.tar"
        );
    }

    #[test]
    fn a_blob_is_stored_once_and_an_unfinished_layout_removed() {
        let base = tempfile::tempdir().expect("tempdir");
        let dest = base.path().join("layout");
        let mut layout = NewLayout::create(&dest).expect("create");
        let a = layout.put_bytes(b"same").expect("put");
        let b = layout.put_bytes(b"same").expect("put again");
        assert_eq!(a, b);
        let names: Vec<_> = std::fs::read_dir(dest.join("blobs/sha256"))
            .expect("blobs")
            .collect();
        assert_eq!(names.len(), 1, "no partial file left beside the blob");
        assert!(
            NewLayout::create(&dest).is_err(),
            "an existing directory is refused"
        );
        assert!(dest.exists(), "and left alone");
        drop(layout);
        assert!(!dest.exists());
    }
}
