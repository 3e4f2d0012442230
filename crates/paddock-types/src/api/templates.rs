//! Templates: what sandboxes start from. The server's configured ones (`[templates.NAME]`) and
//! those built from images through `/v1/templates`, per tenant.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ImageConfig;

/// `GET /v1/templates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplateList {
    /// Template names usable in `CreateSandboxRequest.template`: the server's, then the caller's
    /// built ones, by name.
    pub templates: Vec<TemplateInfo>,
}

/// A template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplateInfo {
    /// Its name.
    pub name: String,
    /// Pre-started sandboxes kept ready for it (0 = none: creation boots one).
    pub warm_pool_size: u32,
    /// A built template's id (`tp-` and 16 hex digits); absent for the server's configured ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// What it was built from, as given (an image reference); absent for configured ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The digest of the image manifest it was built from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Its layers, bottom first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<TemplateLayer>,
    /// Bytes of its layers as stored in the registry (compressed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// What it is charged against its tenant's storage quota: the bytes of the pool its files
    /// hold (while it is built: the most its build may write).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_bytes: Option<u64>,
    /// The image's process defaults, which sandboxes made from it start with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub config: Option<ImageConfig>,
    /// When it was built (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// What sandboxes made from it start at boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<TemplateStart>,
}

/// A layer of a built template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TemplateLayer {
    /// Its blob's digest.
    pub digest: String,
    /// Its blob's size.
    pub size: u64,
}

/// `POST /v1/templates/import`: build a template from an archive uploaded as the request's body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ImportTemplateQuery {
    /// Its name (as `BuildTemplateRequest.name`).
    pub name: String,
    /// What the body is: `image` (the default: a `docker save` archive, or an OCI image layout
    /// archive as `skopeo copy ... oci-archive:` writes), `rootfs` (a tar of a root file system,
    /// built as a one-layer image) or `context` (a recipe's build context: the files its `COPY`
    /// and `ADD` take, and the recipe itself). Plain or gzip-compressed.
    #[serde(default)]
    pub format: Option<String>,
    /// `context`: the recipe's path inside the context (default `Dockerfile`, else `Recipe`).
    #[serde(default)]
    pub recipe: Option<String>,
    /// `context`: the recipe's build arguments, as a JSON object of strings (URL-encoded).
    #[serde(default)]
    pub build_args: Option<String>,
    /// `context`: the network of the recipe's `RUN` steps, as a JSON `NetworkPolicy`.
    #[serde(default)]
    pub network: Option<String>,
    /// Which image of an archive holding several: a docker tag (`app:v1`) or an OCI
    /// `org.opencontainers.image.ref.name`.
    #[serde(default)]
    pub image: Option<String>,
    /// A start command, as `BuildTemplateRequest.start`, as JSON (URL-encoded).
    #[serde(default)]
    pub start: Option<String>,
}

/// `POST /v1/templates`: build a template from an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildTemplateRequest {
    /// Its name (1-63 characters of a-z, 0-9, `-`, `_` and `.`, starting with a letter or digit),
    /// unique among the caller's templates and different from the server's.
    pub name: String,
    /// The image: a registry reference as docker reads it (`python:3.12-slim`,
    /// `registry.example:5000/team/img@sha256:...`). The server's registry settings
    /// (`[registry]`: credentials, CA, plain-HTTP loopback registries) apply. Exactly one of
    /// `from` and `recipe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// A recipe: a Dockerfile subset (`FROM` an image, then `RUN`, `ENV`, `WORKDIR`, `USER`,
    /// `ARG`, `LABEL`, `EXPOSE`, `CMD`, `ENTRYPOINT`). Each `RUN` runs in a sandbox of the
    /// template so far, as its `USER` (root by default), and its result is kept: a rebuild whose
    /// first steps are unchanged reuses them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<String>,
    /// Values of the recipe's `ARG`s.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub build_args: std::collections::BTreeMap<String, String>,
    /// The network of the sandboxes that run the recipe's steps (as a sandbox's `network`:
    /// e.g. `{"allow": ["pypi.org"]}`); absent: loopback only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub network: Option<crate::NetworkPolicy>,
    /// A command every sandbox made from it starts when it boots (a create, a fork, a resume, a
    /// warm pool's boot), and what says it is ready; absent: nothing starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<TemplateStart>,
}

/// The start command of a template.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateStart {
    /// The program and its arguments; absent: the image's `Entrypoint` followed by its `Cmd`.
    /// It runs as the sandbox's user, in its working directory, with its environment, in the
    /// background (tag `start`: `GET /v1/sandboxes/{id}/processes` lists it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// What says it is ready; absent: a sandbox is handed out as soon as the command started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<ReadyCheck>,
}

/// A readiness check: a port accepting connections, or a command exiting 0. A sandbox is handed
/// out once it passes; a sandbox whose check does not pass within `timeout_secs` is removed and
/// its create fails with `timeout`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadyCheck {
    /// A TCP port inside the sandbox (any of its addresses) that accepts a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// A command (run like the start command, each try bounded by the time left) that exits 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// How long it may take, from the start command's start (default 30, at most 600).
    #[serde(default = "default_ready_timeout")]
    pub timeout_secs: u64,
}

fn default_ready_timeout() -> u64 {
    30
}

/// A step of a build, streamed (`application/x-ndjson` or SSE) while it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum TemplateBuildEvent {
    /// The image is being fetched from its registry.
    Pulling {
        /// The reference, fully written.
        reference: String,
    },
    /// An uploaded archive is read: what it held (`image` for docker and OCI archives, or `rootfs`)
    /// and its bytes.
    Received {
        /// `docker`, `oci` or `rootfs`.
        format: String,
        /// Bytes of the archive.
        bytes: u64,
    },
    /// The image is fetched: its manifest's digest and how many layers it has.
    Pulled {
        /// `sha256:...`
        digest: String,
        /// Layers to apply.
        layers: usize,
        /// Bytes fetched (config and layers; layers whose trees are cached are not fetched).
        bytes: u64,
    },
    /// A recipe's step begins (`cached`: its result was kept by an earlier build; nothing runs).
    Step {
        /// Its position, from 0 (the `FROM`).
        index: usize,
        /// Steps in all.
        of: usize,
        /// The instruction, as written.
        instruction: String,
        /// Whether its result comes from the cache.
        cached: bool,
    },
    /// Output of a recipe's `RUN` step (UTF-8, lossy; bounded per step).
    Log {
        /// The step's position.
        step: usize,
        /// `stdout` or `stderr`.
        stream: String,
        /// The text.
        text: String,
    },
    /// A layer is in place.
    Layer {
        /// Its position, from 0 (the bottom).
        index: usize,
        /// Layers in all.
        of: usize,
        /// Its blob's digest.
        digest: String,
        /// Its blob's size.
        size: u64,
        /// Whether the layer cache had it.
        cached: bool,
    },
    /// The template is ready (the last event).
    Done {
        /// The template.
        template: Box<TemplateInfo>,
    },
    /// The build failed and left nothing (the last event).
    Error {
        /// A stable error code, as in error responses.
        code: super::ErrorCode,
        /// What went wrong.
        message: String,
    },
}
