//! The service's one error type: a stable code, a message safe to show a client, and the field a
//! validation error is about. Internal causes are logged where they happen, never put in `message`.

use paddock_types::api::{ApiErrorBody, ErrorCode};

/// Why a service operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ServiceError {
    /// Stable machine-readable code.
    pub code: ErrorCode,
    /// What went wrong, for the client.
    pub message: String,
    /// The request field at fault (`invalid_request`), or the quota that refused (`quota_exceeded`).
    pub field: Option<String>,
}

impl ServiceError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: None,
        }
    }

    /// A validation error about `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::InvalidRequest,
            message: message.into(),
            field: Some(field.into()),
        }
    }

    /// No such sandbox (also what another tenant's sandbox looks like).
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(ErrorCode::SandboxNotFound, format!("sandbox {id} not found"))
    }

    /// An internal failure: logs `cause` and returns an error that does not reveal it.
    pub fn internal(what: &str, cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "{what}");
        Self::new(
            ErrorCode::Internal,
            format!("internal error while trying to {what}"),
        )
    }

    /// The JSON body of this error.
    pub fn body(&self) -> ApiErrorBody {
        ApiErrorBody {
            code: self.code,
            message: self.message.clone(),
            field: self.field.clone(),
        }
    }
}
