//! The three error shapes E2B's SDKs parse, each from a [`ServiceError`] or a routing failure:
//! - [`E2bError`]: the control plane's `{"code": <status>, "message": ...}` (the SDKs parse this body
//!   for every error status before they look at the status, so it is always JSON with both fields);
//! - [`ProxyError`]: what E2B's sandbox proxy answers for a sandbox that is gone (502 "The sandbox
//!   was not found") or a port nothing listens on (502 "... port is not open"); the SDKs look for
//!   those very words;
//! - [`ConnectError`]: a Connect-RPC error, `{"code": "<connect code>", "message": ...}` with the
//!   code's HTTP status (unary calls), or inside a stream's end message (streaming calls).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use paddock_control::ServiceError;
use paddock_types::api::ErrorCode;
use serde::Serialize;

/// A control-plane error as E2B's API answers it.
#[derive(Debug, Clone)]
pub struct E2bError {
    /// The HTTP status (also the body's `code`).
    pub status: StatusCode,
    /// What went wrong.
    pub message: String,
}

impl E2bError {
    /// An error with this status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// 400 with a message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404 for a sandbox this key cannot see (missing, ended, or another tenant's: the same answer).
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("sandbox \"{id}\" doesn't exist or you don't have access to it"),
        )
    }
}

#[derive(Serialize)]
struct E2bBody<'a> {
    code: u16,
    message: &'a str,
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&E2bBody {
            code: self.status.as_u16(),
            message: &self.message,
        })
        .unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        resp.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

impl From<ServiceError> for E2bError {
    fn from(e: ServiceError) -> Self {
        let status = match e.code {
            // E2B answers 404 for a sandbox that has ended too.
            ErrorCode::SandboxNotFound | ErrorCode::SnapshotNotFound | ErrorCode::SandboxNotRunning => {
                StatusCode::NOT_FOUND
            }
            // The SDKs retry 503 and 429; a quota is no reason to retry.
            ErrorCode::QuotaExceeded => StatusCode::FORBIDDEN,
            code => StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        };
        let message = match &e.field {
            Some(field) if !e.message.contains(field.as_str()) => format!("{field}: {}", e.message),
            _ => e.message.clone(),
        };
        Self::new(status, message)
    }
}

/// What E2B's sandbox proxy answers when a request cannot reach the sandbox.
#[derive(Debug, Clone)]
pub enum ProxyError {
    /// The sandbox does not exist, has ended, is paused or stopped, or is another tenant's.
    NotFound {
        /// The id as the request named it.
        sandbox_id: String,
    },
    /// It runs, but nothing listens on the port.
    PortClosed {
        /// The id.
        sandbox_id: String,
        /// The port.
        port: u16,
    },
    /// The request lacks the token the sandbox requires (or has a wrong one).
    Unauthorized {
        /// Which header was wanted.
        header: &'static str,
    },
    /// The request named a port that is no port.
    BadRequest(String),
    /// The sandbox's server could not be reached or broke the exchange (any other 502: the SDKs
    /// call it unreachable).
    Unreachable {
        /// The id.
        sandbox_id: String,
        /// What happened.
        message: String,
    },
    /// Refused here before reaching the sandbox (too many connections, a head too large).
    Refused {
        /// The status.
        status: StatusCode,
        /// Why.
        message: String,
    },
}

#[derive(Serialize)]
struct ProxyBody<'a> {
    #[serde(rename = "sandboxId", skip_serializing_if = "Option::is_none")]
    sandbox_id: Option<&'a str>,
    message: String,
    code: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    port: Option<u16>,
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let (status, body) = match &self {
            ProxyError::NotFound { sandbox_id } => (
                StatusCode::BAD_GATEWAY,
                ProxyBody {
                    sandbox_id: Some(sandbox_id),
                    message: "The sandbox was not found".into(),
                    code: 502,
                    port: None,
                },
            ),
            ProxyError::PortClosed { sandbox_id, port } => (
                StatusCode::BAD_GATEWAY,
                ProxyBody {
                    sandbox_id: Some(sandbox_id),
                    message: "The sandbox is running but port is not open".into(),
                    code: 502,
                    port: Some(*port),
                },
            ),
            ProxyError::Unauthorized { header } => (
                StatusCode::UNAUTHORIZED,
                ProxyBody {
                    sandbox_id: None,
                    message: format!(
                        "unauthorized access, please provide a valid access token in the {header} header"
                    ),
                    code: 401,
                    port: None,
                },
            ),
            ProxyError::Unreachable { sandbox_id, message } => (
                StatusCode::BAD_GATEWAY,
                ProxyBody {
                    sandbox_id: Some(sandbox_id),
                    message: message.clone(),
                    code: 502,
                    port: None,
                },
            ),
            ProxyError::Refused { status, message } => (
                *status,
                ProxyBody {
                    sandbox_id: None,
                    message: message.clone(),
                    code: status.as_u16(),
                    port: None,
                },
            ),
            ProxyError::BadRequest(message) => (
                StatusCode::BAD_REQUEST,
                ProxyBody {
                    sandbox_id: None,
                    message: message.clone(),
                    code: 400,
                    port: None,
                },
            ),
        };
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let mut resp = (status, bytes).into_response();
        resp.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

/// A Connect-RPC error code (the protocol's names; each has its HTTP status for unary answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectCode {
    /// `canceled`.
    Canceled,
    /// `unknown`.
    Unknown,
    /// `invalid_argument`.
    InvalidArgument,
    /// `deadline_exceeded`.
    DeadlineExceeded,
    /// `not_found`.
    NotFound,
    /// `already_exists`.
    AlreadyExists,
    /// `permission_denied`.
    PermissionDenied,
    /// `resource_exhausted`.
    ResourceExhausted,
    /// `failed_precondition`.
    FailedPrecondition,
    /// `unimplemented`.
    Unimplemented,
    /// `internal`.
    Internal,
    /// `unavailable`.
    Unavailable,
    /// `unauthenticated`.
    Unauthenticated,
}

impl ConnectCode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectCode::Canceled => "canceled",
            ConnectCode::Unknown => "unknown",
            ConnectCode::InvalidArgument => "invalid_argument",
            ConnectCode::DeadlineExceeded => "deadline_exceeded",
            ConnectCode::NotFound => "not_found",
            ConnectCode::AlreadyExists => "already_exists",
            ConnectCode::PermissionDenied => "permission_denied",
            ConnectCode::ResourceExhausted => "resource_exhausted",
            ConnectCode::FailedPrecondition => "failed_precondition",
            ConnectCode::Unimplemented => "unimplemented",
            ConnectCode::Internal => "internal",
            ConnectCode::Unavailable => "unavailable",
            ConnectCode::Unauthenticated => "unauthenticated",
        }
    }

    /// The HTTP status of a unary error with this code (the Connect protocol's table).
    pub fn http_status(self) -> StatusCode {
        match self {
            ConnectCode::Canceled => StatusCode::from_u16(499).unwrap_or(StatusCode::REQUEST_TIMEOUT),
            ConnectCode::Unknown | ConnectCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ConnectCode::InvalidArgument | ConnectCode::FailedPrecondition => StatusCode::BAD_REQUEST,
            ConnectCode::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            ConnectCode::NotFound => StatusCode::NOT_FOUND,
            ConnectCode::AlreadyExists => StatusCode::CONFLICT,
            ConnectCode::PermissionDenied => StatusCode::FORBIDDEN,
            ConnectCode::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            ConnectCode::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            ConnectCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ConnectCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        }
    }
}

/// A Connect-RPC error.
#[derive(Debug, Clone)]
pub struct ConnectError {
    /// Its code.
    pub code: ConnectCode,
    /// What went wrong.
    pub message: String,
}

impl ConnectError {
    /// An error with this code and message.
    pub fn new(code: ConnectCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The JSON body (unary error, or the `error` member of a stream's end message).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }
}

impl IntoResponse for ConnectError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.to_json()).unwrap_or_default();
        let mut resp = (self.code.http_status(), body).into_response();
        resp.headers_mut().insert(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        resp
    }
}

impl From<ServiceError> for ConnectError {
    fn from(e: ServiceError) -> Self {
        let code = match e.code {
            ErrorCode::InvalidRequest
            | ErrorCode::InvalidPath
            | ErrorCode::NotADirectory
            | ErrorCode::IsADirectory => ConnectCode::InvalidArgument,
            ErrorCode::Unauthorized => ConnectCode::Unauthenticated,
            ErrorCode::Forbidden | ErrorCode::PermissionDenied => ConnectCode::PermissionDenied,
            ErrorCode::ProcessNotFound | ErrorCode::FileNotFound => ConnectCode::NotFound,
            ErrorCode::SandboxNotFound
            | ErrorCode::SandboxNotRunning
            | ErrorCode::Unavailable
            | ErrorCode::SandboxRecovering => ConnectCode::Unavailable,
            ErrorCode::AlreadyExists | ErrorCode::DirectoryNotEmpty => ConnectCode::AlreadyExists,
            ErrorCode::QuotaExceeded | ErrorCode::PayloadTooLarge | ErrorCode::NoSpace => {
                ConnectCode::ResourceExhausted
            }
            ErrorCode::Unsupported => ConnectCode::Unimplemented,
            ErrorCode::Timeout => ConnectCode::DeadlineExceeded,
            _ => ConnectCode::Internal,
        };
        Self::new(code, e.message)
    }
}
