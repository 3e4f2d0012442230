//! What a backend is asked to build a template from, the bounds of a build, what it reports while
//! building and what it built ([`crate::StorageBackend::build_template`]). Backend-neutral: the
//! native backend's builder is `native/template/`.

use std::path::PathBuf;

use paddock_types::ImageConfig;
use serde::{Deserialize, Serialize};

/// The layer cache's keys of an image's layers (digests `sha256:<hex>`, bottom first): key `i`
/// names the tree after layer `i`, chaining every digest below it, so equal keys are equal trees.
/// What [`crate::StorageBackend::cached_prefix`] takes for an image.
pub fn image_chain_keys<S: AsRef<str>>(layer_digests: &[S]) -> Vec<String> {
    use sha2::{Digest as _, Sha256};
    let mut previous = String::new();
    layer_digests
        .iter()
        .map(|digest| {
            let mut h = Sha256::new();
            h.update(previous.as_bytes());
            h.update(b" ");
            h.update(digest.as_ref().as_bytes());
            previous = hex::encode(h.finalize());
            previous.clone()
        })
        .collect()
}

/// Where a template's files come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateSource {
    /// An image of an OCI image layout directory on the host (a registry pull lands in one):
    /// `reference` picks a tag or digest of its index (`None`: its only image).
    ImageLayout {
        /// The layout directory (the host's; nothing inside is followed).
        path: PathBuf,
        /// A tag (`org.opencontainers.image.ref.name`) or `sha256:` digest.
        reference: Option<String>,
    },
}

/// Bounds of one build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLimits {
    /// Most bytes the build may write to storage (beyond what cached layers hold already): the
    /// build's disk limit.
    pub max_bytes: u64,
    /// Most bytes of one layer's uncompressed tar stream.
    pub max_layer_bytes: u64,
    /// Most members of one layer.
    pub max_layer_entries: u64,
}

impl Default for TemplateLimits {
    fn default() -> Self {
        Self {
            max_bytes: 20 << 30,
            max_layer_bytes: 10 << 30,
            max_layer_entries: 1_000_000,
        }
    }
}

/// A step of a build, as it happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TemplateProgress {
    /// The image is resolved: its manifest's digest and how many layers it has.
    Resolved {
        /// `sha256:...`
        digest: String,
        /// Layers to apply.
        layers: usize,
    },
    /// A layer is in place: applied now, or found in the layer cache.
    Layer {
        /// Its position, from 0 (the bottom).
        index: usize,
        /// Its blob's digest.
        digest: String,
        /// Its blob's size.
        size: u64,
        /// Whether the cache had it (nothing was unpacked).
        cached: bool,
    },
}

/// One layer of a built template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuiltLayer {
    /// Its blob's digest.
    pub digest: String,
    /// Its blob's size (compressed, as stored).
    pub size: u64,
    /// Whether the cache had it.
    pub cached: bool,
}

/// What a build made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateBuilt {
    /// The digest of the image's manifest (for this host's platform).
    pub digest: String,
    /// The image's process defaults.
    pub config: ImageConfig,
    /// Its layers, bottom first.
    pub layers: Vec<BuiltLayer>,
    /// Whether paddock added the user `user` (the image had none of that name).
    pub added_default_user: bool,
    /// Bytes of the pool its tree can hold: what the cached tree it started from holds plus what
    /// its build wrote (an upper bound: what a later layer removed still counts). What its owner is
    /// charged against a storage quota; 0 in records made before it was measured.
    #[serde(default)]
    pub bytes: u64,
}
