//! Images pulled from an OCI registry, or read from an uploaded archive, into a local OCI image
//! layout directory (`oci-layout`, `index.json`, `blobs/sha256/<hex>`), which the runtime's
//! layout reader and layer applier take from there.
//!
//! What it does: parses references as docker does; picks credentials (explicit, then
//! `PADDOCK_REGISTRY_USERNAME`/`PADDOCK_REGISTRY_PASSWORD`, then `~/.docker/config.json`'s
//! `auths`, else anonymous) that answer basic or bearer-token challenges; verifies TLS always
//! (an extra CA file may be trusted; plain HTTP only to a loopback registry listed as insecure);
//! picks the host's platform from an index; streams every blob through SHA-256 with size caps and
//! renames it into place only once verified; writes `index.json` last. Reads an uploaded image
//! archive ([`read_image_archive`]: `docker save`, legacy or Docker >= 25's, or an OCI layout
//! archive; plain or gzip) or a root file system tar ([`read_rootfs_archive`], as a one-layer
//! image) into a new layout, as hostile input: bounded in bytes and members, every member stored
//! as a content-addressed blob and never under its own name, links never created, the directory
//! removed on any error.
//!
//! What it does not do: unpack layers or inspect their members (the runtime's layer applier
//! does), know templates or sandboxes, run credential helpers, or read zstd/xz archives.

mod archive;
mod connect;
mod credentials;
mod error;
mod layout;
mod manifest;
mod platform;
mod pull;
mod reference;

pub use archive::{read_image_archive, read_rootfs_archive, ArchiveFormat, ArchiveImage, ArchiveLimits};
pub use connect::PullOptions;
pub use credentials::{CredentialSources, Credentials, PASSWORD_ENV, USERNAME_ENV};
pub use error::{ErrorKind, RegistryError};
pub use layout::REF_NAME;
pub use manifest::{
    DOCKER_LIST, DOCKER_MANIFEST, LAYER_MEDIA_TYPES, MAX_MANIFEST_BYTES, OCI_INDEX, OCI_MANIFEST,
};
pub use platform::Platform;
pub use pull::{pull, pull_reusing, CachedLayers, PulledBlob, PulledImage};
pub use reference::ImageReference;
