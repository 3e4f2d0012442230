//! envd's plain HTTP endpoints, answered from the service: `GET /files` (download), `POST /files`
//! (upload, multipart or raw, optionally gzip-encoded) and `GET /envs` (the sandbox's environment
//! variables, for the code interpreter).
//!
//! A `/files` request passes with the sandbox's access token in `X-Access-Token`, or without it
//! with a URL signature for its path, operation and user ([`crate::tokens::check_signature`]); a
//! wrong token is refused even when a signature is present, as envd does. Paths are envd's:
//! relative ones and `~` resolve against the request user's home (`paths.rs`), answers carry
//! absolute paths, and errors are envd's `{"code": <status>, "message": ...}` bodies.
//!
//! It does not: serve byte ranges or conditional requests (the SDKs send neither; the whole file
//! is sent with 200), keep E2B's file metadata (`X-Metadata-*` headers are refused: the agent has
//! no extended attributes to keep them in), give an overwritten file to the request's user (a new
//! file and the directories made for it are the user's; an existing file keeps its owner and
//! mode), check that a download's user exists (envd reads as root whoever asks; here the user only
//! picks the home that relative paths start at), or look a user's home up in the sandbox's
//! `/etc/passwd` (`root`'s is `/root`, every other user's `/home/<user>`).

mod disposition;
mod download;
mod encoding;
mod envs;
mod multipart;
mod paths;
mod upload;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use paddock_control::{Principal, ServiceError};
use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;

use crate::envd::{SandboxOnly, ACCESS_TOKEN_HEADER};
use crate::tokens::{check_signature, FileOperation, SignatureError};
use crate::{E2bError, E2bState, ProxyError};

/// The `/files` and `/envs` routes.
pub fn routes() -> Router<E2bState> {
    Router::new()
        .route("/files", get(download::download_file).post(upload::upload_files))
        .route("/envs", get(envs::get_envs))
}

/// Why a `/files` or `/envs` request is refused, each with envd's status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilesError {
    /// 401: no valid token or signature, or a user that does not exist.
    #[error("{0}")]
    Unauthorized(String),
    /// 400: a path that cannot be resolved or is a directory, a malformed body, a duplicate path.
    #[error("{0}")]
    BadRequest(String),
    /// 404: the file does not exist.
    #[error("path '{0}' does not exist")]
    NotFound(String),
    /// 406: the client accepts no encoding paddock can send.
    #[error("no acceptable encoding found, supported: [gzip]")]
    NotAcceptable,
    /// 507: the sandbox's disk (or the server's state directory) is full.
    #[error("{0}")]
    NoSpace(String),
    /// 502: the sandbox ended (or was paused) during the request.
    #[error("the sandbox was not found")]
    SandboxGone(SandboxId),
    /// Any other refusal, with the status the service's code has.
    #[error("{message}")]
    Other {
        /// The status.
        status: StatusCode,
        /// What went wrong.
        message: String,
    },
}

impl FilesError {
    /// The service's refusal of an operation on `path` (the resolved path, named in messages).
    pub fn from_service(e: ServiceError, id: &SandboxId, path: &str) -> Self {
        match e.code {
            ErrorCode::FileNotFound => Self::NotFound(path.to_owned()),
            ErrorCode::IsADirectory => Self::BadRequest(format!("path '{path}' is a directory")),
            // The agent knows no such user: envd answers a failed user lookup with 401.
            ErrorCode::InvalidRequest if e.field.as_deref() == Some("user") => {
                Self::Unauthorized(format!("error looking up user: {}", e.message))
            }
            ErrorCode::InvalidRequest
            | ErrorCode::InvalidPath
            | ErrorCode::NotADirectory
            | ErrorCode::AlreadyExists
            | ErrorCode::DirectoryNotEmpty => Self::BadRequest(e.message),
            ErrorCode::NoSpace => Self::NoSpace(e.message),
            ErrorCode::SandboxNotFound | ErrorCode::SandboxNotRunning => Self::SandboxGone(id.clone()),
            code => Self::Other {
                status: StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                message: e.message,
            },
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::NotAcceptable => StatusCode::NOT_ACCEPTABLE,
            Self::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
            Self::SandboxGone(_) => StatusCode::BAD_GATEWAY,
            Self::Other { status, .. } => *status,
        }
    }
}

impl IntoResponse for FilesError {
    fn into_response(self) -> Response {
        match self {
            Self::SandboxGone(id) => ProxyError::NotFound {
                sandbox_id: id.as_str().to_owned(),
            }
            .into_response(),
            // envd's error body has the control plane's shape: `{"code": <status>, "message": ...}`.
            e => E2bError::new(e.status(), e.to_string()).into_response(),
        }
    }
}

/// The query of a `/files` request (unknown parameters are ignored, as envd's are).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct FilesQuery {
    /// `path`, as the client wrote it (what the signature covers).
    pub path: Option<String>,
    /// `username`.
    pub username: Option<String>,
    /// `signature`.
    pub signature: Option<String>,
    /// `signature_expiration`, Unix seconds.
    pub signature_expiration: Option<i64>,
}

impl FilesQuery {
    /// Parses a query string; the first of repeated parameters counts.
    pub fn parse(query: Option<&str>) -> Result<Self, FilesError> {
        let mut q = Self::default();
        let mut expiration = None;
        for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            let slot = match key.as_ref() {
                "path" => &mut q.path,
                "username" => &mut q.username,
                "signature" => &mut q.signature,
                "signature_expiration" => &mut expiration,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(value.into_owned());
            }
        }
        q.signature_expiration = expiration
            .map(|e| {
                e.trim().parse::<i64>().map_err(|_| {
                    FilesError::BadRequest(format!("signature_expiration {e:?} is not a Unix time"))
                })
            })
            .transpose()?;
        Ok(q)
    }
}

/// A `/files` request allowed to go on: its sandbox, a principal of the sandbox's tenant and the
/// user it acts as.
#[derive(Debug)]
pub(crate) struct FilesCaller {
    /// The sandbox.
    pub id: SandboxId,
    /// A principal of its tenant.
    pub principal: Principal,
    /// The `username` parameter, else the sandbox's default user.
    pub user: String,
}

/// envd's `/files` authorisation: the right `X-Access-Token`, or (with no token header at all) a
/// valid signature of the request's path, operation, username and expiry. Then the user.
pub(crate) async fn authorize(
    state: &E2bState,
    sandbox: SandboxOnly,
    headers: &HeaderMap,
    query: &FilesQuery,
    op: FileOperation,
) -> Result<FilesCaller, FilesError> {
    let token_sent = headers
        .get(ACCESS_TOKEN_HEADER)
        .is_some_and(|v| !v.as_bytes().is_empty());
    if token_sent && !sandbox.token_ok {
        return Err(FilesError::Unauthorized(
            "access token present in header but does not match".into(),
        ));
    }
    if !token_sent {
        let Some(signature) = query.signature.as_deref() else {
            return Err(FilesError::Unauthorized(
                "missing signature query parameter".into(),
            ));
        };
        check_signature(
            signature,
            query.path.as_deref().unwrap_or_default(),
            op,
            query.username.as_deref().unwrap_or_default(),
            &sandbox.envd_token,
            query.signature_expiration,
            now_secs(),
        )
        .map_err(|e| {
            FilesError::Unauthorized(
                match e {
                    SignatureError::Invalid => "invalid signature",
                    SignatureError::Expired => "signature is already expired",
                }
                .into(),
            )
        })?;
    }
    let user = match &query.username {
        Some(user) => user.clone(),
        None => state
            .service
            .sandbox_user(&sandbox.principal, &sandbox.id)
            .await
            .map_err(|e| FilesError::from_service(e, &sandbox.id, ""))?,
    };
    if !paths::is_user_name(&user) {
        return Err(FilesError::Unauthorized(format!(
            "error looking up user '{user}': no such user"
        )));
    }
    Ok(FilesCaller {
        id: sandbox.id,
        principal: sandbox.principal,
        user,
    })
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_parse_as_envd_reads_them() {
        let q = FilesQuery::parse(Some(
            "path=%2Fhome%2Fuser%2Fa%20b.txt&username=root&signature=v1_x%2By&signature_expiration=17&x=1&path=other",
        ))
        .expect("parses");
        assert_eq!(
            q,
            FilesQuery {
                path: Some("/home/user/a b.txt".into()),
                username: Some("root".into()),
                signature: Some("v1_x+y".into()),
                signature_expiration: Some(17),
            }
        );
        assert_eq!(FilesQuery::parse(None).expect("empty"), FilesQuery::default());
        assert!(matches!(
            FilesQuery::parse(Some("signature_expiration=soon")),
            Err(FilesError::BadRequest(_))
        ));
    }

    #[test]
    fn service_errors_get_envds_statuses() {
        let id: SandboxId = "sb-1".parse().expect("id");
        let status = |code: ErrorCode, field: Option<&str>| {
            let e = ServiceError {
                code,
                message: "m".into(),
                field: field.map(str::to_owned),
                approval_id: None,
            };
            FilesError::from_service(e, &id, "/p").status()
        };
        assert_eq!(status(ErrorCode::FileNotFound, None), StatusCode::NOT_FOUND);
        assert_eq!(status(ErrorCode::IsADirectory, None), StatusCode::BAD_REQUEST);
        assert_eq!(status(ErrorCode::InvalidPath, None), StatusCode::BAD_REQUEST);
        assert_eq!(
            status(ErrorCode::InvalidRequest, Some("user")),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(status(ErrorCode::NoSpace, None), StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(
            status(ErrorCode::SandboxNotRunning, None),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            status(ErrorCode::Internal, None),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(
            FilesError::NotFound("/p".into()).to_string(),
            "path '/p' does not exist"
        );
    }
}
