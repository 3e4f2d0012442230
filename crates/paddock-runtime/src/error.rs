//! Errors of the runtime.

use std::io;
use std::path::PathBuf;

/// Why creating, running or destroying a sandbox failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The host lacks something paddock needs for the isolation it promises.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// paddock's own configuration (state directory, cgroup parent) is unusable.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The request itself is invalid for this host (a missing mount source, a bad rootfs).
    #[error("invalid sandbox spec: {0}")]
    InvalidSpec(String),
    /// A cgroup file operation failed.
    #[error("failed to {what} cgroup file {path}")]
    Cgroup {
        /// The operation.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A storage pool operation failed.
    #[error("storage pool: failed to {what} {path}")]
    Pool {
        /// The operation.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A state directory operation failed.
    #[error("failed to {what} {path}")]
    State {
        /// The operation.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A networked sandbox's link could not be made or removed.
    #[error("sandbox network")]
    Network(#[source] crate::native::NetworkError),
    /// The setup shim could not build the sandbox.
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    /// Tearing down left something behind.
    #[error("teardown incomplete: {0}")]
    Teardown(String),
    /// The agent did not come up or answer.
    #[error("agent: {0}")]
    Agent(String),
    /// An archive to import is malformed or unsafe (a path leaving the tree, a device node, an owner
    /// outside the sandbox id range, a truncation...). Nothing of it was kept.
    #[error("invalid archive: {0}")]
    InvalidArchive(String),
    /// An archive to import is larger than the import allows. Nothing of it was kept.
    #[error("archive too large: {0}")]
    ArchiveTooLarge(String),
    /// An OCI image (its layout, manifest, config or a layer) is invalid, unsupported or too large;
    /// [`ImageError::kind`](crate::native::image::ImageError::kind) says which.
    #[error("image")]
    Image(#[source] crate::native::image::ImageError),
    /// Reading an archive from, or writing one to, the caller's stream failed (the other side went
    /// away).
    #[error("failed to {what} the archive stream")]
    Stream {
        /// "read" or "write".
        what: &'static str,
        /// The cause.
        #[source]
        source: io::Error,
    },
}
