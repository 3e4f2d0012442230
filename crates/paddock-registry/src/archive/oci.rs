//! An OCI image layout archive (what `skopeo copy ... oci-archive:F` writes, and the OCI half
//! of a Docker >= 25 `docker save`) written out as the layout it holds: `oci-layout` (version
//! 1.0.0) and `index.json` as read, the blobs stored under their digests.
//!
//! The chosen image is checked whole before the layout is kept: its manifest (through image
//! indexes: every child present, and the host's, if listed, required), config and layers are in
//! the archive with the sizes their descriptors give and media types paddock reads. Blobs of
//! other images are kept as the archive had them; members not named `blobs/sha256/<hex>` and not
//! used are dropped.
//!
//! It does not unpack layers or look inside configs: the runtime's layout reader and layer
//! applier do.

use std::collections::HashSet;

use serde::Deserialize;

use crate::error::RegistryError;
use crate::layout::REF_NAME;
use crate::manifest::{
    parse_document, sha256_hex, Descriptor, Document, ACCEPTED_MANIFESTS, MAX_MANIFEST_BYTES, OCI_INDEX,
};
use crate::platform::Platform;

use super::blobs::{json_bytes, NewLayout};
use super::members::Members;
use super::select::{not_in_archive, same_image, several_images};

/// The annotation Docker (and containerd) give an image's full name in `index.json`.
const IMAGE_NAME: &str = "io.containerd.image.name";
/// Most image indexes followed from `index.json` to a manifest (as the runtime's reader).
const MAX_INDEX_DEPTH: usize = 4;

/// One manifest of `index.json`.
#[derive(Debug)]
struct Entry {
    json: serde_json::Value,
    descriptor: Descriptor,
    ref_name: Option<String>,
    image_name: Option<String>,
}

impl Entry {
    fn names(&self) -> impl Iterator<Item = &str> {
        self.ref_name.iter().chain(&self.image_name).map(String::as_str)
    }
}

/// Writes the archive's OCI layout into `layout` and keeps it; returns the reference of the
/// chosen image (see [`super::ArchiveImage::reference`]).
pub(super) fn write_oci_layout(
    mut layout: NewLayout,
    members: &Members,
    image: Option<&str>,
) -> Result<Option<String>, RegistryError> {
    let marker = members
        .document("oci-layout")
        .ok_or_else(|| RegistryError::invalid_archive("oci-layout is missing"))?;
    check_marker(marker)?;
    let index_bytes = members
        .document("index.json")
        .ok_or_else(|| RegistryError::invalid_archive("index.json is missing"))?;
    let entries = parse_index(index_bytes)?;
    let chosen = choose(&entries, image)?;

    let mut reached = HashSet::new();
    check_tree(
        &layout,
        &chosen.descriptor,
        "the image's manifest",
        0,
        &mut reached,
    )?;
    reached.extend(members.named_blobs().map(str::to_owned));
    layout.remove_blobs_except(&reached)?;

    // The chosen image must be the one its reference finds: when its name is not its own (or
    // it has none among several), index.json is narrowed to it.
    let alone = |name: &String| {
        entries
            .iter()
            .filter(|e| e.ref_name.as_ref() == Some(name))
            .count()
            == 1
    };
    let (index, reference) = match &chosen.ref_name {
        Some(name) if alone(name) => (index_bytes.to_vec(), Some(name.clone())),
        None if entries.len() == 1 => (index_bytes.to_vec(), None),
        name => {
            let index = serde_json::json!({
                "schemaVersion": 2,
                "mediaType": OCI_INDEX,
                "manifests": [chosen.json],
            });
            (json_bytes(&index)?, name.clone())
        }
    };
    layout.finish(marker, &index)?;
    Ok(reference)
}

fn check_marker(bytes: &[u8]) -> Result<(), RegistryError> {
    #[derive(Deserialize)]
    struct Marker {
        #[serde(rename = "imageLayoutVersion")]
        version: String,
    }
    let marker: Marker = serde_json::from_slice(bytes)
        .map_err(|e| RegistryError::invalid_archive(format!("oci-layout does not parse: {e}")))?;
    if marker.version != "1.0.0" {
        return Err(RegistryError::UnsupportedMediaType {
            what: "image layout".into(),
            media_type: format!("imageLayoutVersion {:?}", marker.version),
        });
    }
    Ok(())
}

fn parse_index(bytes: &[u8]) -> Result<Vec<Entry>, RegistryError> {
    let index: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| RegistryError::invalid_archive(format!("index.json does not parse: {e}")))?;
    if index["schemaVersion"] != 2 {
        return Err(RegistryError::UnsupportedMediaType {
            what: "index.json".into(),
            media_type: format!("schemaVersion {}", index["schemaVersion"]),
        });
    }
    if let Some(m) = index.get("mediaType").filter(|m| *m != OCI_INDEX) {
        return Err(RegistryError::UnsupportedMediaType {
            what: "index.json".into(),
            media_type: m.to_string(),
        });
    }
    let manifests = index["manifests"]
        .as_array()
        .ok_or_else(|| RegistryError::invalid_archive("index.json has no manifests"))?;
    manifests
        .iter()
        .map(|json| {
            let descriptor = Descriptor::deserialize(json).map_err(|e| {
                RegistryError::invalid_archive(format!("index.json has a bad descriptor: {e}"))
            })?;
            let annotation = |key: &str| json["annotations"][key].as_str().map(str::to_owned);
            Ok(Entry {
                ref_name: annotation(REF_NAME),
                image_name: annotation(IMAGE_NAME),
                json: json.clone(),
                descriptor,
            })
        })
        .collect()
}

fn choose<'e>(entries: &'e [Entry], image: Option<&str>) -> Result<&'e Entry, RegistryError> {
    let names = || entries.iter().flat_map(Entry::names);
    match image {
        None => match entries {
            [only] => Ok(only),
            [] => Err(RegistryError::invalid_archive("index.json lists no image")),
            _ => Err(several_images(entries.len(), names())),
        },
        Some(wanted) => entries
            .iter()
            .find(|e| e.ref_name.as_deref() == Some(wanted))
            .or_else(|| entries.iter().find(|e| e.names().any(|n| same_image(n, wanted))))
            .ok_or_else(|| not_in_archive(wanted, names())),
    }
}

/// Checks that `d`'s blob, and all it names, are in the layout as described; collects their hex.
fn check_tree(
    layout: &NewLayout,
    d: &Descriptor,
    what: &str,
    depth: usize,
    reached: &mut HashSet<String>,
) -> Result<(), RegistryError> {
    if !ACCEPTED_MANIFESTS.contains(&d.media_type.as_str()) {
        return Err(RegistryError::UnsupportedMediaType {
            what: what.into(),
            media_type: d.media_type.clone(),
        });
    }
    let what = format!("{what} {}", d.digest);
    let hex = check_blob(layout, d, &what, reached)?;
    let bytes = layout.read_json_blob(hex, &what)?;
    let document = parse_document(&bytes, &what, "archive").map_err(|e| match e {
        RegistryError::Protocol { detail, .. } => RegistryError::invalid_archive(detail),
        other => other,
    })?;
    match document {
        Document::Index { manifests } => {
            if depth >= MAX_INDEX_DEPTH {
                return Err(RegistryError::invalid_archive(format!(
                    "image indexes nested deeper than {MAX_INDEX_DEPTH}"
                )));
            }
            let host = Platform::host();
            let mut present = 0;
            for child in &manifests {
                let in_layout = sha256_hex(&child.digest).is_some_and(|h| layout.blob_size(h).is_some());
                if in_layout {
                    present += 1;
                    check_tree(layout, child, "a manifest of the index", depth + 1, reached)?;
                } else if child.platform.as_ref().is_some_and(|p| host.accepts(p)) {
                    return Err(RegistryError::invalid_archive(format!(
                        "{what} names {} for {host}, missing from the archive",
                        child.digest
                    )));
                }
            }
            if present == 0 {
                return Err(RegistryError::invalid_archive(format!(
                    "none of the manifests {what} names is in the archive"
                )));
            }
        }
        Document::Image(manifest) => {
            if manifest.config.size > MAX_MANIFEST_BYTES as i64 {
                return Err(RegistryError::TooLarge {
                    what: format!("image config {}", manifest.config.digest),
                    limit: MAX_MANIFEST_BYTES as u64,
                });
            }
            check_blob(layout, &manifest.config, "image config", reached)?;
            for layer in &manifest.layers {
                check_blob(layout, layer, "layer", reached)?;
            }
        }
    }
    Ok(())
}

/// Checks that `d`'s blob is in the layout with its size; returns its hex.
fn check_blob<'d>(
    layout: &NewLayout,
    d: &'d Descriptor,
    what: &str,
    reached: &mut HashSet<String>,
) -> Result<&'d str, RegistryError> {
    let hex = sha256_hex(&d.digest).ok_or_else(|| {
        RegistryError::invalid_archive(format!("{what} has an unsupported digest {:?}", d.digest))
    })?;
    let size = layout.blob_size(hex).ok_or_else(|| {
        RegistryError::invalid_archive(format!("{what} {} is missing from the archive", d.digest))
    })?;
    if i64::try_from(size).ok() != Some(d.size) {
        return Err(RegistryError::DigestMismatch {
            what: what.into(),
            expected: format!("{} ({} bytes)", d.digest, d.size),
            actual: format!("{} ({size} bytes)", d.digest),
        });
    }
    reached.insert(hex.to_owned());
    Ok(hex)
}
