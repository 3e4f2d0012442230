//! Extractors whose rejections are [`ApiError`]s: a JSON body (at most [`JSON_BODY_LIMIT`] bytes), a
//! query string and path parameters. Serde's error is turned into `invalid_request` with the field it
//! names (`limits.memory`, `argv[0]`, `after_seq`) and its message, which speaks of the request only.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use http_body_util::{BodyExt as _, LengthLimitError, Limited};
use paddock_control::ServiceError;
use paddock_types::api::ErrorCode;
use paddock_types::{SandboxId, SnapshotId};
use serde::de::DeserializeOwned;

use crate::ApiError;

/// The largest JSON request body accepted (413 `payload_too_large` beyond it). File and tar uploads
/// and process stdin are streams and have no such limit.
pub const JSON_BODY_LIMIT: usize = 1024 * 1024;

/// A JSON request body (`Content-Type: application/json`, at most [`JSON_BODY_LIMIT`] bytes).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let bytes = read_json_body(&parts.headers, body).await?;
        if bytes.is_empty() {
            return Err(ApiError::invalid(None, "a JSON request body is required"));
        }
        parse_json(&bytes).map(Self)
    }
}

/// A JSON request body that may be left out: an empty body (or `null`) is `T::default()`.
#[derive(Debug, Clone, Copy, Default)]
pub struct OptionalJson<T>(pub T);

impl<T: DeserializeOwned + Default, S: Send + Sync> FromRequest<S> for OptionalJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let bytes = read_json_body(&parts.headers, body).await?;
        if bytes.is_empty() {
            return Ok(Self(T::default()));
        }
        parse_json::<Option<T>>(&bytes).map(|v| Self(v.unwrap_or_default()))
    }
}

/// Reads a body of at most [`JSON_BODY_LIMIT`] bytes; a non-empty one must say it is JSON.
async fn read_json_body(headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("the JSON body is larger than {JSON_BODY_LIMIT} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > JSON_BODY_LIMIT as u64) {
        return Err(too_large());
    }
    let bytes = match Limited::new(body, JSON_BODY_LIMIT).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => return Err(too_large()),
        Err(_) => return Err(body_read_error()),
    };
    if !bytes.is_empty() && !is_json_content_type(headers) {
        return Err(ApiError::invalid(
            None,
            "expected `Content-Type: application/json`",
        ));
    }
    Ok(bytes)
}

/// The request body broke off or could not be decoded.
pub(crate) fn body_read_error() -> ApiError {
    ApiError::invalid(None, "failed to read the request body")
}

fn is_json_content_type(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    let Some((kind, subtype)) = essence.split_once('/') else {
        return false;
    };
    kind.eq_ignore_ascii_case("application")
        && (subtype.eq_ignore_ascii_case("json")
            || subtype.len() > 5 && subtype[subtype.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// Parses JSON text into `T`, naming the offending field on failure. Every body and message the
/// API reads is a JSON object (or `null` where it may be left out): anything else is refused here,
/// since serde would read a struct from an array (`[]` as a request with every field defaulted).
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Some(kind) = non_object_kind(bytes) {
        return Err(ApiError::invalid(
            None,
            format!("the request body must be a JSON object, not {kind}"),
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || inner.is_io() {
            return ApiError::invalid(None, format!("malformed JSON: {inner}"));
        }
        let message = inner.to_string();
        let field = field_of(&path, &message);
        ApiError::invalid(field, format!("invalid request body: {message}"))
    })?;
    de.end()
        .map_err(|e| ApiError::invalid(None, format!("malformed JSON: {e}")))?;
    Ok(value)
}

/// What a JSON text is when it is a value other than an object or `null` (judged by its first
/// byte: a malformed text is left to the parser, which says why).
fn non_object_kind(bytes: &[u8]) -> Option<&'static str> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace())?;
    match first {
        b'[' => Some("an array"),
        b'"' => Some("a string"),
        b'-' | b'0'..=b'9' => Some("a number"),
        b't' | b'f' if serde_json::from_slice::<bool>(bytes).is_ok() => Some("a boolean"),
        _ => None,
    }
}

/// The field a serde error is about: its path, completed with the name a `missing field` error gives
/// (serde reports those at the enclosing object), `None` at the top level.
fn field_of(path: &str, message: &str) -> Option<String> {
    let named = ["unknown field `", "missing field `", "duplicate field `"]
        .iter()
        .find_map(|prefix| message.strip_prefix(prefix))
        .and_then(|rest| rest.split_once('`'))
        .map(|(name, _)| name);
    let path = (path != "." && !path.is_empty()).then_some(path);
    match (path, named) {
        // serde_path_to_error has already stepped into an unknown key; not into a missing one.
        (Some(path), Some(name)) if path == name || path.ends_with(&format!(".{name}")) => {
            Some(path.to_owned())
        }
        (Some(path), Some(name)) => Some(format!("{path}.{name}")),
        (Some(path), None) => Some(path.to_owned()),
        (None, Some(name)) => Some(name.to_owned()),
        (None, None) => None,
    }
}

/// A query string (`?a=1&b=x`), refusing unknown parameters where `T` does.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parse_query(parts.uri.query().unwrap_or("")).map(Self)
    }
}

/// Parses a query string into `T`, naming the offending parameter on failure.
pub(crate) fn parse_query<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        let field = field_of(&path, &message);
        ApiError::invalid(field, format!("invalid query string: {message}"))
    })
}

/// Path parameters (`{id}`, `{pid}`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        use axum::extract::path::ErrorKind;
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(PathRejection::FailedToDeserializePathParams(e)) => {
                let field = match e.kind() {
                    ErrorKind::ParseErrorAtKey { key, .. }
                    | ErrorKind::InvalidUtf8InPathParam { key }
                    | ErrorKind::DeserializeError { key, .. } => Some(key.clone()),
                    _ => None,
                };
                Err(ApiError::invalid(field, e.body_text()))
            }
            Err(e) => {
                tracing::error!(error = %e.body_text(), "path parameters missing (route table bug)");
                Err(ApiError::new(
                    ErrorCode::Internal,
                    "internal error while routing the request",
                ))
            }
        }
    }
}

/// A sandbox id in the path (`{id}`), parsed once here: the control plane takes a [`SandboxId`]. A
/// malformed id answers `sandbox_not_found`, as a missing sandbox or another tenant's does, so an id's
/// shape tells a caller nothing the lookup would not.
#[derive(Debug, Clone)]
pub struct SandboxPath(pub SandboxId);

impl<S: Send + Sync> FromRequestParts<S> for SandboxPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath(raw) = ApiPath::<String>::from_request_parts(parts, state).await?;
        sandbox_id(&raw).map(Self)
    }
}

/// A process of a sandbox in the path (`{id}/processes/{pid}`): the id as in [`SandboxPath`]; a pid
/// that is not a number is refused naming `pid` first, as before ids were typed.
#[derive(Debug, Clone)]
pub struct ProcessPath(pub SandboxId, pub u32);

impl<S: Send + Sync> FromRequestParts<S> for ProcessPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath((raw, pid)) = ApiPath::<(String, u32)>::from_request_parts(parts, state).await?;
        Ok(Self(sandbox_id(&raw)?, pid))
    }
}

/// A code context of a sandbox in the path (`{id}/contexts/{context}`).
#[derive(Debug, Clone)]
pub struct ContextPath(pub SandboxId, pub String);

impl<S: Send + Sync> FromRequestParts<S> for ContextPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath((raw, context)) = ApiPath::<(String, String)>::from_request_parts(parts, state).await?;
        Ok(Self(sandbox_id(&raw)?, context))
    }
}

/// A snapshot id in the path (`{snapshot_id}`); a malformed one answers `snapshot_not_found`.
#[derive(Debug, Clone)]
pub struct SnapshotPath(pub SnapshotId);

impl<S: Send + Sync> FromRequestParts<S> for SnapshotPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath(raw) = ApiPath::<String>::from_request_parts(parts, state).await?;
        raw.parse()
            .map(Self)
            .map_err(|_| ServiceError::snapshot_not_found(&raw).into())
    }
}

pub(crate) fn sandbox_id(raw: &str) -> Result<SandboxId, ApiError> {
    raw.parse()
        .map_err(|_| ServiceError::sandbox_not_found(raw).into())
}

#[cfg(test)]
mod tests {
    use axum::http::Request as HttpRequest;
    use paddock_types::api::{AuditQuery, CreateSandboxRequest, ExecRequest, KillRequest, SetTimeoutRequest};

    use super::*;

    fn request(content_type: Option<&str>, body: &'static [u8]) -> Request {
        let mut builder = HttpRequest::builder().method("POST").uri("/");
        if let Some(ct) = content_type {
            builder = builder.header(header::CONTENT_TYPE, ct);
        }
        builder.body(Body::from(body)).expect("request")
    }

    async fn json<T: DeserializeOwned>(ct: Option<&str>, body: &'static [u8]) -> Result<T, ApiError> {
        ApiJson::<T>::from_request(request(ct, body), &())
            .await
            .map(|j| j.0)
    }

    fn invalid(e: ApiError) -> (Option<String>, String) {
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
        assert_eq!(e.status(), 400);
        (e.body().field.clone(), e.body().message.clone())
    }

    #[tokio::test]
    async fn accepts_json() {
        let req: SetTimeoutRequest = json(Some("application/json"), br#"{"timeout_secs": 60}"#)
            .await
            .expect("parses");
        assert_eq!(req.timeout_secs, 60);
        let req: SetTimeoutRequest = json(Some("Application/JSON; charset=utf-8"), br#"{"timeout_secs": 1}"#)
            .await
            .expect("parses");
        assert_eq!(req.timeout_secs, 1);
        let _: SetTimeoutRequest = json(Some("application/merge-patch+json"), br#"{"timeout_secs": 1}"#)
            .await
            .expect("a +json type is JSON");
    }

    #[tokio::test]
    async fn wrong_or_missing_content_type() {
        for ct in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
            Some("json"),
        ] {
            let e = json::<SetTimeoutRequest>(ct, br#"{"timeout_secs": 60}"#)
                .await
                .expect_err("refused");
            let (field, message) = invalid(e);
            assert_eq!(field, None);
            assert!(message.contains("Content-Type"), "{message}");
        }
    }

    #[tokio::test]
    async fn malformed_json_names_no_field() {
        for body in [
            &b"{"[..],
            b"{\"timeout_secs\": }",
            b"not json",
            b"{\"timeout_secs\": 1} trailing",
        ] {
            let body: &'static [u8] = body;
            let (field, message) = invalid(
                json::<SetTimeoutRequest>(Some("application/json"), body)
                    .await
                    .expect_err("refused"),
            );
            assert_eq!(field, None, "{message}");
            assert!(message.starts_with("malformed JSON"), "{message}");
        }
        let (_, message) = invalid(
            json::<SetTimeoutRequest>(Some("application/json"), b"")
                .await
                .expect_err("an empty body is refused"),
        );
        assert!(message.contains("required"), "{message}");
    }

    #[tokio::test]
    async fn a_body_that_is_not_an_object_is_refused() {
        for (body, kind) in [
            (&b"[]"[..], "an array"),
            (b" [60]", "an array"),
            (b"60", "a number"),
            (b"\"x\"", "a string"),
            (b"true", "a boolean"),
        ] {
            let body: &'static [u8] = body;
            let (field, message) = invalid(
                json::<CreateSandboxRequest>(Some("application/json"), body)
                    .await
                    .expect_err("refused"),
            );
            assert_eq!(field, None, "{message}");
            assert_eq!(
                message,
                format!("the request body must be a JSON object, not {kind}")
            );
        }
        // A body that may be left out may be `null`; an array is no more welcome there.
        let empty =
            OptionalJson::<KillRequest>::from_request(request(Some("application/json"), b"null"), &())
                .await
                .expect("null is no body");
        assert_eq!(empty.0, KillRequest::default());
        let e = OptionalJson::<KillRequest>::from_request(request(Some("application/json"), b"[]"), &())
            .await
            .expect_err("refused");
        assert!(invalid(e).1.contains("must be a JSON object"));
        let (_, message) = invalid(
            json::<SetTimeoutRequest>(Some("application/json"), b"nonsense")
                .await
                .expect_err("refused"),
        );
        assert!(message.starts_with("malformed JSON"), "{message}");
    }

    #[tokio::test]
    async fn type_errors_name_the_field() {
        let cases: [(&'static [u8], &str); 3] = [
            (br#"{"timeout_secs": "soon"}"#, "timeout_secs"),
            (br#"{"timeout_secs": -1}"#, "timeout_secs"),
            (br#"{}"#, "timeout_secs"),
        ];
        for (body, expected) in cases {
            let (field, message) = invalid(
                json::<SetTimeoutRequest>(Some("application/json"), body)
                    .await
                    .expect_err("refused"),
            );
            assert_eq!(field.as_deref(), Some(expected), "{message}");
        }
        let (field, _) = invalid(
            json::<ExecRequest>(Some("application/json"), br#"{"argv": ["ls", 3]}"#)
                .await
                .expect_err("refused"),
        );
        assert_eq!(field.as_deref(), Some("argv[1]"));
        let (field, message) = invalid(
            json::<CreateSandboxRequest>(Some("application/json"), br#"{"limits": {"memory": "12Q"}}"#)
                .await
                .expect_err("refused"),
        );
        assert_eq!(field.as_deref(), Some("limits.memory"), "{message}");
    }

    #[tokio::test]
    async fn unknown_fields_are_named_with_their_path() {
        let (field, message) = invalid(
            json::<CreateSandboxRequest>(Some("application/json"), br#"{"limits": {"memroy": "1G"}}"#)
                .await
                .expect_err("refused"),
        );
        assert_eq!(field.as_deref(), Some("limits.memroy"));
        assert!(message.contains("unknown field `memroy`"), "{message}");
        let (field, _) = invalid(
            json::<ExecRequest>(Some("application/json"), br#"{"argv": ["ls"], "shel": "x"}"#)
                .await
                .expect_err("refused"),
        );
        assert_eq!(field.as_deref(), Some("shel"));
    }

    #[tokio::test]
    async fn body_limit() {
        static BIG: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| {
            let mut body = br#"{"argv": [""#.to_vec();
            body.resize(JSON_BODY_LIMIT + 10, b'a');
            body.extend_from_slice(br#""]}"#);
            body
        });
        // Without Content-Length (a stream) and with it.
        let req = HttpRequest::builder()
            .method("POST")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(futures_util::stream::iter([Ok::<
                _,
                std::io::Error,
            >(
                Bytes::from_static(BIG.as_slice()),
            )])))
            .expect("request");
        let e = ApiJson::<ExecRequest>::from_request(req, &())
            .await
            .expect_err("refused");
        assert_eq!(e.code(), ErrorCode::PayloadTooLarge);
        assert_eq!(e.status(), 413);
        let req = HttpRequest::builder()
            .method("POST")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_LENGTH, BIG.len())
            .body(Body::from(BIG.as_slice()))
            .expect("request");
        let e = ApiJson::<ExecRequest>::from_request(req, &())
            .await
            .expect_err("refused");
        assert_eq!(e.code(), ErrorCode::PayloadTooLarge);
    }

    #[tokio::test]
    async fn optional_body() {
        let req = OptionalJson::<KillRequest>::from_request(request(None, b""), &())
            .await
            .expect("empty body is the default");
        assert_eq!(req.0, KillRequest::default());
        let req = OptionalJson::<KillRequest>::from_request(
            request(Some("application/json"), br#"{"signal": "TERM"}"#),
            &(),
        )
        .await
        .expect("parses");
        assert_eq!(req.0.signal, Some(serde_json::json!("TERM")));
        let req = OptionalJson::<KillRequest>::from_request(request(Some("application/json"), b"null"), &())
            .await
            .expect("null is the default");
        assert_eq!(req.0, KillRequest::default());
        let e = OptionalJson::<KillRequest>::from_request(
            request(Some("application/json"), br#"{"sig": 9}"#),
            &(),
        )
        .await
        .expect_err("still validated");
        assert_eq!(e.body().field.as_deref(), Some("sig"));
    }

    #[test]
    fn queries() {
        let q: AuditQuery = parse_query("tenant=acme&after_seq=10&limit=5").expect("parses");
        assert_eq!(q.tenant.as_deref(), Some("acme"));
        assert_eq!(q.after_seq, Some(10));
        assert_eq!(q.limit, Some(5));
        let q: AuditQuery = parse_query("").expect("all optional");
        assert_eq!(q, AuditQuery::default());
        let q: AuditQuery = parse_query("action=process.%2A&sandbox=a+b").expect("decoded");
        assert_eq!(q.action.as_deref(), Some("process.*"));
        assert_eq!(q.sandbox.as_deref(), Some("a b"));

        let (field, message) = invalid(parse_query::<AuditQuery>("after_seq=ten").expect_err("refused"));
        assert_eq!(field.as_deref(), Some("after_seq"), "{message}");
        let (field, message) = invalid(parse_query::<AuditQuery>("tenat=acme").expect_err("refused"));
        assert_eq!(field.as_deref(), Some("tenat"), "{message}");
        assert!(message.starts_with("invalid query string"), "{message}");
    }

    #[test]
    fn field_names() {
        assert_eq!(field_of(".", "invalid type: string"), None);
        assert_eq!(field_of("a.b", "invalid type"), Some("a.b".into()));
        assert_eq!(field_of(".", "missing field `x` at line 1"), Some("x".into()));
        assert_eq!(field_of("limits", "missing field `y`"), Some("limits.y".into()));
        assert_eq!(
            field_of("limits.y", "unknown field `y`, expected one of"),
            Some("limits.y".into())
        );
    }
}
