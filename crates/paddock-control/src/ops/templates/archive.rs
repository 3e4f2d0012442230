//! Templates from uploaded archives: a `docker save` archive or an OCI image layout archive (as
//! `skopeo copy ... oci-archive:` writes), or a tar of a root file system built as a one-layer
//! image. The upload is read as hostile input (`paddock_registry::read_image_archive`: bounded,
//! nothing created under a member's own name, blobs checked against their digests) into an OCI
//! image layout in the pull directory, then built as a pulled image is: the same layer applier,
//! cache, limits, quota and audit rows. A build context (`format=context`) is stored and indexed
//! (`context.rs`) and its recipe built with it.
//!
//! This module does not read archives or directories from the server's own disk: a tenant never
//! names a server path (the CLI packs a local directory into an upload).

use paddock_registry::{ArchiveFormat, ArchiveLimits};
use paddock_runtime::TemplateBuilt;
use paddock_types::api::ErrorCode;
use paddock_types::api::{ImportTemplateQuery, TemplateBuildEvent, TemplateInfo, TemplateStart};
use paddock_types::{NetworkPolicy, TemplateId};
use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt as _;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::configured::recipe_source;
use super::context::{Context, ContextError};
use super::recipe::RecipePlan;
use super::{registry_error, template_name, BuildRoom, Source, Wanted};
use crate::{ByteStream, Principal, SandboxService, ServiceError};

/// Most members of an uploaded archive (a layer's own members are bounded by the applier).
const MAX_ARCHIVE_MEMBERS: u64 = 100_000;

/// What an upload holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArchiveKind {
    /// A `docker save` or OCI image layout archive.
    Image,
    /// A tar of a root file system.
    Rootfs,
}

/// An uploaded archive to build from.
pub(super) struct Upload {
    body: ByteStream,
    kind: ArchiveKind,
    image: Option<String>,
}

impl SandboxService {
    /// Builds a template for `p`'s tenant from the archive `body` (see `ImportTemplateQuery`),
    /// sending each step to `events` as [`Self::build_template`] does. An invalid request is
    /// refused before the body is read.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant))]
    pub async fn import_template(
        &self,
        p: &Principal,
        query: ImportTemplateQuery,
        body: ByteStream,
        events: mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<TemplateInfo, ServiceError> {
        let name = template_name(&query.name)?;
        let kind = match query.format.as_deref() {
            None | Some("image") => ArchiveKind::Image,
            Some("rootfs") => ArchiveKind::Rootfs,
            Some("context") => return self.build_with_context(p, name, query, body, events).await,
            Some(other) => {
                return Err(ServiceError::invalid(
                    "format",
                    format!(
                        "{other:?} is not a format: `image` (docker or OCI archive), `rootfs` or `context`"
                    ),
                ))
            }
        };
        for (field, given) in [
            ("recipe", query.recipe.is_some()),
            ("build_args", query.build_args.is_some()),
            ("network", query.network.is_some()),
        ] {
            if given {
                return Err(ServiceError::invalid(
                    field,
                    "only a build context (format=context) takes a recipe",
                ));
            }
        }
        if kind == ArchiveKind::Rootfs && query.image.is_some() {
            return Err(ServiceError::invalid(
                "image",
                "a root file system archive holds one image: name none",
            ));
        }
        let start = start_of(&query)?;
        let source_text = match (kind, &query.image) {
            (ArchiveKind::Rootfs, _) => "upload: root file system archive".to_owned(),
            (ArchiveKind::Image, None) => "upload: image archive".to_owned(),
            (ArchiveKind::Image, Some(image)) => format!("upload: image archive ({image})"),
        };
        let wanted = Wanted {
            name,
            source_text,
            network: None,
            start,
        };
        let upload = Upload {
            body,
            kind,
            image: query.image,
        };
        self.build_from(p, wanted, Source::Archive(upload), events, false)
            .await
    }

    /// Builds the recipe of the build context `body` (its `COPY` and `ADD` take their files from
    /// it). The context is stored (bounded by `[registry] max_image`) and indexed before anything
    /// else; it is removed when the build ends.
    async fn build_with_context(
        &self,
        p: &Principal,
        name: paddock_types::VolumeName,
        query: ImportTemplateQuery,
        body: ByteStream,
        events: mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<TemplateInfo, ServiceError> {
        if query.image.is_some() {
            return Err(ServiceError::invalid(
                "image",
                "a build context holds no image: its recipe names one",
            ));
        }
        let start = start_of(&query)?;
        let build_args: BTreeMap<String, String> = match query.build_args.as_deref() {
            None => BTreeMap::new(),
            Some(text) => serde_json::from_str(text)
                .map_err(|e| ServiceError::invalid("build_args", format!("a JSON object of strings: {e}")))?,
        };
        let network: Option<NetworkPolicy> =
            query
                .network
                .as_deref()
                .map(serde_json::from_str)
                .transpose()
                .map_err(|e| ServiceError::invalid("network", format!("not a network policy: {e}")))?;
        let pull_dir = self.pull_dir()?;
        // Removed when the build ends (or at the next start, after a crash).
        let dir = RemovedDir(pull_dir.join(format!("context-{:016x}", rand::random::<u64>())));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir.0)
            .map_err(|e| ServiceError::internal("create a context directory", &e))?;
        let stored = dir.0.join("context.tar");
        let max_bytes = self.inner.config.images.pull.max_total_bytes;
        let mut reader = SyncIoBridge::new(StreamReader::new(body));
        let context = tokio::task::spawn_blocking(move || Context::receive(&mut reader, &stored, max_bytes))
            .await
            .map_err(|e| ServiceError::internal("read a build context", &e))?
            .map_err(|e| match e {
                ContextError::TooLarge { .. } => ServiceError::new(ErrorCode::ImageTooLarge, e.to_string()),
                ContextError::Invalid(_) => ServiceError::invalid("context", e.to_string()),
                ContextError::Io(io) => ServiceError::internal("store a build context", &io),
            })?;
        let max = paddock_types::recipe::MAX_RECIPE_BYTES as u64;
        let (path, text) = match query.recipe.as_deref() {
            Some(path) => (path, context.read_file(path, max)),
            None => match context.read_file("Dockerfile", max) {
                Ok(None) => ("Recipe", context.read_file("Recipe", max)),
                other => ("Dockerfile", other),
            },
        };
        let text = text
            .map_err(|e| ServiceError::invalid("recipe", e))?
            .ok_or_else(|| {
                ServiceError::invalid("recipe", format!("the build context has no file {path}"))
            })?;
        let text = String::from_utf8(text)
            .map_err(|_| ServiceError::invalid("recipe", format!("{path} is not UTF-8 text")))?;
        let recipe = paddock_types::recipe::parse_recipe(&text, &build_args)
            .map_err(|e| ServiceError::invalid("recipe", e.to_string()))?;
        let source_text = format!("{} with a build context", recipe_source(&text, &recipe));
        // (Unpacking an archive an `ADD` names reads files: off the async workers.)
        let context = Arc::new(context);
        let plan = tokio::task::spawn_blocking(move || RecipePlan::new(recipe, Some(context)))
            .await
            .map_err(|e| ServiceError::internal("plan a recipe", &e))??;
        let wanted = Wanted {
            name,
            source_text,
            network,
            start,
        };
        let built = self
            .build_from(p, wanted, Source::Recipe(Box::new(plan)), events, false)
            .await;
        drop(dir);
        built
    }

    /// Reads `upload` into the image layout `dest`, then builds template `id` from it.
    pub(super) async fn receive_and_build(
        &self,
        id: &TemplateId,
        upload: Upload,
        dest: &std::path::Path,
        room: BuildRoom,
        events: &mpsc::Sender<TemplateBuildEvent>,
    ) -> Result<TemplateBuilt, ServiceError> {
        let limits = ArchiveLimits {
            max_bytes: self.inner.config.images.pull.max_total_bytes,
            max_members: MAX_ARCHIVE_MEMBERS,
        };
        let Upload { body, kind, image } = upload;
        let mut reader = SyncIoBridge::new(StreamReader::new(body));
        let layout = dest.to_owned();
        let read = tokio::task::spawn_blocking(move || match kind {
            ArchiveKind::Image => {
                paddock_registry::read_image_archive(&mut reader, &layout, image.as_deref(), &limits)
            }
            ArchiveKind::Rootfs => paddock_registry::read_rootfs_archive(&mut reader, &layout, &limits),
        })
        .await
        .map_err(|e| ServiceError::internal("read an archive", &e))?
        .map_err(registry_error)?;
        paddock_runtime::fault::point("template.received");
        let format = match read.format {
            ArchiveFormat::Oci => "oci",
            ArchiveFormat::Docker => "docker",
            ArchiveFormat::Rootfs => "rootfs",
        };
        let _ = events
            .send(TemplateBuildEvent::Received {
                format: format.to_owned(),
                bytes: read.bytes,
            })
            .await;
        self.build_layout(id, dest, read.reference, room, events).await
    }
}

/// The query's start command.
fn start_of(query: &ImportTemplateQuery) -> Result<Option<TemplateStart>, ServiceError> {
    query
        .start
        .as_deref()
        .map(serde_json::from_str::<TemplateStart>)
        .transpose()
        .map_err(|e| ServiceError::invalid("start", format!("not a start command: {e}")))
}

/// A directory of the server's, removed with everything in it when dropped.
struct RemovedDir(std::path::PathBuf);

impl Drop for RemovedDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.0.display(), error = %e, "build context not removed");
            }
        }
    }
}
