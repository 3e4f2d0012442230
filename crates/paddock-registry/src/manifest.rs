//! The manifests and indexes a pull accepts, parsed from the registry's bytes (kept verbatim, so
//! their digests hold), and the media types of what they name.

use serde::Deserialize;

use crate::error::RegistryError;
use crate::platform::Platform;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// The manifest media types asked for, in order of preference.
pub(crate) const ACCEPTED_MANIFESTS: &[&str] = &[OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

const CONFIGS: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

/// The layer media types a pull accepts: the other half (the layer applier) reads these.
pub const LAYER_MEDIA_TYPES: &[&str] = &[
    "application/vnd.oci.image.layer.v1.tar",
    "application/vnd.oci.image.layer.v1.tar+gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.docker.image.rootfs.diff.tar.gzip",
];

/// The largest manifest or index accepted.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// A content descriptor, as the registry wrote it (digest checked: `sha256:` and 64 hex digits).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    schema_version: Option<i64>,
    media_type: Option<String>,
    config: Option<Descriptor>,
    layers: Option<Vec<Descriptor>>,
    manifests: Option<Vec<Descriptor>>,
}

/// A parsed manifest document.
#[derive(Debug)]
pub(crate) enum Document {
    Index { manifests: Vec<Descriptor> },
    Image(ImageManifest),
}

/// An image manifest: its media type, config and layers (bottom first).
#[derive(Debug)]
pub(crate) struct ImageManifest {
    pub media_type: String,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

/// The hex of a `sha256:<64 lowercase hex>` digest; anything else is refused (it names a file).
pub(crate) fn sha256_hex(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

fn unsupported(what: &str, media_type: &str) -> RegistryError {
    RegistryError::UnsupportedMediaType {
        what: what.into(),
        media_type: media_type.into(),
    }
}

/// Parses a manifest or index, refusing media types paddock does not pull.
pub(crate) fn parse_document(bytes: &[u8], what: &str, registry: &str) -> Result<Document, RegistryError> {
    let protocol = |detail: String| RegistryError::Protocol {
        registry: registry.into(),
        detail,
    };
    let raw: Raw =
        serde_json::from_slice(bytes).map_err(|e| protocol(format!("{what} is not a manifest: {e}")))?;
    if raw.schema_version != Some(2) {
        let v = raw.schema_version.map_or("none".into(), |v| v.to_string());
        return Err(unsupported(what, &format!("schemaVersion {v}")));
    }
    // OCI documents may omit mediaType; their shape says which they are.
    let media_type = match raw.media_type {
        Some(m) => m,
        None if raw.manifests.is_some() => OCI_INDEX.into(),
        None if raw.config.is_some() => OCI_MANIFEST.into(),
        None => return Err(unsupported(what, "(none)")),
    };
    let check = |d: &Descriptor| -> Result<(), RegistryError> {
        if sha256_hex(&d.digest).is_none() {
            return Err(protocol(format!(
                "{what} names an unsupported digest {:?}",
                d.digest
            )));
        }
        if d.size < 0 {
            return Err(protocol(format!("{what} gives {} a negative size", d.digest)));
        }
        Ok(())
    };
    match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => {
            let manifests = raw
                .manifests
                .ok_or_else(|| protocol(format!("{what} has no manifests")))?;
            manifests.iter().try_for_each(check)?;
            Ok(Document::Index { manifests })
        }
        OCI_MANIFEST | DOCKER_MANIFEST => {
            let config = raw
                .config
                .ok_or_else(|| protocol(format!("{what} has no config")))?;
            check(&config)?;
            if !CONFIGS.contains(&config.media_type.as_str()) {
                return Err(unsupported("image config", &config.media_type));
            }
            let layers = raw.layers.unwrap_or_default();
            for l in &layers {
                check(l)?;
                if !LAYER_MEDIA_TYPES.contains(&l.media_type.as_str()) {
                    return Err(unsupported(&format!("layer {}", l.digest), &l.media_type));
                }
            }
            Ok(Document::Image(ImageManifest {
                media_type,
                config,
                layers,
            }))
        }
        other => Err(unsupported(what, other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn manifest(layer_type: &str) -> String {
        format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{D}","size":2}},
               "layers":[{{"mediaType":"{layer_type}","digest":"{D}","size":3}}]}}"#
        )
    }

    #[test]
    fn accepted_and_refused_media_types() {
        let doc = parse_document(
            manifest("application/vnd.oci.image.layer.v1.tar+gzip").as_bytes(),
            "m",
            "r",
        )
        .expect("ok");
        assert!(matches!(doc, Document::Image(ref m) if m.media_type == OCI_MANIFEST));
        let err = parse_document(
            manifest("application/vnd.oci.image.layer.nondistributable.v1.tar").as_bytes(),
            "m",
            "r",
        )
        .expect_err("refused");
        assert_eq!(err.kind(), ErrorKind::UnsupportedMediaType);
        let v1 = br#"{"schemaVersion":1,"name":"x","fsLayers":[]}"#;
        assert_eq!(
            parse_document(v1, "m", "r").expect_err("v1").kind(),
            ErrorKind::UnsupportedMediaType
        );
        let helm = br#"{"schemaVersion":2,"mediaType":"application/vnd.cncf.helm.chart.v1+json"}"#;
        assert_eq!(
            parse_document(helm, "m", "r").expect_err("helm").kind(),
            ErrorKind::UnsupportedMediaType
        );
        let index = format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"{OCI_MANIFEST}","digest":"{D}","size":1,"platform":{{"os":"linux","architecture":"amd64"}}}}]}}"#
        );
        assert!(matches!(
            parse_document(index.as_bytes(), "m", "r").expect("index"),
            Document::Index { .. }
        ));
    }

    #[test]
    fn digests_that_could_name_other_files_are_refused() {
        let bad =
            manifest("application/vnd.oci.image.layer.v1.tar").replace(&D[7..], "../../../../etc/passwd");
        assert_eq!(
            parse_document(bad.as_bytes(), "m", "r").expect_err("bad").kind(),
            ErrorKind::Protocol
        );
        assert_eq!(sha256_hex(D), Some(&D[7..]));
        assert_eq!(sha256_hex("sha512:00"), None);
    }
}
