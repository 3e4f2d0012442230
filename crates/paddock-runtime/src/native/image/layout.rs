//! Reading an OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/<hex>`): resolving
//! a reference to one manifest for this host's platform, its config, and its layers as decompressed,
//! digest-checked readers.
//!
//! The layout is untrusted (it may come from an upload): every file is opened from the layout's
//! directory descriptor without following a symlink (`open_regular_at`: `O_PATH | O_NOFOLLOW`, a
//! regular file by `fstat` or refused, reopened `O_NONBLOCK` so a fifo never blocks), directories
//! with `O_DIRECTORY | O_NOFOLLOW`; JSON (index.json, indexes, manifests, configs) is read whole but
//! at most [`MAX_JSON_BYTES`], and every blob is checked against its descriptor's size and digest
//! ([`VerifiedReader`]) before it is trusted (a layer: when its reader reaches the end). Only the
//! JSON types come from the `oci-spec` crate.
//!
//! A reference is a `org.opencontainers.image.ref.name` annotation of `index.json`'s manifests, a
//! digest of one of them, or nothing when there is exactly one. An image index (OCI, or Docker's
//! manifest list) is followed to its `linux` manifest for this host's architecture, through at most
//! [`MAX_INDEX_DEPTH`] nested indexes (a digest seen twice is refused). Manifests: OCI v1 and Docker
//! schema 2. Layers: tar and tar+gzip (OCI and Docker names); zstd is refused as unsupported (no
//! zstd decoder in the build), as are non-distributable layers.
//!
//! This module does not fetch anything, apply layers (`layer.rs`), or interpret the config beyond
//! picking out its process defaults ([`paddock_types::ImageConfig`]).

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use oci_spec::image::{Descriptor, ImageConfiguration, ImageIndex, ImageManifest as OciManifest};
use paddock_sys::fs_in_root::{open_dir_at, open_regular_at};
use paddock_types::ImageConfig;
use rustix::io::Errno;
use serde::de::DeserializeOwned;

use super::digest::image_error;
use super::{Digest, ImageError, VerifiedReader};

/// Largest JSON file or blob read (index.json, an index, a manifest, a config).
pub const MAX_JSON_BYTES: u64 = 4 << 20;
/// Most image indexes followed from `index.json` to a manifest.
pub const MAX_INDEX_DEPTH: usize = 4;
/// The annotation naming a manifest in `index.json`.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerCompression {
    /// A plain tar stream.
    None,
    /// gzip (one or more members).
    Gzip,
}

/// One layer of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerDescriptor {
    /// The blob's digest (of the compressed bytes).
    pub digest: Digest,
    /// The blob's size in bytes.
    pub size: u64,
    /// The media type as the manifest names it.
    pub media_type: String,
    /// How the blob is compressed (from the media type).
    pub compression: LayerCompression,
}

/// A resolved image: its manifest's digest, config and layers (bottom first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageManifest {
    /// The digest of the manifest chosen (for this platform).
    pub digest: Digest,
    /// The config's process defaults.
    pub config: ImageConfig,
    /// The layers, to be applied in order.
    pub layers: Vec<LayerDescriptor>,
}

/// An OCI image layout directory, opened.
#[derive(Debug)]
pub struct ImageLayout {
    path: PathBuf,
    dir: OwnedFd,
}

impl ImageLayout {
    /// Opens the layout at `path` (a host path chosen by the host; nothing inside it is followed)
    /// and checks its `oci-layout` file says version 1.0.0.
    pub fn open(path: &Path) -> Result<Self, ImageError> {
        let dir = open_dir_at(rustix::fs::CWD, path).map_err(|e| ImageError::Read {
            what: "open the image layout",
            path: path.to_owned(),
            source: e.into(),
        })?;
        let layout = Self {
            path: path.to_owned(),
            dir,
        };
        #[derive(serde::Deserialize)]
        struct Marker {
            #[serde(rename = "imageLayoutVersion")]
            version: String,
        }
        let marker: Marker = parse("oci-layout", &layout.read_file(&[], "oci-layout")?)?;
        if marker.version != "1.0.0" {
            return Err(ImageError::unsupported(format!(
                "image layout version {:?} (only 1.0.0)",
                marker.version
            )));
        }
        Ok(layout)
    }

    /// Resolves `reference` (see the module's doc) to this host's manifest.
    pub fn resolve(&self, reference: Option<&str>) -> Result<ImageManifest, ImageError> {
        let index: ImageIndex = parse("index.json", &self.read_file(&[], "index.json")?)?;
        let manifests = index.manifests();
        let chosen = match reference {
            None => match manifests.as_slice() {
                [only] => only,
                _ => {
                    return Err(ImageError::invalid_image(format!(
                        "the layout holds {} manifests: name one",
                        manifests.len()
                    )))
                }
            },
            Some(r) if r.starts_with("sha256:") => {
                let digest: Digest = r.parse()?;
                manifests
                    .iter()
                    .find(|d| descriptor_digest(d).is_ok_and(|x| x == digest))
                    .ok_or_else(|| ImageError::NotFound { reference: r.into() })?
            }
            Some(r) => manifests
                .iter()
                .find(|d| {
                    d.annotations()
                        .as_ref()
                        .and_then(|a| a.get(REF_NAME))
                        .map(String::as_str)
                        == Some(r)
                })
                .ok_or_else(|| ImageError::NotFound { reference: r.into() })?,
        };
        self.manifest(chosen)
    }

    /// The manifest a descriptor of `index.json` leads to, through indexes.
    fn manifest(&self, top: &Descriptor) -> Result<ImageManifest, ImageError> {
        let mut seen = HashSet::new();
        let mut descriptor = top.clone();
        for _ in 0..=MAX_INDEX_DEPTH {
            let digest = descriptor_digest(&descriptor)?;
            if !seen.insert(digest) {
                return Err(ImageError::invalid_image(format!(
                    "image index loop through {digest}"
                )));
            }
            let media_type = descriptor.media_type().to_string();
            match media_type.as_str() {
                OCI_INDEX | DOCKER_LIST => {
                    let index: ImageIndex = self.read_json(&descriptor)?;
                    descriptor = pick_platform(&index, digest)?.clone();
                }
                OCI_MANIFEST | DOCKER_MANIFEST => return self.image(&descriptor, digest),
                other => {
                    return Err(ImageError::unsupported(format!("manifest media type {other:?}")));
                }
            }
        }
        Err(ImageError::invalid_image(format!(
            "image indexes nested deeper than {MAX_INDEX_DEPTH}"
        )))
    }

    fn image(&self, descriptor: &Descriptor, digest: Digest) -> Result<ImageManifest, ImageError> {
        let manifest: OciManifest = self.read_json(descriptor)?;
        let config: ImageConfiguration = self.read_json(manifest.config())?;
        let layers = manifest
            .layers()
            .iter()
            .map(|d| {
                let media_type = d.media_type().to_string();
                let compression = layer_compression(&media_type)?;
                Ok(LayerDescriptor {
                    digest: descriptor_digest(d)?,
                    size: d.size(),
                    media_type,
                    compression,
                })
            })
            .collect::<Result<Vec<_>, ImageError>>()?;
        Ok(ImageManifest {
            digest,
            config: summarise(&config),
            layers,
        })
    }

    /// Opens a layer's blob as its uncompressed tar stream. The blob is checked against the
    /// descriptor's size and digest as it is read: the reader fails (an `io::Error` carrying an
    /// [`ImageError`], see [`image_error`]) where it differs, at the latest when it ends, so a
    /// consumer must read it to its end.
    pub fn open_layer(&self, layer: &LayerDescriptor) -> Result<LayerReader, ImageError> {
        let file = self.open_blob(&layer.digest)?;
        let verified = VerifiedReader::new(file, layer.digest, layer.size);
        let inner = match layer.compression {
            LayerCompression::None => Decoder::Plain(verified),
            LayerCompression::Gzip => Decoder::Gzip(Box::new(flate2::read::MultiGzDecoder::new(verified))),
        };
        Ok(LayerReader { inner })
    }

    /// Reads a JSON blob, checked against its descriptor.
    fn read_json<T: DeserializeOwned>(&self, descriptor: &Descriptor) -> Result<T, ImageError> {
        let digest = descriptor_digest(descriptor)?;
        let size = descriptor.size();
        if size > MAX_JSON_BYTES {
            return Err(ImageError::invalid_image(format!(
                "blob {digest} ({size} bytes) is larger than the {MAX_JSON_BYTES} bytes allowed for JSON"
            )));
        }
        let mut bytes = Vec::new();
        VerifiedReader::new(self.open_blob(&digest)?, digest, size)
            .read_to_end(&mut bytes)
            .map_err(|e| self.read_error(&format!("blobs/sha256/{}", digest.hex()), e))?;
        parse(&digest.to_string(), &bytes)
    }

    fn open_blob(&self, digest: &Digest) -> Result<File, ImageError> {
        let hex = digest.hex();
        self.open_file(&["blobs", "sha256"], &hex)
    }

    /// Opens the regular file `name` in the directory `dirs` of the layout, following no symlink.
    fn open_file(&self, dirs: &[&str], name: &str) -> Result<File, ImageError> {
        let shown = dirs.iter().chain([&name]).copied().collect::<Vec<_>>().join("/");
        let mut dir = self.dir.try_clone().map_err(|e| self.read_error(&shown, e))?;
        for d in dirs {
            dir = open_dir_at(dir.as_fd(), *d).map_err(|e| match e {
                Errno::NOTDIR | Errno::LOOP => {
                    ImageError::invalid_image(format!("{shown}: {d} is not a directory"))
                }
                e => self.read_error(&shown, e.into()),
            })?;
        }
        match open_regular_at(dir.as_fd(), name.as_ref()) {
            Ok((file, _)) => Ok(file),
            Err(e) if e.kind() == io::ErrorKind::InvalidInput || e.raw_os_error() == Some(libc::ELOOP) => {
                Err(ImageError::invalid_image(format!(
                    "{shown} is not a regular file (a symlink, a fifo...)"
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ImageError::invalid_image(format!(
                "{shown} is missing from the layout"
            ))),
            Err(e) => Err(self.read_error(&shown, e)),
        }
    }

    /// Reads a small file of the layout (`oci-layout`, `index.json`), bounded.
    fn read_file(&self, dirs: &[&str], name: &str) -> Result<Vec<u8>, ImageError> {
        let file = self.open_file(dirs, name)?;
        let mut bytes = Vec::new();
        file.take(MAX_JSON_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.read_error(name, e))?;
        if bytes.len() as u64 > MAX_JSON_BYTES {
            return Err(ImageError::invalid_image(format!(
                "{name} is larger than {MAX_JSON_BYTES} bytes"
            )));
        }
        Ok(bytes)
    }

    fn read_error(&self, name: &str, e: io::Error) -> ImageError {
        image_error(e).unwrap_or_else(|source| ImageError::Read {
            what: "read",
            path: self.path.join(name),
            source,
        })
    }
}

/// A layer's uncompressed tar stream, read from its blob (see [`ImageLayout::open_layer`]).
pub struct LayerReader {
    inner: Decoder,
}

enum Decoder {
    Plain(VerifiedReader<File>),
    Gzip(Box<flate2::read::MultiGzDecoder<VerifiedReader<File>>>),
}

impl std::fmt::Debug for LayerReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerReader").finish_non_exhaustive()
    }
}

impl Read for LayerReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.inner {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(r) => match r.read(buf) {
                // The decompressor may stop before its input's end: the whole blob is checked.
                Ok(0) => r.get_mut().finish().map(|()| 0),
                Ok(n) => Ok(n),
                Err(e) if e.get_ref().is_some_and(|inner| inner.is::<ImageError>()) => Err(e),
                // The decompressor's own complaint (or a read error): a blob that is not what its
                // descriptor says explains it best, else the stream is not gzip.
                Err(e) => {
                    r.get_mut().finish()?;
                    let reason = format!("a gzip layer does not decompress: {e}");
                    Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        ImageError::invalid_image(reason),
                    ))
                }
            },
        }
    }
}

fn parse<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, ImageError> {
    serde_json::from_slice(bytes).map_err(|e| ImageError::invalid_image(format!("{what}: {e}")))
}

fn descriptor_digest(d: &Descriptor) -> Result<Digest, ImageError> {
    d.digest().to_string().parse()
}

/// This host's architecture as OCI names it.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn pick_platform(index: &ImageIndex, digest: Digest) -> Result<&Descriptor, ImageError> {
    let arch = host_architecture();
    index
        .manifests()
        .iter()
        .find(|d| {
            d.platform()
                .as_ref()
                .is_some_and(|p| p.os().to_string() == "linux" && p.architecture().to_string() == arch)
        })
        .ok_or_else(|| {
            ImageError::unsupported(format!("image index {digest} has no manifest for linux/{arch}"))
        })
}

fn layer_compression(media_type: &str) -> Result<LayerCompression, ImageError> {
    match media_type {
        "application/vnd.oci.image.layer.v1.tar" | "application/vnd.docker.image.rootfs.diff.tar" => {
            Ok(LayerCompression::None)
        }
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Ok(LayerCompression::Gzip),
        other => Err(ImageError::unsupported(format!("layer media type {other:?}"))),
    }
}

fn summarise(config: &ImageConfiguration) -> ImageConfig {
    let Some(c) = config.config() else {
        return ImageConfig::default();
    };
    ImageConfig {
        env: c.env().clone().unwrap_or_default(),
        working_dir: c.working_dir().clone().filter(|w| !w.is_empty()),
        user: c.user().clone().filter(|u| !u.is_empty()),
        exposed_ports: c.exposed_ports().clone().unwrap_or_default(),
        entrypoint: c.entrypoint().clone(),
        cmd: c.cmd().clone(),
    }
}
