//! Templates from OCI images, first steps: reading an OCI image layout ([`ImageLayout`]: a
//! reference resolved to this host's manifest, its config's process defaults, its layers as
//! decompressed, digest-checked readers), applying layers to a tree safely ([`apply_layer`]), and
//! checking blobs against their digests ([`Digest`], [`VerifiedReader`]).
//!
//! This module does not fetch images (no registry client), build or store templates, or know
//! tenants: the caller hands it readers and a directory it owns, and runs it on a blocking thread.

mod digest;
mod error;
mod layer;
mod layout;
#[cfg(test)]
mod tests;

pub use digest::{image_error, Digest, VerifiedReader};
pub use error::{ImageError, ImageErrorKind};
pub use layer::{apply_layer, LayerLimits, LayerSummary};
pub use layout::{
    host_architecture, ImageLayout, ImageManifest, LayerCompression, LayerDescriptor, LayerReader,
    MAX_INDEX_DEPTH, MAX_JSON_BYTES,
};
