//! A legacy `docker save` archive (`manifest.json` naming a config `<hex>.json` and layers
//! `<id>/layer.tar`, often symlinks to `<hex>.tar`) written out as an OCI layout: the config and
//! layer blobs as stored, a new OCI manifest naming them (each layer's media type told by its
//! magic bytes), and an `index.json` naming it by the chosen RepoTag.
//!
//! It does not check a config beyond its being a JSON object, nor a layer's contents or its
//! `diff_id`: the runtime's layer applier reads and checks every layer member.

use std::collections::HashSet;

use serde::Deserialize;

use crate::error::RegistryError;
use crate::layout::REF_NAME;
use crate::manifest::{MAX_MANIFEST_BYTES, OCI_INDEX, OCI_MANIFEST};

use super::blobs::{json_bytes, NewLayout, OCI_LAYOUT};
use super::members::Members;
use super::select::{not_in_archive, same_image, several_images};

pub(super) const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";

/// One image of `manifest.json`.
#[derive(Debug, Deserialize)]
struct Entry {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

impl Entry {
    fn tags(&self) -> impl Iterator<Item = &str> {
        self.repo_tags.iter().flatten().map(String::as_str)
    }
}

/// Writes the image `manifest.json` names (the one `image` names) into `layout` as an OCI layout
/// and keeps it; returns its tag (the reference the layout reader takes), if it has one.
pub(super) fn write_docker_image(
    mut layout: NewLayout,
    members: &Members,
    image: Option<&str>,
) -> Result<Option<String>, RegistryError> {
    let bytes = members
        .document("manifest.json")
        .ok_or_else(|| RegistryError::invalid_archive("manifest.json is missing"))?;
    let entries: Vec<Entry> = serde_json::from_slice(bytes)
        .map_err(|e| RegistryError::invalid_archive(format!("manifest.json does not parse: {e}")))?;
    let (entry, tag) = choose(&entries, image)?;

    let config = members.resolve(&entry.config)?.clone();
    let what = format!("image config {:?}", entry.config);
    if config.size > MAX_MANIFEST_BYTES as u64 {
        return Err(RegistryError::TooLarge {
            what,
            limit: MAX_MANIFEST_BYTES as u64,
        });
    }
    let parsed: serde_json::Value = serde_json::from_slice(&layout.read_json_blob(&config.hex, &what)?)
        .map_err(|e| RegistryError::invalid_archive(format!("{what} does not parse: {e}")))?;
    if !parsed.is_object() {
        return Err(RegistryError::invalid_archive(format!(
            "{what} is not a JSON object"
        )));
    }
    let layers = entry
        .layers
        .iter()
        .map(|name| members.resolve(name).cloned())
        .collect::<Result<Vec<_>, _>>()?;

    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": { "mediaType": OCI_CONFIG, "digest": config.digest(), "size": config.size },
        "layers": layers.iter().map(|l| serde_json::json!({
            "mediaType": l.layer_media_type(),
            "digest": l.digest(),
            "size": l.size,
        })).collect::<Vec<_>>(),
    });
    let manifest = layout.put_bytes(&json_bytes(&manifest)?)?;

    let keep: HashSet<String> = layers
        .iter()
        .chain([&config, &manifest])
        .map(|b| b.hex.clone())
        .collect();
    layout.remove_blobs_except(&keep)?;

    let mut descriptor = serde_json::json!({
        "mediaType": OCI_MANIFEST,
        "digest": manifest.digest(),
        "size": manifest.size,
    });
    if let Some(tag) = tag {
        descriptor["annotations"] = serde_json::json!({ REF_NAME: tag });
    }
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [descriptor],
    });
    layout.finish(OCI_LAYOUT, &json_bytes(&index)?)?;
    Ok(tag.map(str::to_owned))
}

/// The entry `image` names (by one of its RepoTags), or the only one; with the tag it goes by.
fn choose<'e>(
    entries: &'e [Entry],
    image: Option<&str>,
) -> Result<(&'e Entry, Option<&'e str>), RegistryError> {
    let names = || entries.iter().flat_map(Entry::tags);
    match image {
        None => match entries {
            [only] => Ok((only, only.tags().next())),
            [] => Err(RegistryError::invalid_archive("manifest.json lists no image")),
            _ => Err(several_images(entries.len(), names())),
        },
        Some(wanted) => {
            let find = |matches: &dyn Fn(&str) -> bool| {
                entries
                    .iter()
                    .find_map(|e| e.tags().find(|t| matches(t)).map(|t| (e, Some(t))))
            };
            find(&|t| t == wanted)
                .or_else(|| find(&|t| same_image(t, wanted)))
                .ok_or_else(|| not_in_archive(wanted, names()))
        }
    }
}
