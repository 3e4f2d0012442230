//! The one error of reading an OCI image and applying its layers.

use std::io;
use std::path::PathBuf;

/// Why reading an OCI image or applying one of its layers failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A layer is malformed or unsafe (a name leaving the tree, a path through a symlink, a hard
    /// link to a directory or outside, a truncated stream...).
    #[error("invalid image layer: {reason}")]
    InvalidLayer {
        /// What is wrong, naming the member.
        reason: String,
    },
    /// A layer is larger (bytes, members) than the limits allow.
    #[error("image layer too large: {reason}")]
    LayerTooLarge {
        /// Which limit.
        reason: String,
    },
    /// The image layout, an index, a manifest, a config or a blob is malformed, or a blob's size or
    /// digest differs from its descriptor's.
    #[error("invalid image: {reason}")]
    InvalidImage {
        /// What is wrong.
        reason: String,
    },
    /// The image uses something this reader does not support (a digest algorithm, a media type, a
    /// layout version, no manifest for this host's platform).
    #[error("unsupported image: {what}")]
    Unsupported {
        /// What.
        what: String,
    },
    /// No manifest of the layout answers the reference.
    #[error("image reference {reference:?} not found in the layout")]
    NotFound {
        /// The reference asked for.
        reference: String,
    },
    /// Reading the image's files failed.
    #[error("failed to {what} {path}")]
    Read {
        /// The step.
        what: &'static str,
        /// The file or directory, in the layout.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Writing the tree a layer is applied to failed.
    #[error("failed to {step} {path} in the image tree")]
    Tree {
        /// The step.
        step: &'static str,
        /// The member's path in the tree.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// The stable class of an [`ImageError`], for the API to map (`invalid_image`, `unsupported`,
/// `payload_too_large`, `not_found`, internal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageErrorKind {
    /// The image is malformed or unsafe: [`ImageError::InvalidLayer`], [`ImageError::InvalidImage`].
    InvalidImage,
    /// [`ImageError::Unsupported`].
    Unsupported,
    /// [`ImageError::LayerTooLarge`].
    TooLarge,
    /// [`ImageError::NotFound`].
    NotFound,
    /// The host failed: [`ImageError::Read`], [`ImageError::Tree`].
    Io,
}

impl ImageError {
    /// This error's stable class.
    pub fn kind(&self) -> ImageErrorKind {
        match self {
            Self::InvalidLayer { .. } | Self::InvalidImage { .. } => ImageErrorKind::InvalidImage,
            Self::Unsupported { .. } => ImageErrorKind::Unsupported,
            Self::LayerTooLarge { .. } => ImageErrorKind::TooLarge,
            Self::NotFound { .. } => ImageErrorKind::NotFound,
            Self::Read { .. } | Self::Tree { .. } => ImageErrorKind::Io,
        }
    }

    pub(crate) fn invalid_image(reason: impl Into<String>) -> Self {
        Self::InvalidImage {
            reason: reason.into(),
        }
    }

    pub(crate) fn unsupported(what: impl Into<String>) -> Self {
        Self::Unsupported { what: what.into() }
    }
}

impl From<ImageError> for crate::RuntimeError {
    fn from(e: ImageError) -> Self {
        Self::Image(e)
    }
}
