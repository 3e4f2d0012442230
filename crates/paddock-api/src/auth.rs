//! The `Auth` extractor: the API key from `Authorization: Bearer <key>` or `X-API-Key: <key>`,
//! resolved by the service into a [`Principal`]. Every route but `/healthz` takes it, first, so an
//! unauthenticated request is refused before its body is read or a WebSocket is upgraded.

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use paddock_control::{Principal, SandboxService};

use crate::ApiError;

/// The `X-API-Key` header.
pub const API_KEY_HEADER: &str = "x-api-key";

/// The authenticated caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth(pub Principal);

impl<S> FromRequestParts<S> for Auth
where
    SandboxService: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        // The key is parsed before the service is looked at: a request without one never reaches it.
        let key = api_key(&parts.headers)?;
        let service = SandboxService::from_ref(state);
        let principal = service.authenticate(key).await?;
        Ok(Self(principal))
    }
}

/// The API key a request carries. Refused (401): no key; an `Authorization` scheme other than
/// `Bearer`; an empty or non-ASCII key; a header given twice; `Authorization` and `X-API-Key` naming
/// different keys. Messages never echo the key.
pub fn api_key(headers: &HeaderMap) -> Result<&str, ApiError> {
    let bearer = single_header(headers, header::AUTHORIZATION.as_str())?
        .map(bearer_key)
        .transpose()?;
    let x_api_key = single_header(headers, API_KEY_HEADER)?
        .map(|v| {
            let v = v.trim();
            if v.is_empty() {
                Err(ApiError::unauthorized("the X-API-Key header is empty"))
            } else {
                Ok(v)
            }
        })
        .transpose()?;
    match (bearer, x_api_key) {
        (Some(a), Some(b)) if a != b => Err(ApiError::unauthorized(
            "the Authorization and X-API-Key headers name different keys",
        )),
        (Some(key), _) | (None, Some(key)) => Ok(key),
        (None, None) => Err(ApiError::unauthorized(
            "missing API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>`",
        )),
    }
}

fn single_header<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::unauthorized(format!(
            "the {name} header is given more than once"
        )));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| ApiError::unauthorized(format!("the {name} header is not printable ASCII")))
}

fn bearer_key(value: &str) -> Result<&str, ApiError> {
    let value = value.trim();
    let (scheme, key) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::unauthorized(
            "unsupported authorization scheme: use `Authorization: Bearer <key>`",
        ));
    }
    let key = key.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(ApiError::unauthorized(
            "malformed Authorization header: expected `Bearer <key>`",
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use paddock_types::api::ErrorCode;

    use super::*;

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).expect("header name"),
                HeaderValue::from_bytes(value).expect("header value"),
            );
        }
        map
    }

    fn refused(pairs: &[(&str, &[u8])]) -> String {
        let e = api_key(&headers(pairs)).expect_err("refused");
        assert_eq!(e.code(), ErrorCode::Unauthorized);
        assert_eq!(e.status(), 401);
        e.body().message.clone()
    }

    #[test]
    fn bearer_keys() {
        for value in [
            "Bearer pk_abc",
            "bearer pk_abc",
            "BEARER   pk_abc ",
            " Bearer pk_abc",
        ] {
            let h = headers(&[("authorization", value.as_bytes())]);
            assert_eq!(api_key(&h).expect("accepted"), "pk_abc", "{value:?}");
        }
    }

    #[test]
    fn x_api_key() {
        let h = headers(&[("x-api-key", b"pk_abc")]);
        assert_eq!(api_key(&h).expect("accepted"), "pk_abc");
        let h = headers(&[("X-Api-Key", b" pk_abc ")]);
        assert_eq!(api_key(&h).expect("accepted"), "pk_abc");
    }

    #[test]
    fn both_headers_must_agree() {
        let h = headers(&[("authorization", b"Bearer k1"), ("x-api-key", b"k1")]);
        assert_eq!(api_key(&h).expect("accepted"), "k1");
        let msg = refused(&[("authorization", b"Bearer k1"), ("x-api-key", b"k2")]);
        assert!(msg.contains("different keys"), "{msg}");
    }

    #[test]
    fn missing() {
        let msg = refused(&[]);
        assert!(msg.contains("missing API key"), "{msg}");
        refused(&[("cookie", b"key=pk_abc")]);
    }

    #[test]
    fn malformed() {
        for value in [
            &b"Basic dXNlcjpwYXNz"[..],
            b"Bearer",
            b"Bearer ",
            b"Bearer a b",
            b"pk_abc",
            b"Token pk_abc",
            b"Bearer \xff\xfe",
        ] {
            let msg = refused(&[("authorization", value)]);
            assert!(
                !msg.contains("pk_abc") && !msg.contains("dXNl"),
                "message echoes the key: {msg}"
            );
        }
        refused(&[("x-api-key", b"")]);
        refused(&[("x-api-key", b"   ")]);
        refused(&[("authorization", b"Bearer k1"), ("authorization", b"Bearer k1")]);
        refused(&[("x-api-key", b"k1"), ("x-api-key", b"k2")]);
    }
}
