//! A pull: the manifest (an index's entry for the platform), then the config and layers streamed
//! into the layout, each verified, then `index.json`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use futures_util::StreamExt as _;
use oci_client::manifest::OciDescriptor;
use oci_client::Client;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt as _;

use crate::connect::{build_client, map_oci_error, one_line, PullOptions};
use crate::credentials::Credentials;
use crate::error::RegistryError;
use crate::layout::{Layout, REF_NAME};
use crate::manifest::{
    parse_document, sha256_hex, Descriptor, Document, ImageManifest, ACCEPTED_MANIFESTS, MAX_MANIFEST_BYTES,
};
use crate::platform::Platform;
use crate::reference::ImageReference;

/// A blob of the pulled image, now in the layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledBlob {
    pub digest: String,
    pub media_type: String,
    pub size: u64,
}

/// What a pull wrote into the layout.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The reference pulled, fully written (`docker.io/library/busybox:latest`).
    pub reference: String,
    /// The `org.opencontainers.image.ref.name` of its `index.json` entry: the tag, or the digest
    /// when the reference had none.
    pub ref_name: String,
    /// The image manifest's digest (the platform's, when the reference named an index).
    pub manifest_digest: String,
    pub manifest_media_type: String,
    /// The index's digest, when the reference named an index (its blob is in the layout too).
    pub index_digest: Option<String>,
    pub platform: Platform,
    pub config: PulledBlob,
    /// The layers, bottom first.
    pub layers: Vec<PulledBlob>,
    /// The layout directory.
    pub layout: PathBuf,
    /// Bytes fetched from the registry for config and layers (blobs already present are not).
    pub bytes_downloaded: u64,
    /// How many of the first layers were not fetched (the caller had their trees: see
    /// [`pull_reusing`]); their blobs are not in the layout.
    pub skipped_layers: usize,
}

/// Tells a pull how many of an image's first layers it need not fetch, because the caller holds
/// what they make already: called once the manifest is known, with the layers' digests
/// (`sha256:<hex>`), bottom first.
pub type CachedLayers<'a> =
    Box<dyn FnOnce(Vec<String>) -> Pin<Box<dyn Future<Output = usize> + Send + 'a>> + Send + 'a>;

/// Pulls `reference` into the OCI image layout at `dest` (created if missing; an existing layout
/// is added to, its verified blobs reused).
///
/// On failure no `.partial` file is left and `index.json` is untouched; complete, verified blobs
/// may remain (a caller that made `dest` for this pull removes it).
pub async fn pull(
    reference: &ImageReference,
    dest: &Path,
    options: &PullOptions,
) -> Result<PulledImage, RegistryError> {
    pull_reusing(reference, dest, options, Box::new(|_| Box::pin(async { 0 }))).await
}

/// [`pull`], fetching none of the first layers `cached` says the caller has. The layout then
/// names layers whose blobs it lacks: its reader must not need them.
pub async fn pull_reusing(
    reference: &ImageReference,
    dest: &Path,
    options: &PullOptions,
    cached: CachedLayers<'_>,
) -> Result<PulledImage, RegistryError> {
    let credentials = options.credentials.resolve(reference.registry())?;
    let anonymous = credentials == Credentials::Anonymous;
    // Cancelled at the deadline, the pull's layout is dropped and its partial files with it.
    let pulled = pull_image(reference, dest, options, credentials, cached);
    match tokio::time::timeout(options.timeout, pulled).await {
        Ok(Err(RegistryError::Unauthorized { registry, detail, .. })) => Err(RegistryError::Unauthorized {
            registry,
            anonymous,
            detail,
        }),
        Ok(result) => result,
        Err(_) => Err(RegistryError::TimedOut {
            reference: reference.to_string(),
            seconds: options.timeout.as_secs(),
        }),
    }
}

async fn pull_image(
    reference: &ImageReference,
    dest: &Path,
    options: &PullOptions,
    credentials: Credentials,
    cached: CachedLayers<'_>,
) -> Result<PulledImage, RegistryError> {
    let client = build_client(options)?;
    let auth = match credentials {
        Credentials::Anonymous => oci_client::secrets::RegistryAuth::Anonymous,
        Credentials::Basic { username, password } => {
            oci_client::secrets::RegistryAuth::Basic(username, password)
        }
    };
    let registry = reference.registry().to_owned();
    let oci = reference.oci();
    let what = format!("image {reference}");

    // The manifest the reference names: an image manifest, or an index to pick from.
    let (bytes, digest) = fetch_manifest(&client, oci, &auth, &registry, &what).await?;
    if let Some(wanted) = reference.digest() {
        if digest != wanted {
            return Err(RegistryError::DigestMismatch {
                what: format!("manifest of {reference}"),
                expected: wanted.into(),
                actual: digest,
            });
        }
    }
    // An index: the platform's entry, fetched by digest and checked against the entry.
    let (manifest_bytes, manifest_digest, image, index, index_platform) =
        match parse_document(&bytes, &what, &registry)? {
            Document::Image(image) => (bytes, digest, image, None, None),
            Document::Index { manifests } => {
                let entry = pick_platform(&manifests, &options.platform, reference)?;
                let by_digest = oci.clone_with_digest(entry.digest.clone());
                let entry_what = format!("manifest {} of {reference}", entry.digest);
                let (m_bytes, m_digest) =
                    fetch_manifest(&client, &by_digest, &auth, &registry, &entry_what).await?;
                if m_digest != entry.digest || m_bytes.len() as i64 != entry.size {
                    return Err(RegistryError::DigestMismatch {
                        what: entry_what,
                        expected: format!("{} ({} bytes)", entry.digest, entry.size),
                        actual: format!("{m_digest} ({} bytes)", m_bytes.len()),
                    });
                }
                let Document::Image(image) = parse_document(&m_bytes, &entry_what, &registry)? else {
                    return Err(RegistryError::UnsupportedMediaType {
                        what: entry_what,
                        media_type: "an index inside an index".into(),
                    });
                };
                let platform = entry.platform.clone();
                (m_bytes, m_digest, image, Some((bytes, digest)), platform)
            }
        };
    let ImageManifest {
        media_type: manifest_media_type,
        config,
        layers,
    } = image;

    // Refuse before fetching anything when the announced sizes are already too much.
    let announced = std::iter::once(&config)
        .chain(&layers)
        .fold(0u64, |sum, d| sum.saturating_add(d.size as u64));
    if config.size as u64 > MAX_MANIFEST_BYTES as u64 {
        return Err(RegistryError::TooLarge {
            what: format!("the image config of {reference}"),
            limit: MAX_MANIFEST_BYTES as u64,
        });
    }
    if announced > options.max_total_bytes {
        return Err(RegistryError::TooLarge {
            what: format!("image {reference} ({announced} bytes)"),
            limit: options.max_total_bytes,
        });
    }

    let mut layout = Layout::open(dest)?;
    let mut budget = Budget {
        left: options.max_total_bytes,
        limit: options.max_total_bytes,
        downloaded: 0,
    };
    let fetch = Fetch {
        client: &client,
        reference: oci,
        registry: &registry,
    };
    let config_blob = fetch
        .blob(&mut layout, &config, "image config", &mut budget)
        .await?;
    let skipped_layers = cached(layers.iter().map(|l| l.digest.clone()).collect())
        .await
        .min(layers.len());
    let mut pulled_layers = Vec::with_capacity(layers.len());
    for (i, layer) in layers.iter().enumerate() {
        if i < skipped_layers {
            pulled_layers.push(PulledBlob {
                digest: layer.digest.clone(),
                media_type: layer.media_type.clone(),
                size: layer.size.max(0).unsigned_abs(),
            });
            continue;
        }
        let what = format!("layer {} ({})", i + 1, layer.digest);
        pulled_layers.push(fetch.blob(&mut layout, layer, &what, &mut budget).await?);
    }
    // Manifests last among the blobs: a layout never names what it does not hold.
    if let Some((index_bytes, index_digest)) = &index {
        layout.put_verified_bytes(hex_of(index_digest)?, index_bytes)?;
    }
    layout.put_verified_bytes(hex_of(&manifest_digest)?, &manifest_bytes)?;

    let ref_name = reference
        .tag()
        .map(str::to_owned)
        .or_else(|| reference.digest().map(str::to_owned))
        .unwrap_or_else(|| manifest_digest.clone());
    let platform = match index_platform {
        Some(p) => p,
        None => config_platform(&layout.blob_path(hex_of(&config_blob.digest)?), &registry)?,
    };
    layout.write_index(serde_json::json!({
        "mediaType": manifest_media_type,
        "digest": manifest_digest,
        "size": manifest_bytes.len(),
        "platform": platform,
        "annotations": {
            REF_NAME: ref_name,
            "io.containerd.image.name": reference.to_string(),
        },
    }))?;
    Ok(PulledImage {
        reference: reference.to_string(),
        ref_name,
        manifest_digest,
        manifest_media_type,
        index_digest: index.map(|(_, d)| d),
        platform,
        config: config_blob,
        layers: pulled_layers,
        layout: layout.root().to_owned(),
        bytes_downloaded: budget.downloaded,
        skipped_layers,
    })
}

fn hex_of(digest: &str) -> Result<&str, RegistryError> {
    sha256_hex(digest).ok_or_else(|| RegistryError::InvalidOptions(format!("unsupported digest {digest:?}")))
}

/// The platform an image's config says it is for (`os`, `architecture` and `variant` are named
/// alike in OCI's and Docker's configs). The config was verified and is at most 4 MiB.
fn config_platform(path: &Path, registry: &str) -> Result<Platform, RegistryError> {
    let bytes = std::fs::read(path).map_err(|e| RegistryError::io("read", path, e))?;
    let platform: Platform = serde_json::from_slice(&bytes).map_err(|e| RegistryError::Protocol {
        registry: registry.into(),
        detail: one_line(&format!("the image config does not name its platform: {e}")),
    })?;
    Ok(platform)
}

/// Fetches a manifest's bytes, capped, and its digest computed here.
async fn fetch_manifest(
    client: &Client,
    reference: &oci_client::Reference,
    auth: &oci_client::secrets::RegistryAuth,
    registry: &str,
    what: &str,
) -> Result<(Vec<u8>, String), RegistryError> {
    let (bytes, _) = client
        .pull_manifest_raw(reference, auth, ACCEPTED_MANIFESTS)
        .await
        .map_err(|e| map_oci_error(e, registry, what))?;
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(RegistryError::TooLarge {
            what: format!("the manifest of {what}"),
            limit: MAX_MANIFEST_BYTES as u64,
        });
    }
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    Ok((bytes.to_vec(), digest))
}

/// The entry of an index for `platform`; the first one when several match.
fn pick_platform<'a>(
    manifests: &'a [Descriptor],
    platform: &Platform,
    reference: &ImageReference,
) -> Result<&'a Descriptor, RegistryError> {
    manifests
        .iter()
        .find(|m| m.platform.as_ref().is_some_and(|p| platform.accepts(p)))
        .ok_or_else(|| RegistryError::NoMatchingPlatform {
            reference: reference.to_string(),
            platform: platform.to_string(),
            offered: {
                let offered: Vec<String> = manifests
                    .iter()
                    .filter_map(|m| m.platform.as_ref().map(|p| one_line(&p.to_string())))
                    .collect();
                if offered.is_empty() {
                    "none".into()
                } else {
                    offered.join(", ")
                }
            },
        })
}

struct Budget {
    left: u64,
    limit: u64,
    downloaded: u64,
}

struct Fetch<'a> {
    client: &'a Client,
    reference: &'a oci_client::Reference,
    registry: &'a str,
}

impl Fetch<'_> {
    /// Streams a blob to `<hex>.partial` with a running SHA-256, bounded by its descriptor's size
    /// and the budget, then renames it into place; a blob already present and sound is reused.
    async fn blob(
        &self,
        layout: &mut Layout,
        desc: &Descriptor,
        what: &str,
        budget: &mut Budget,
    ) -> Result<PulledBlob, RegistryError> {
        let hex = hex_of(&desc.digest)?.to_owned();
        let size = desc.size as u64;
        let pulled = PulledBlob {
            digest: desc.digest.clone(),
            media_type: desc.media_type.clone(),
            size,
        };
        if layout.has_blob(&hex, size)? {
            return Ok(pulled);
        }
        let oci_desc = OciDescriptor {
            media_type: desc.media_type.clone(),
            digest: desc.digest.clone(),
            size: desc.size,
            ..OciDescriptor::default()
        };
        let sized = self
            .client
            .pull_blob_stream(self.reference, &oci_desc)
            .await
            .map_err(|e| map_oci_error(e, self.registry, what))?;
        if sized.content_length.is_some_and(|n| n > size) {
            return Err(RegistryError::TooLarge {
                what: format!("{what} (announced {} bytes)", sized.content_length.unwrap_or(0)),
                limit: size,
            });
        }
        let mut stream = sized.stream;
        let (mut file, partial) = layout.create_partial(&hex).await?;
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                // oci-client's own digest check ends the stream with an error: say it as ours,
                // with what arrived.
                Err(e)
                    if e.get_ref()
                        .is_some_and(|i| i.is::<oci_client::errors::DigestError>()) =>
                {
                    break
                }
                Err(e) => {
                    return Err(RegistryError::Protocol {
                        registry: self.registry.into(),
                        detail: one_line(&format!("{what}: {e}")),
                    })
                }
            };
            received += chunk.len() as u64;
            if received > size {
                return Err(RegistryError::TooLarge {
                    what: format!("{what} (more bytes than its descriptor's {size})"),
                    limit: size,
                });
            }
            if received > budget.left {
                return Err(RegistryError::TooLarge {
                    what: format!("image {}", self.reference.whole()),
                    limit: budget.limit,
                });
            }
            hasher.update(&chunk);
            file.write_all(&chunk)
                .await
                .map_err(|e| RegistryError::io("write", &partial, e))?;
        }
        Layout::sync(&mut file, &partial).await?;
        drop(file);
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if received != size || actual != desc.digest {
            return Err(RegistryError::DigestMismatch {
                what: what.into(),
                expected: format!("{} ({size} bytes)", desc.digest),
                actual: format!("{actual} ({received} bytes)"),
            });
        }
        budget.left -= received;
        budget.downloaded += received;
        layout.commit_partial(&hex)?;
        Ok(pulled)
    }
}
