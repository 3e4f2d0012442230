//! Templates from OCI images, first steps: applying an image's layers to a tree safely
//! ([`apply_layer`]) and checking blobs against their digests ([`Digest`], [`VerifiedReader`]).
//!
//! This module does not fetch images (no registry client), build or store templates, or know
//! tenants: the caller hands it readers and a directory it owns, and runs it on a blocking thread.

mod digest;
mod error;
mod layer;
#[cfg(test)]
mod tests;

pub use digest::{image_error, Digest, VerifiedReader};
pub use error::{ImageError, ImageErrorKind};
pub use layer::{apply_layer, LayerLimits, LayerSummary};
