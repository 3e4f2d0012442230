//! `GET /files`: a file's bytes, streamed from the sandbox as they are read (never the whole file
//! in memory), gzip-compressed when the client accepts it.

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::encoding::{accepted_coding, gzip_encode, Coding};
use super::paths::{base_name, home_of, resolve};
use super::{authorize, FilesError, FilesQuery};
use crate::envd::SandboxOnly;
use crate::tokens::FileOperation;
use crate::E2bState;

/// `GET /files?path=&username=[&signature=&signature_expiration=]`.
pub async fn download_file(
    State(state): State<E2bState>,
    sandbox: SandboxOnly,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    match download(&state, sandbox, query.as_deref(), &headers).await {
        Ok(resp) => resp,
        Err(e) => e.into_response(),
    }
}

async fn download(
    state: &E2bState,
    sandbox: SandboxOnly,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<Response, FilesError> {
    let query = FilesQuery::parse(query)?;
    let caller = authorize(state, sandbox, headers, &query, FileOperation::Read).await?;
    let path = resolve(query.path.as_deref().unwrap_or_default(), &home_of(&caller.user))
        .map_err(|e| FilesError::BadRequest(e.to_string()))?;
    let accept = joined(headers, header::ACCEPT_ENCODING);
    let coding = accepted_coding(accept.as_deref()).map_err(|_| FilesError::NotAcceptable)?;
    let file = state
        .service
        .read_file(&caller.principal, &caller.id, &path)
        .await
        .map_err(|e| FilesError::from_service(e, &caller.id, &path))?;
    let (body, length) = match coding {
        Coding::Identity => (file.stream, file.size),
        Coding::Gzip => (gzip_encode(file.stream), None),
    };
    let mut resp = (StatusCode::OK, Body::from_stream(body)).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(content_type(&path)),
    );
    h.insert(header::CONTENT_DISPOSITION, content_disposition(base_name(&path)));
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    if coding == Coding::Gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    if let Some(length) = length {
        // If the file changes size while it is read, hyper cuts the connection rather than send a
        // body that disagrees with this header: a truncated download, never a wrong one.
        h.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    Ok(resp)
}

/// Every line of a header, joined with commas (a list header may be split over lines).
fn joined(headers: &HeaderMap, name: header::HeaderName) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// The type of a file by its extension (Go's `mime.TypeByExtension` table for the common ones),
/// else `application/octet-stream`.
fn content_type(path: &str) -> &'static str {
    let name = base_name(path);
    let ext = match name.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => ext.to_ascii_lowercase(),
        _ => return "application/octet-stream",
    };
    match ext.as_str() {
        "txt" | "log" | "md" => "text/plain; charset=utf-8",
        "html" | "htm" => "text/html; charset=utf-8",
        "css" => "text/css; charset=utf-8",
        "csv" => "text/csv; charset=utf-8",
        "js" | "mjs" => "text/javascript; charset=utf-8",
        "json" => "application/json",
        "xml" => "text/xml; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "wasm" => "application/wasm",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        _ => "application/octet-stream",
    }
}

/// `inline; filename="<name>"`, with RFC 6266's `filename*` when the name is not plain ASCII.
fn content_disposition(name: &str) -> HeaderValue {
    let plain = name
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
    let text = if plain {
        format!("inline; filename=\"{name}\"")
    } else {
        let ascii: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() && c != '"' && c != '\\' || c == ' ' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let encoded: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        format!("inline; filename=\"{ascii}\"; filename*=UTF-8''{encoded}")
    };
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static("inline"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_and_dispositions() {
        assert_eq!(content_type("/home/user/a.TXT"), "text/plain; charset=utf-8");
        assert_eq!(content_type("/home/user/.bashrc"), "application/octet-stream");
        assert_eq!(content_type("/home/user/data"), "application/octet-stream");
        assert_eq!(content_type("/home/user/x.png"), "image/png");
        assert_eq!(
            content_disposition("a b.txt"),
            HeaderValue::from_static("inline; filename=\"a b.txt\"")
        );
        assert_eq!(
            content_disposition("é\"x"),
            HeaderValue::from_static("inline; filename=\"__x\"; filename*=UTF-8''%C3%A9%22x")
        );
    }
}
