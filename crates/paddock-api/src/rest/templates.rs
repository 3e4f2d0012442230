//! Templates: the server's configured ones and those built from images for the caller's tenant.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use paddock_control::SandboxService;
use paddock_types::api::{
    BuildTemplateRequest, ImportTemplateQuery, TemplateBuildEvent, TemplateInfo, TemplateList,
};
use tokio::sync::mpsc;

use crate::negotiate::{negotiate, StreamFormat};
use crate::rest::files::body_stream;
use crate::stream::{event_stream_response, EventSource, StreamEvent};
use crate::{ApiError, ApiJson, ApiPath, ApiQuery, Auth};

/// The templates sandboxes can be created from: the server's, then the caller's built ones.
#[utoipa::path(
    get,
    path = "/v1/templates",
    tag = "templates",
    responses(
        (status = 200, description = "The templates", body = TemplateList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_templates(
    Auth(p): Auth,
    State(service): State<SandboxService>,
) -> Result<Json<TemplateList>, ApiError> {
    Ok(Json(service.list_templates(&p).await?))
}

/// Builds a template from a registry image.
///
/// The image is pulled (the server's `[registry]` settings apply), its layers unpacked safely into
/// a read-only template (layers already cached for another template are reused), and its config's
/// `Env`, `WorkingDir` and `User` become the defaults of sandboxes made from it. With
/// `Accept: application/x-ndjson` (the default) or `text/event-stream`, the build's steps stream
/// as they happen and the last event is `done` (with the template) or `error`; with
/// `Accept: application/json` the answer is the template once built. An invalid request is
/// refused before anything streams. The build goes on if the client goes away.
#[utoipa::path(
    post,
    path = "/v1/templates",
    tag = "templates",
    request_body = BuildTemplateRequest,
    responses(
        (status = 200, description = "The build's steps", content(
            (TemplateBuildEvent = "application/x-ndjson"),
            (TemplateBuildEvent = "text/event-stream"),
        )),
        (status = 201, description = "The template, built", body = TemplateInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn build_template(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    headers: HeaderMap,
    ApiJson(req): ApiJson<BuildTemplateRequest>,
) -> Result<Response, ApiError> {
    let (tx, rx) = mpsc::channel(64);
    let build = tokio::spawn(async move { service.build_template(&p, req, tx).await });
    answer_build(&headers, build, rx).await
}

/// Builds a template from an archive, the request's body (plain or gzip-compressed tar).
///
/// With `format=image` (the default): a `docker save` archive, or an OCI image layout archive (as
/// `skopeo copy ... oci-archive:FILE` writes); `image` picks one of several by tag. With
/// `format=rootfs`: a tar of a root file system, built as a one-layer image with no process
/// defaults. The archive is hostile input: read bounded (the server's `[registry] max_image`),
/// nothing of it is created under its own names, blobs must match their digests; then its layers
/// are applied as a pulled image's are. With `format=context`: a recipe's build context (the
/// recipe, `recipe` names it, and the files its `COPY` and `ADD` take). Answered as
/// `POST /v1/templates` (a `received` event first when streamed). A refused archive leaves
/// nothing.
#[utoipa::path(
    post,
    path = "/v1/templates/import",
    tag = "templates",
    params(ImportTemplateQuery),
    request_body(description = "A tar archive", content(("application/x-tar"))),
    responses(
        (status = 200, description = "The build's steps", content(
            (TemplateBuildEvent = "application/x-ndjson"),
            (TemplateBuildEvent = "text/event-stream"),
        )),
        (status = 201, description = "The template, built", body = TemplateInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn import_template(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<ImportTemplateQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let (tx, rx) = mpsc::channel(64);
    let body = body_stream(body);
    let build = tokio::spawn(async move { service.import_template(&p, q, body, tx).await });
    answer_build(&headers, build, rx).await
}

/// A build's answer, as the request's `Accept` asks: its events as they come (NDJSON, SSE), or
/// the template once built (JSON).
async fn answer_build(
    headers: &HeaderMap,
    build: tokio::task::JoinHandle<Result<TemplateInfo, paddock_control::ServiceError>>,
    mut rx: mpsc::Receiver<TemplateBuildEvent>,
) -> Result<Response, ApiError> {
    let format = negotiate(
        headers,
        &[StreamFormat::Ndjson, StreamFormat::Sse, StreamFormat::Json],
    );
    // Nothing is sent before the request is accepted: a build that ends without an event was
    // refused.
    let first = rx.recv().await;
    let Some(first) = first.filter(|_| format != StreamFormat::Json) else {
        drop(rx);
        return match build.await {
            Ok(Ok(info)) => Ok((StatusCode::CREATED, Json(info)).into_response()),
            Ok(Err(e)) => Err(e.into()),
            Err(e) => Err(paddock_control::ServiceError::internal("build a template", &e).into()),
        };
    };
    Ok(event_stream_response(
        BuildEvents {
            first: Some(first),
            rx,
        },
        format,
    ))
}

/// One template, by id or name.
#[utoipa::path(
    get,
    path = "/v1/templates/{template}",
    tag = "templates",
    params(("template" = String, Path, description = "Template name or id")),
    responses(
        (status = 200, description = "The template", body = TemplateInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_template(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(template): ApiPath<String>,
) -> Result<Json<TemplateInfo>, ApiError> {
    Ok(Json(service.get_template(&p, &template).await?))
}

/// Deletes a built template and frees its storage. Refused with `template_in_use` (409) while a
/// sandbox made from it runs or is stopped; the server's configured templates cannot be deleted.
#[utoipa::path(
    delete,
    path = "/v1/templates/{template}",
    tag = "templates",
    params(("template" = String, Path, description = "Template name or id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn delete_template(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(template): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    service.delete_template(&p, &template).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A build's events: the one already received, then the channel's.
struct BuildEvents {
    first: Option<TemplateBuildEvent>,
    rx: mpsc::Receiver<TemplateBuildEvent>,
}

impl EventSource for BuildEvents {
    type Event = TemplateBuildEvent;

    // Cancel-safe: `recv` is, and the first event is taken without an await.
    async fn next_event(&mut self) -> Option<TemplateBuildEvent> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        self.rx.recv().await
    }
}

impl StreamEvent for TemplateBuildEvent {
    fn sse_name(&self) -> &'static str {
        match self {
            Self::Pulling { .. } => "pulling",
            Self::Received { .. } => "received",
            Self::Pulled { .. } => "pulled",
            Self::Step { .. } => "step",
            Self::Log { .. } => "log",
            Self::Layer { .. } => "layer",
            Self::Done { .. } => "done",
            Self::Error { .. } => "error",
        }
    }

    fn is_last(&self) -> bool {
        matches!(self, Self::Done { .. } | Self::Error { .. })
    }
}
