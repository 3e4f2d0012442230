//! The one error type of a pull or an archive read, with a stable kind an API can map to a code.

use std::io;
use std::path::PathBuf;

/// What went wrong, stable across versions: an API maps each to a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The reference is not a valid image reference.
    InvalidReference,
    /// The registry's host cannot be resolved or reached.
    Unreachable,
    /// The registry's TLS certificate is not trusted (or TLS failed).
    Tls,
    /// The whole pull took longer than its deadline.
    TimedOut,
    /// The repository, tag or digest does not exist.
    NotFound,
    /// The credentials were refused, or the registry requires some.
    Unauthorized,
    /// A manifest, index or layer has a media type paddock does not accept.
    UnsupportedMediaType,
    /// A blob or manifest did not hash to its digest, or had another size than announced.
    DigestMismatch,
    /// A manifest, blob or the whole image is larger than allowed.
    TooLarge,
    /// An index lists no image for the host's platform.
    NoMatchingPlatform,
    /// The options are invalid (plain HTTP to a non-loopback registry, an unreadable CA file...).
    InvalidOptions,
    /// The registry answered something that breaks the distribution spec.
    Protocol,
    /// Writing the local layout (or reading the archive stream) failed.
    Io,
    /// An uploaded archive is not a tar, is truncated, is neither an OCI nor a docker image archive,
    /// holds an unsafe member, misses a file it names, or holds JSON that does not parse.
    InvalidArchive,
}

impl ErrorKind {
    /// A stable snake_case name, for logs and API codes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidReference => "invalid_reference",
            Self::Unreachable => "registry_unreachable",
            Self::Tls => "registry_tls",
            Self::TimedOut => "registry_timeout",
            Self::NotFound => "image_not_found",
            Self::Unauthorized => "registry_unauthorized",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::DigestMismatch => "digest_mismatch",
            Self::TooLarge => "image_too_large",
            Self::NoMatchingPlatform => "no_matching_platform",
            Self::InvalidOptions => "invalid_registry_options",
            Self::Protocol => "registry_protocol",
            Self::Io => "io",
            Self::InvalidArchive => "invalid_archive",
        }
    }
}

/// A pull or an archive read that failed. `Display` is one readable line.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("invalid image reference {reference:?}: {reason}")]
    InvalidReference { reference: String, reason: String },
    #[error("registry {registry} is unreachable: {detail}")]
    Unreachable { registry: String, detail: String },
    #[error("TLS with registry {registry} failed: {detail}")]
    Tls { registry: String, detail: String },
    #[error("{what} not found in registry {registry}")]
    NotFound { registry: String, what: String },
    #[error(
        "registry {registry} {}{detail}",
        if *anonymous { "refuses anonymous pulls: credentials are needed" } else { "refused the credentials" }
    )]
    Unauthorized {
        registry: String,
        /// No credentials were presented.
        anonymous: bool,
        detail: String,
    },
    #[error("pulling {reference} took longer than {seconds} s")]
    TimedOut { reference: String, seconds: u64 },
    #[error("unsupported media type {media_type:?} for the {what}")]
    UnsupportedMediaType { what: String, media_type: String },
    #[error("{what} does not match its digest {expected} (got {actual})")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{what} is larger than the {limit} bytes allowed")]
    TooLarge { what: String, limit: u64 },
    #[error("image {reference} has no manifest for {platform} (it offers: {offered})")]
    NoMatchingPlatform {
        reference: String,
        platform: String,
        offered: String,
    },
    #[error("{0}")]
    InvalidOptions(String),
    #[error("registry {registry} broke the protocol: {detail}")]
    Protocol { registry: String, detail: String },
    #[error("failed to {action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("invalid image archive: {detail}")]
    InvalidArchive { detail: String },
    #[error("image {image:?} is not in the archive (it holds {offered})")]
    NotInArchive { image: String, offered: String },
    #[error("the archive has more than {limit} members")]
    TooManyMembers { limit: u64 },
    #[error("failed to read the archive stream")]
    ReadArchive {
        #[source]
        source: io::Error,
    },
}

impl RegistryError {
    /// The stable kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidReference { .. } => ErrorKind::InvalidReference,
            Self::Unreachable { .. } => ErrorKind::Unreachable,
            Self::Tls { .. } => ErrorKind::Tls,
            Self::TimedOut { .. } => ErrorKind::TimedOut,
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::Unauthorized { .. } => ErrorKind::Unauthorized,
            Self::UnsupportedMediaType { .. } => ErrorKind::UnsupportedMediaType,
            Self::DigestMismatch { .. } => ErrorKind::DigestMismatch,
            Self::TooLarge { .. } => ErrorKind::TooLarge,
            Self::NoMatchingPlatform { .. } => ErrorKind::NoMatchingPlatform,
            Self::InvalidOptions(_) => ErrorKind::InvalidOptions,
            Self::Protocol { .. } => ErrorKind::Protocol,
            Self::Io { .. } | Self::ReadArchive { .. } => ErrorKind::Io,
            Self::InvalidArchive { .. } => ErrorKind::InvalidArchive,
            Self::NotInArchive { .. } => ErrorKind::NotFound,
            Self::TooManyMembers { .. } => ErrorKind::TooLarge,
        }
    }

    pub(crate) fn invalid_archive(detail: impl Into<String>) -> Self {
        Self::InvalidArchive {
            detail: detail.into(),
        }
    }

    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
