//! Uploaded image archives read into a new OCI image layout directory, which the runtime's layout
//! reader builds from: a `docker save` archive (legacy, or Docker >= 25's with an OCI layout in
//! it), an OCI image layout archive (`skopeo copy ... oci-archive:F`), or a tar of a root file
//! system taken as a one-layer image. Plain or gzip-compressed (told by the magic bytes).
//!
//! The archive is hostile input. Nothing is ever created under a member's name: every regular
//! member is streamed into a content-addressed blob (`blobs/sha256/<hex>`, hashed while written;
//! a member named `blobs/sha256/<hex>` must hash to `<hex>`), links are only aliases looked up in
//! memory, and the layout's own files (`oci-layout`, `index.json` last) are written by this code.
//! The stream is bounded in bytes (as it arrives and as decompressed) and in members; a truncated
//! stream is an error; on any error the new directory is removed.
//!
//! What it does not do: unpack or inspect layers (the runtime's layer applier checks every layer
//! member), check configs beyond their being JSON, convert zstd or xz archives, or add to an
//! existing layout (`dest` must be new).

mod blobs;
mod docker;
mod entries;
mod members;
mod oci;
mod rootfs;
mod select;
mod stream;

use std::io::Read;
use std::path::Path;

use crate::error::RegistryError;

use blobs::NewLayout;
use members::Members;
use stream::Stream;

/// Bounds of reading one archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Most bytes of the archive stream as read: after gzip decompression if it is gzipped,
    /// headers and padding included. The compressed stream is held to the same bound as it
    /// arrives.
    pub max_bytes: u64,
    /// Most tar members.
    pub max_members: u64,
}

/// What kind of archive was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveFormat {
    /// An OCI image layout archive.
    Oci,
    /// A `docker save` archive (Docker >= 25's is read through the OCI layout it holds).
    Docker,
    /// A tar of a root file system.
    Rootfs,
}

/// What an archive held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveImage {
    pub format: ArchiveFormat,
    /// What to pass to the layout reader's `resolve`: the `org.opencontainers.image.ref.name` of
    /// the chosen image in the written `index.json`, or `None` when it holds one manifest
    /// without one.
    pub reference: Option<String>,
    /// Bytes of the archive stream read, counted as [`ArchiveLimits::max_bytes`] counts them
    /// (after decompression).
    pub bytes: u64,
}

/// Reads a `docker save` archive (legacy: `manifest.json`, `<id>/layer.tar`, `<config>.json`,
/// layer aliases as symlinks; or Docker >= 25's, which also holds an OCI layout) or an OCI image
/// layout archive (what `skopeo copy ... oci-archive:F` writes) from `input` (a tar stream, plain
/// or gzip-compressed) into `dest`, a new OCI image layout directory (mode 0700).
///
/// `image` picks one image of several: a docker tag (`app:v1`, matched as docker normalises it),
/// an OCI `ref.name` or a Docker >= 25 `io.containerd.image.name`; `None`: the archive's only
/// image. `index.json` is written as the archive had it, unless the chosen image's `ref.name`
/// does not name it alone: then it is narrowed to that image. On any error `dest` is removed; a
/// `dest` that already exists is refused (an `Io` error) and left alone.
pub fn read_image_archive(
    input: &mut dyn Read,
    dest: &Path,
    image: Option<&str>,
    limits: &ArchiveLimits,
) -> Result<ArchiveImage, RegistryError> {
    let mut layout = NewLayout::create(dest)?;
    let mut stream = Stream::open(input, limits.max_bytes, None)?;
    let members = Members::collect(&mut stream, &mut layout, limits.max_members)?;
    let bytes = stream.bytes_read();
    let has = |name: &str| members.document(name).is_some();
    let (format, reference) = if has("index.json") && has("oci-layout") {
        let format = if has("manifest.json") {
            ArchiveFormat::Docker
        } else {
            ArchiveFormat::Oci
        };
        (format, oci::write_oci_layout(layout, &members, image)?)
    } else if has("manifest.json") {
        (
            ArchiveFormat::Docker,
            docker::write_docker_image(layout, &members, image)?,
        )
    } else {
        return Err(RegistryError::invalid_archive(
            "it is neither an OCI image layout (oci-layout, index.json) nor a docker save archive (manifest.json)",
        ));
    };
    Ok(ArchiveImage {
        format,
        reference,
        bytes,
    })
}

/// Reads a tar of a root file system (plain or gzip-compressed) as a one-layer image into the new
/// layout directory `dest`: the stream is stored as the layer blob as given (hashed while
/// written; media type `application/vnd.oci.image.layer.v1.tar` or `+gzip`), with a minimal OCI
/// config (the host's architecture, `linux`, the uncompressed tar's digest as its diff id), an
/// OCI manifest and `index.json`. The tar's members are not inspected here (the runtime's layer
/// applier checks each); only its size is bounded (`limits.max_members` does not apply). On any
/// error `dest` is removed; a `dest` that already exists is refused and left alone.
pub fn read_rootfs_archive(
    input: &mut dyn Read,
    dest: &Path,
    limits: &ArchiveLimits,
) -> Result<ArchiveImage, RegistryError> {
    let layout = NewLayout::create(dest)?;
    rootfs::write_rootfs_image(input, layout, limits)
}
