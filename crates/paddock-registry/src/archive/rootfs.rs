//! A tar of a root file system as a one-layer image: the stream stored as the layer blob as
//! given (hashed while written), its `diff_id` hashed from the decompressed stream on the fly
//! (for gzip input), a minimal config for the host's platform, a manifest and `index.json`.
//!
//! It does not look inside the tar (the runtime's layer applier checks every member); it only
//! bounds its size, before and after decompression.

use std::io::Read as _;

use sha2::{Digest as _, Sha256};

use crate::error::RegistryError;
use crate::manifest::{OCI_INDEX, OCI_MANIFEST};
use crate::platform::Platform;

use super::blobs::{json_bytes, NewLayout, OCI_LAYOUT};
use super::docker::OCI_CONFIG;
use super::stream::{Compression, Stream};
use super::{ArchiveFormat, ArchiveImage, ArchiveLimits};

pub(super) fn write_rootfs_image(
    input: &mut dyn std::io::Read,
    mut layout: NewLayout,
    limits: &ArchiveLimits,
) -> Result<ArchiveImage, RegistryError> {
    let mut blob = layout.begin_blob()?;
    let (compression, diff_id, bytes) = {
        let mut stream = Stream::open(input, limits.max_bytes, Some(&mut blob))?;
        let compression = stream.compression();
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(stream.error(e)),
            };
            if compression == Compression::Gzip {
                hasher.update(&buf[..n]);
            }
        }
        let diff_id = (compression == Compression::Gzip).then(|| hex::encode(hasher.finalize()));
        (compression, diff_id, stream.bytes_read())
    };
    if bytes == 0 {
        return Err(RegistryError::invalid_archive(
            "the root file system tar is empty",
        ));
    }
    let layer = layout.commit_blob(blob)?;
    // Uncompressed, the layer is its own diff.
    let diff_id = diff_id.unwrap_or_else(|| layer.hex.clone());
    let media_type = match compression {
        Compression::None => "application/vnd.oci.image.layer.v1.tar",
        Compression::Gzip => "application/vnd.oci.image.layer.v1.tar+gzip",
    };

    let platform = Platform::host();
    let mut config = serde_json::json!({
        "architecture": platform.architecture,
        "os": platform.os,
        "config": {},
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
    });
    if let Some(variant) = &platform.variant {
        config["variant"] = variant.as_str().into();
    }
    let config = layout.put_bytes(&json_bytes(&config)?)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": { "mediaType": OCI_CONFIG, "digest": config.digest(), "size": config.size },
        "layers": [{ "mediaType": media_type, "digest": layer.digest(), "size": layer.size }],
    });
    let manifest = layout.put_bytes(&json_bytes(&manifest)?)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [{ "mediaType": OCI_MANIFEST, "digest": manifest.digest(), "size": manifest.size }],
    });
    layout.finish(OCI_LAYOUT, &json_bytes(&index)?)?;
    Ok(ArchiveImage {
        format: ArchiveFormat::Rootfs,
        reference: None,
        bytes,
    })
}
