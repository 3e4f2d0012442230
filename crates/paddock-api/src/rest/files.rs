//! Files inside a sandbox: download and upload (streamed both ways), list, stat, mkdir, rename,
//! remove, tar archives, and watching a directory.

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt as _;
use paddock_control::{ByteStream, SandboxService, WriteFileOptions};
use paddock_types::api::{FileEntry, FileList, MkdirRequest, RenameRequest, WatchEvent, WrittenFile};
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;

use crate::negotiate::{negotiate, StreamFormat};
use crate::stream::event_stream_response;
use crate::{ApiError, ApiJson, ApiQuery, Auth, SandboxPath};

/// `?path=` of the file endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FilePathQuery {
    /// Absolute path inside the sandbox.
    pub path: String,
}

/// `PUT .../files` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WriteFileQuery {
    /// Absolute path inside the sandbox; the file is created or replaced.
    pub path: String,
    /// Permission bits in octal (`644`, `0755`) if the file is created (default 644).
    #[serde(default)]
    pub mode: Option<String>,
    /// Owner if the file is created (the sandbox's default user when absent).
    #[serde(default)]
    pub user: Option<String>,
    /// The approval the write runs under, when the sandbox's approval policy asks (the id an
    /// `approval_pending` answer named, once approved).
    #[serde(default)]
    pub approval_id: Option<String>,
}

/// `DELETE .../files` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RemoveFileQuery {
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Remove a non-empty directory with everything in it.
    #[serde(default)]
    pub recursive: bool,
    /// The approval the removal runs under, when the sandbox's approval policy asks.
    #[serde(default)]
    pub approval_id: Option<String>,
}

/// `PUT .../files/tar` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UploadTarQuery {
    /// Absolute path of the directory to unpack into (made if missing).
    pub path: String,
    /// The approval the upload runs under, when the sandbox's approval policy asks.
    #[serde(default)]
    pub approval_id: Option<String>,
}

/// `GET .../files/watch` query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// Absolute path of the directory inside the sandbox.
    pub path: String,
    /// Watch subdirectories too.
    #[serde(default)]
    pub recursive: bool,
}

/// Parses permission bits written in octal: `644`, `0644`, `0o644`.
fn parse_mode(text: &str) -> Result<u32, ApiError> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    let refuse = || {
        ApiError::invalid(
            Some("mode".to_owned()),
            format!("mode must be octal permission bits such as 644 or 0755, not `{text}`"),
        )
    };
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return Err(refuse());
    }
    let mode = u32::from_str_radix(digits, 8).map_err(|_| refuse())?;
    if mode > 0o7777 {
        return Err(refuse());
    }
    Ok(mode)
}

/// A request body as the service's byte stream.
pub(crate) fn body_stream(body: Body) -> ByteStream {
    Box::pin(
        body.into_data_stream()
            .map(|chunk| chunk.map_err(std::io::Error::other)),
    )
}

/// A streamed download.
pub(crate) fn download(content_type: &'static str, length: Option<u64>, stream: ByteStream) -> Response {
    let mut response = (
        [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
        Body::from_stream(stream),
    )
        .into_response();
    if let Some(length) = length {
        // If the file shrinks or grows while it is read, hyper cuts the connection rather than send a
        // body that disagrees with this header: the client sees a truncated download, not a wrong one.
        response
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    response
}

/// Downloads a file (streamed; `Content-Length` is its size when the download started, when known).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FilePathQuery),
    responses(
        (status = 200, description = "The file's bytes", content(("application/octet-stream"))),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn read_file(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<FilePathQuery>,
) -> Result<Response, ApiError> {
    let file = service.read_file(&p, &id, &q.path).await?;
    Ok(download("application/octet-stream", file.size, file.stream))
}

/// Writes (creates or replaces) a file.
///
/// The raw request body is streamed into the file, with no size limit but the sandbox's disk limit.
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), WriteFileQuery),
    request_body(description = "The file's new contents", content(("application/octet-stream"))),
    responses(
        (status = 200, description = "Written", body = WrittenFile),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn write_file(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<WriteFileQuery>,
    body: Body,
) -> Result<Json<WrittenFile>, ApiError> {
    let options = WriteFileOptions {
        mode: q.mode.as_deref().map(parse_mode).transpose()?,
        user: q.user,
        parents: false,
        approval_id: q.approval_id,
    };
    let written = service
        .write_file(&p, &id, &q.path, options, body_stream(body))
        .await?;
    Ok(Json(written))
}

/// Removes a file, or a directory (`recursive=true` for a non-empty one).
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/files",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), RemoveFileQuery),
    responses(
        (status = 204, description = "Removed"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn remove_file(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<RemoveFileQuery>,
) -> Result<StatusCode, ApiError> {
    service
        .remove_file(&p, &id, &q.path, q.recursive, q.approval_id.as_deref())
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists a directory.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/list",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FilePathQuery),
    responses(
        (status = 200, description = "The entries", body = FileList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_dir(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<FilePathQuery>,
) -> Result<Json<FileList>, ApiError> {
    Ok(Json(service.list_dir(&p, &id, &q.path).await?))
}

/// Metadata of one path (symlinks are not followed).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/stat",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FilePathQuery),
    responses(
        (status = 200, description = "The entry", body = FileEntry),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn stat_file(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<FilePathQuery>,
) -> Result<Json<FileEntry>, ApiError> {
    Ok(Json(service.stat_file(&p, &id, &q.path).await?))
}

/// Creates a directory.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/files/mkdir",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = MkdirRequest,
    responses(
        (status = 201, description = "Created", body = FileEntry),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn make_dir(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<MkdirRequest>,
) -> Result<(StatusCode, Json<FileEntry>), ApiError> {
    let entry = service.make_dir(&p, &id, req).await?;
    Ok((StatusCode::CREATED, Json(entry)))
}

/// Renames (moves) a path.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/files/rename",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = RenameRequest,
    responses(
        (status = 200, description = "The entry at its new path", body = FileEntry),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn rename_file(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<RenameRequest>,
) -> Result<Json<FileEntry>, ApiError> {
    Ok(Json(service.rename_file(&p, &id, req).await?))
}

/// Downloads a directory as a tar archive (streamed).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/tar",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), FilePathQuery),
    responses(
        (status = 200, description = "The archive", content(("application/x-tar"))),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn download_tar(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<FilePathQuery>,
) -> Result<Response, ApiError> {
    let stream = service.download_tar(&p, &id, &q.path).await?;
    Ok(download("application/x-tar", None, stream))
}

/// Unpacks a tar archive (the raw request body, streamed) into a directory, created if missing.
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/files/tar",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), UploadTarQuery),
    request_body(description = "A tar archive", content(("application/x-tar"))),
    responses(
        (status = 204, description = "Unpacked"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn upload_tar(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<UploadTarQuery>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    service
        .upload_tar(&p, &id, &q.path, q.approval_id.as_deref(), body_stream(body))
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Watches a directory.
///
/// Streams the changes under it (NDJSON, or SSE for `Accept: text/event-stream`) until the directory
/// or the sandbox goes away, or the client disconnects.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/watch",
    tag = "files",
    params(("id" = String, Path, description = "Sandbox id"), WatchQuery),
    responses(
        (status = 200, description = "The changes, as they happen", content(
            (WatchEvent = "application/x-ndjson"),
            (WatchEvent = "text/event-stream"),
        )),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn watch_dir(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiQuery(q): ApiQuery<WatchQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let format = negotiate(&headers, &[StreamFormat::Ndjson, StreamFormat::Sse]);
    let stream = service.watch_dir(&p, &id, &q.path, q.recursive).await?;
    Ok(event_stream_response(stream, format))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("644").expect("ok"), 0o644);
        assert_eq!(parse_mode("0755").expect("ok"), 0o755);
        assert_eq!(parse_mode("0o600").expect("ok"), 0o600);
        assert_eq!(parse_mode("4755").expect("ok"), 0o4755);
        assert_eq!(parse_mode("0").expect("ok"), 0);
        for bad in ["", "8", "0x1ff", "-644", "rw-r--r--", "17777", "0o", "644 "] {
            let e = parse_mode(bad).expect_err(bad);
            assert_eq!(e.body().field.as_deref(), Some("mode"));
        }
    }

    #[test]
    fn file_queries() {
        let q: WriteFileQuery =
            crate::extract::parse_query("path=%2Fhome%2Fuser%2Fa.txt&mode=600").expect("parses");
        assert_eq!(q.path, "/home/user/a.txt");
        assert_eq!(q.mode.as_deref(), Some("600"));
        let e = crate::extract::parse_query::<FilePathQuery>("").expect_err("path is required");
        assert_eq!(e.body().field.as_deref(), Some("path"));
        let q: RemoveFileQuery = crate::extract::parse_query("path=/tmp/x&recursive=true").expect("parses");
        assert!(q.recursive);
        let e = crate::extract::parse_query::<RemoveFileQuery>("path=/x&recursive=yes").expect_err("bool");
        assert_eq!(e.body().field.as_deref(), Some("recursive"));
    }
}
