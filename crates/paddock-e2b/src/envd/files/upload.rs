//! `POST /files`: one file from a raw body (`application/octet-stream` with `?path=`), or one per
//! `file` part of a `multipart/form-data` body (each named by its `filename`, unless `?path=` names
//! the one file), optionally `Content-Encoding: gzip`. Each is streamed into the service's write,
//! which makes the missing parent directories and gives new files and directories to the user.
//!
//! Files are written in the order they come, so an upload refused at its third part has written
//! the first two (as envd's); a part refused for its headers (too large, no name, a bad or
//! repeated path) is refused before its file is opened, and the service's write replaces a file only
//! once its first megabyte has arrived, so a body that breaks off before that leaves the old file
//! as it was (the missing parent directories are made first, and stay).

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt as _;
use paddock_control::{ByteStream, ServiceError, WriteFileOptions};
use paddock_types::api::ErrorCode;
use serde::Serialize;

use super::disposition::FileName;
use super::encoding::{content_coding, gzip_decode, Coding};
use super::multipart::{MultipartError, Parts};
use super::paths::{base_name, home_of, resolve};
use super::{authorize, FilesCaller, FilesError, FilesQuery};
use crate::envd::SandboxOnly;
use crate::tokens::FileOperation;
use crate::E2bState;

/// What the answer says of each file written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WrittenEntry {
    /// Its absolute path.
    pub path: String,
    /// Its name.
    pub name: String,
    /// Always `file`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// `POST /files?path=&username=[&signature=&signature_expiration=]`.
pub async fn upload_files(
    State(state): State<E2bState>,
    sandbox: SandboxOnly,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match upload(&state, sandbox, query.as_deref(), &headers, body).await {
        Ok(written) => Json(written).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn upload(
    state: &E2bState,
    sandbox: SandboxOnly,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Vec<WrittenEntry>, FilesError> {
    let query = FilesQuery::parse(query)?;
    let caller = authorize(state, sandbox, headers, &query, FileOperation::Write).await?;
    if headers.keys().any(|k| k.as_str().starts_with("x-metadata-")) {
        return Err(FilesError::BadRequest(
            "file metadata (X-Metadata-* headers) is not supported by this server".into(),
        ));
    }
    let encoding = header_text(headers, header::CONTENT_ENCODING);
    let coding = content_coding(encoding.as_deref()).map_err(|e| {
        FilesError::BadRequest(format!(
            "error decompressing request body: unsupported Content-Encoding: {}, supported: [gzip]",
            e.0
        ))
    })?;
    let mut body: ByteStream = Box::pin(
        body.into_data_stream()
            .map(|chunk| chunk.map_err(std::io::Error::other)),
    );
    if coding == Coding::Gzip {
        body = gzip_decode(body);
    }
    let content_type = header_text(headers, header::CONTENT_TYPE).unwrap_or_default();
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let home = home_of(&caller.user);
    if media == "application/octet-stream" {
        let Some(target) = &query.path else {
            return Err(FilesError::BadRequest(
                "path query parameter is required for raw body upload".into(),
            ));
        };
        let path = resolve(target, &home).map_err(|e| FilesError::BadRequest(e.to_string()))?;
        let entry = write_one(state, &caller, &path, body)
            .await
            .map_err(|e| FilesError::from_service(e, &caller.id, &path))?;
        return Ok(vec![entry]);
    }
    if media.starts_with("multipart/") {
        return upload_parts(state, &caller, &query, &home, body, &content_type).await;
    }
    Err(FilesError::BadRequest(format!(
        "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
    )))
}

async fn upload_parts(
    state: &E2bState,
    caller: &FilesCaller,
    query: &FilesQuery,
    home: &str,
    body: ByteStream,
    content_type: &str,
) -> Result<Vec<WrittenEntry>, FilesError> {
    let mut parts = Parts::new(body, content_type).map_err(refused)?;
    let mut written: Vec<WrittenEntry> = Vec::new();
    while let Some(part) = parts.next().await.map_err(refused)? {
        if part.name() != Some("file") {
            // envd ignores other fields.
            part.skip().await.map_err(refused)?;
            continue;
        }
        let target = match (&query.path, part.file_name()) {
            (Some(path), _) => path.clone(),
            (None, Some(FileName::Text(name))) => name.clone(),
            (None, Some(FileName::NotUtf8)) => {
                return Err(FilesError::BadRequest("a part's filename is not UTF-8".into()))
            }
            (None, None) => {
                return Err(FilesError::BadRequest(
                    "a file part has no filename to take its path from".into(),
                ))
            }
        };
        let path = resolve(&target, home).map_err(|e| FilesError::BadRequest(e.to_string()))?;
        if written.iter().any(|w| w.path == path) {
            return Err(FilesError::BadRequest(duplicate_message(&path, &written)));
        }
        match write_one(state, caller, &path, part.into_stream()).await {
            Ok(entry) => written.push(entry),
            Err(e) => {
                // When the body broke off or was malformed, say how rather than that reading it
                // failed.
                let failure = (e.code == ErrorCode::InvalidRequest).then(|| parts.failure());
                return Err(match failure.flatten() {
                    Some(failure) => refused(failure),
                    None => FilesError::from_service(e, &caller.id, &path),
                });
            }
        }
    }
    Ok(written)
}

/// envd's words for a path named twice in one upload.
fn duplicate_message(path: &str, written: &[WrittenEntry]) -> String {
    let mut message = format!(
        "you cannot upload multiple files to the same path '{path}' in one upload request, \
         only the first specified file was uploaded"
    );
    let others: Vec<&str> = written
        .iter()
        .map(|w| w.path.as_str())
        .filter(|p| *p != path)
        .collect();
    if others.len() > 1 {
        message.push_str(&format!(
            ", also the following files were uploaded: {}",
            others.join(", ")
        ));
    }
    message
}

fn refused(e: MultipartError) -> FilesError {
    FilesError::BadRequest(e.to_string())
}

async fn write_one(
    state: &E2bState,
    caller: &FilesCaller,
    path: &str,
    body: ByteStream,
) -> Result<WrittenEntry, ServiceError> {
    let options = WriteFileOptions {
        mode: None,
        user: Some(caller.user.clone()),
        parents: true,
        approval_id: None,
    };
    state
        .service
        .write_file(&caller.principal, &caller.id, path, options, body)
        .await?;
    Ok(WrittenEntry {
        path: path.to_owned(),
        name: base_name(path).to_owned(),
        kind: "file",
    })
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}
