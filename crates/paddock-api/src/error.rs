//! `ApiError`: the one error response of the API. Every failure, whether the service's, an extractor's
//! (malformed JSON, a bad query, a missing key), the router's (no such endpoint) or a panic's, leaves as
//! an [`ApiErrorBody`] with the status of its code.

use std::any::Any;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use paddock_control::ServiceError;
use paddock_types::api::{ApiErrorBody, ErrorCode};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

/// An error response: a stable [`ErrorCode`], a message safe to show the client and, for validation
/// errors, the field at fault. The status is the code's [`ErrorCode::http_status`], except for the
/// router's own answers to an unknown endpoint (404) or method (405), which carry `invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    body: ApiErrorBody,
}

impl ApiError {
    /// An error with `code` and `message`, answered with the code's status.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            status: status_of(code),
            body: ApiErrorBody {
                code,
                message: message.into(),
                field: None,
                approval_id: None,
            },
        }
    }

    /// An `invalid_request` error, naming the field at fault when it is known.
    pub fn invalid(field: Option<String>, message: impl Into<String>) -> Self {
        let mut error = Self::new(ErrorCode::InvalidRequest, message);
        error.body.field = field;
        error
    }

    /// `401 unauthorized`.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, message)
    }

    /// No route matches the path: `404` with code `invalid_request` (there is no resource to name).
    pub fn no_such_endpoint(method: &str, path: &str) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            ..Self::new(
                ErrorCode::InvalidRequest,
                format!("no such endpoint: {method} {path}"),
            )
        }
    }

    /// The path exists but not with this method: `405` with code `invalid_request`.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self {
            status: StatusCode::METHOD_NOT_ALLOWED,
            ..Self::new(
                ErrorCode::InvalidRequest,
                format!("method not allowed: {method} {path}"),
            )
        }
    }

    /// Answers with `status` instead of the code's (for rejections that carry their own, such as a
    /// failed WebSocket upgrade).
    pub(crate) fn set_status(&mut self, status: StatusCode) {
        self.status = status;
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The JSON body.
    pub fn body(&self) -> &ApiErrorBody {
        &self.body
    }

    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        self.body.code
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.body.code.as_str(), self.body.message)
    }
}

impl std::error::Error for ApiError {}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> Self {
        Self {
            status: status_of(e.code),
            body: e.body(),
        }
    }
}

fn status_of(code: ErrorCode) -> StatusCode {
    StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            // The message is already client-safe (the service logged the cause); this line ties the
            // failure to the request span.
            tracing::warn!(code = self.body.code.as_str(), message = %self.body.message, "request failed");
        }
        let body = match serde_json::to_vec(&self.body) {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(error = %e, "failed to serialize an error body");
                br#"{"code":"internal","message":"internal error"}"#.to_vec()
            }
        };
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            body,
        )
            .into_response();
        if self.body.code == ErrorCode::PayloadTooLarge {
            // The rest of the body stays unread, so the connection cannot carry another request:
            // saying so keeps a client from reusing it (and losing its next request to the close).
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if self.body.code == ErrorCode::Unauthorized {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"paddock\""),
            );
        }
        response
    }
}

/// In the OpenAPI document: the shared `Error` response (`#/components/responses/Error`) every
/// operation lists for `4XX` and `5XX`.
impl<'s> utoipa::ToResponse<'s> for ApiError {
    fn response() -> (&'s str, RefOr<utoipa::openapi::Response>) {
        let response = ResponseBuilder::new()
            .description(
                "An error: `code` is stable (clients branch on it), `message` is for people, `field` names \
                 the request field at fault. The status is the code's (see `ErrorCode`); an unknown \
                 endpoint is 404 and a wrong method 405, both with code `invalid_request`.",
            )
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(RefOr::Ref(Ref::from_schema_name("ApiErrorBody"))))
                    .build(),
            )
            .build();
        ("Error", RefOr::T(response))
    }
}

/// `CatchPanicLayer`'s answer: the panic is logged (it may carry internal detail), the client gets
/// `500 internal`.
pub(crate) fn panic_response(payload: Box<dyn Any + Send + 'static>) -> Response {
    let what = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(non-string panic payload)");
    tracing::error!(panic = what, "request handler panicked");
    ApiError::new(ErrorCode::Internal, "internal error while handling the request").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_CODES: [ErrorCode; 35] = [
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::InvalidRequest,
        ErrorCode::SandboxNotFound,
        ErrorCode::SandboxNotRunning,
        ErrorCode::ProcessNotFound,
        ErrorCode::FileNotFound,
        ErrorCode::KeyNotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::PermissionDenied,
        ErrorCode::NotADirectory,
        ErrorCode::IsADirectory,
        ErrorCode::DirectoryNotEmpty,
        ErrorCode::InvalidPath,
        ErrorCode::QuotaExceeded,
        ErrorCode::NoSpace,
        ErrorCode::PayloadTooLarge,
        ErrorCode::InvalidArchive,
        ErrorCode::Unsupported,
        ErrorCode::Timeout,
        ErrorCode::Unavailable,
        ErrorCode::SandboxRecovering,
        ErrorCode::Internal,
        ErrorCode::VolumeNotFound,
        ErrorCode::SecretNotFound,
        ErrorCode::VolumeExists,
        ErrorCode::VolumeInUse,
        ErrorCode::PolicyNotFound,
        ErrorCode::PolicyDenied,
        ErrorCode::ApprovalPending,
        ErrorCode::ApprovalRejected,
        ErrorCode::ApprovalExpired,
        ErrorCode::ApprovalNotFound,
        ErrorCode::ApprovalDecided,
        ErrorCode::ExecutionNotFound,
    ];

    async fn body_json(response: Response) -> serde_json::Value {
        use http_body_util::BodyExt as _;
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body collects")
            .to_bytes();
        serde_json::from_slice(&bytes).expect("error body is JSON")
    }

    #[tokio::test]
    async fn every_code_is_answered_with_its_status_and_body() {
        let expected: [(ErrorCode, u16); 35] = [
            (ErrorCode::Unauthorized, 401),
            (ErrorCode::Forbidden, 403),
            (ErrorCode::InvalidRequest, 400),
            (ErrorCode::SandboxNotFound, 404),
            (ErrorCode::SandboxNotRunning, 409),
            (ErrorCode::ProcessNotFound, 404),
            (ErrorCode::FileNotFound, 404),
            (ErrorCode::KeyNotFound, 404),
            (ErrorCode::AlreadyExists, 409),
            (ErrorCode::PermissionDenied, 403),
            (ErrorCode::NotADirectory, 400),
            (ErrorCode::IsADirectory, 400),
            (ErrorCode::DirectoryNotEmpty, 409),
            (ErrorCode::InvalidPath, 400),
            (ErrorCode::QuotaExceeded, 429),
            (ErrorCode::NoSpace, 507),
            (ErrorCode::PayloadTooLarge, 413),
            (ErrorCode::InvalidArchive, 400),
            (ErrorCode::Unsupported, 501),
            (ErrorCode::Timeout, 504),
            (ErrorCode::Unavailable, 503),
            (ErrorCode::SandboxRecovering, 503),
            (ErrorCode::Internal, 500),
            (ErrorCode::VolumeNotFound, 404),
            (ErrorCode::SecretNotFound, 404),
            (ErrorCode::VolumeExists, 409),
            (ErrorCode::VolumeInUse, 409),
            (ErrorCode::PolicyNotFound, 404),
            (ErrorCode::PolicyDenied, 403),
            (ErrorCode::ApprovalPending, 409),
            (ErrorCode::ApprovalRejected, 403),
            (ErrorCode::ApprovalExpired, 410),
            (ErrorCode::ApprovalNotFound, 404),
            (ErrorCode::ApprovalDecided, 409),
            (ErrorCode::ExecutionNotFound, 404),
        ];
        assert_eq!(expected.map(|(c, _)| c), ALL_CODES);
        for (code, status) in expected {
            let service_error = ServiceError::new(code, "what happened");
            let response = ApiError::from(service_error).into_response();
            assert_eq!(response.status().as_u16(), status, "{code:?}");
            assert_eq!(
                response.headers()[header::CONTENT_TYPE],
                "application/json",
                "{code:?}"
            );
            assert_eq!(
                response.headers().contains_key(header::WWW_AUTHENTICATE),
                code == ErrorCode::Unauthorized
            );
            let body = body_json(response).await;
            assert_eq!(
                body,
                serde_json::json!({"code": code.as_str(), "message": "what happened"})
            );
        }
    }

    #[tokio::test]
    async fn validation_errors_name_their_field() {
        let e = ServiceError::invalid("limits.memory", "too large");
        let body = body_json(ApiError::from(e).into_response()).await;
        assert_eq!(
            body,
            serde_json::json!({"code": "invalid_request", "message": "too large", "field": "limits.memory"})
        );
    }

    #[tokio::test]
    async fn router_answers_carry_invalid_request_with_their_own_status() {
        let e = ApiError::no_such_endpoint("GET", "/v2/nothing");
        assert_eq!(e.status(), StatusCode::NOT_FOUND);
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
        assert_eq!(e.body().message, "no such endpoint: GET /v2/nothing");
        let e = ApiError::method_not_allowed("PATCH", "/healthz");
        assert_eq!(e.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(e.code(), ErrorCode::InvalidRequest);
    }

    #[tokio::test]
    async fn panics_answer_500_without_their_message() {
        let response = panic_response(Box::new("secret internal state"));
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = body_json(response).await;
        assert_eq!(body["code"], "internal");
        assert!(!body.to_string().contains("secret"));
    }
}
