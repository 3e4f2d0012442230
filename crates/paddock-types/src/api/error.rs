//! The one error shape of the API.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Stable machine-readable error codes. Clients branch on these, never on messages; a code is never
/// renamed or reused for another meaning (COMPATIBILITY.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// No API key, or an unknown, malformed or revoked one (401).
    Unauthorized,
    /// The key is valid but may not do this (admin-only operations) (403).
    Forbidden,
    /// The request is malformed or a field is invalid; `field` names it (400).
    InvalidRequest,
    /// No such sandbox for this tenant (404; also for other tenants' sandboxes).
    SandboxNotFound,
    /// The sandbox exists but is no longer running (409).
    SandboxNotRunning,
    /// No such process in the sandbox (404).
    ProcessNotFound,
    /// No such file or directory in the sandbox (404).
    FileNotFound,
    /// No such API key (404).
    KeyNotFound,
    /// No such snapshot for this tenant (404).
    SnapshotNotFound,
    /// No such volume for this tenant (404; also for other tenants' volumes).
    VolumeNotFound,
    /// No such secret for this tenant (404).
    SecretNotFound,
    /// The tenant already has a volume of that name (409).
    VolumeExists,
    /// A live sandbox mounts the volume, so it cannot be deleted (409).
    VolumeInUse,
    /// The target already exists (409).
    AlreadyExists,
    /// The sandbox's own permissions forbid the operation (403).
    PermissionDenied,
    /// A path component is not a directory (400).
    NotADirectory,
    /// The path is a directory where a file was expected (400).
    IsADirectory,
    /// A non-recursive remove of a non-empty directory (409).
    DirectoryNotEmpty,
    /// The path is not acceptable (not absolute, NUL bytes, escapes the root) (400).
    InvalidPath,
    /// The tenant's quota does not allow this (429); `field` names the quota (`max_sandboxes`,
    /// `max_memory`, `max_cpus`, `max_snapshots`, `max_volumes` or `max_storage`).
    QuotaExceeded,
    /// The sandbox's disk limit is reached (507).
    NoSpace,
    /// The body is larger than this endpoint accepts (413).
    PayloadTooLarge,
    /// An uploaded archive is malformed or unsafe (a path leaving the tree, a device node, an owner
    /// outside the sandbox id range, a truncation); nothing of it was kept (400).
    InvalidArchive,
    /// This server or backend cannot do that (501).
    Unsupported,
    /// The sandbox's agent did not answer in time (504).
    Timeout,
    /// The server is shutting down or overloaded (503).
    Unavailable,
    /// The sandbox is being recovered after a server restart; retry shortly (503).
    SandboxRecovering,
    /// Something failed inside paddock; details are in the server log, never in the response (500).
    Internal,
    /// The sandbox runs, but nothing listens on the port a request was to be proxied to (502).
    PortClosed,
    /// No such template for this tenant (404; also for other tenants' templates).
    TemplateNotFound,
    /// The tenant already has a template of that name (409).
    TemplateExists,
    /// A sandbox (running or stopped) was made from the template, so it cannot be deleted (409).
    TemplateInUse,
    /// An image (its manifest, config or a layer) is malformed, unsafe or unsupported; nothing of
    /// it was kept (400).
    InvalidImage,
    /// The registry has no such image or tag (404).
    ImageNotFound,
    /// The image is larger than this server accepts (413).
    ImageTooLarge,
    /// The registry cannot be reached, its TLS certificate is not trusted, or it answered outside
    /// the protocol (502).
    RegistryUnreachable,
    /// The registry refused the credentials (or their absence) (502: the caller's API key is fine).
    RegistryUnauthorized,
    /// A recipe's step failed (a `RUN` exited non-zero or timed out); nothing of the build was
    /// kept but the results of the steps before it (422).
    BuildFailed,
    /// No code context of that id in the sandbox (404).
    ContextNotFound,
    /// The language's kernel could not be started in this sandbox (its template lacks it, or it
    /// failed at start), or the context's kernel died: restart the context (422).
    KernelUnavailable,
    /// No approval policy is set for the tenant or the sandbox (404).
    PolicyNotFound,
    /// The sandbox's approval policy denies the request; the message names the rule (403).
    PolicyDenied,
    /// The approval policy asks a person first: the request waits in the approvals queue and
    /// nothing of it has run; `approval_id` names the approval to poll (`GET /v1/approvals/{id}`)
    /// and, once approved, to send back with the same request (409).
    ApprovalPending,
    /// A person rejected the request's approval; nothing of it ran (403).
    ApprovalRejected,
    /// The request's approval expired (or was already used) before it could run; nothing of it
    /// ran (410).
    ApprovalExpired,
    /// No such approval for this tenant (404; also for other tenants' approvals).
    ApprovalNotFound,
    /// The approval was already decided (approved, rejected or expired) (409).
    ApprovalDecided,
    /// No such execution for this tenant (404; also for other tenants' executions).
    ExecutionNotFound,
}

impl ErrorCode {
    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::InvalidRequest => "invalid_request",
            Self::SandboxNotFound => "sandbox_not_found",
            Self::SandboxNotRunning => "sandbox_not_running",
            Self::ProcessNotFound => "process_not_found",
            Self::FileNotFound => "file_not_found",
            Self::KeyNotFound => "key_not_found",
            Self::SnapshotNotFound => "snapshot_not_found",
            Self::VolumeNotFound => "volume_not_found",
            Self::SecretNotFound => "secret_not_found",
            Self::VolumeExists => "volume_exists",
            Self::VolumeInUse => "volume_in_use",
            Self::AlreadyExists => "already_exists",
            Self::PermissionDenied => "permission_denied",
            Self::NotADirectory => "not_a_directory",
            Self::IsADirectory => "is_a_directory",
            Self::DirectoryNotEmpty => "directory_not_empty",
            Self::InvalidPath => "invalid_path",
            Self::QuotaExceeded => "quota_exceeded",
            Self::NoSpace => "no_space",
            Self::PayloadTooLarge => "payload_too_large",
            Self::InvalidArchive => "invalid_archive",
            Self::Unsupported => "unsupported",
            Self::Timeout => "timeout",
            Self::Unavailable => "unavailable",
            Self::SandboxRecovering => "sandbox_recovering",
            Self::Internal => "internal",
            Self::PortClosed => "port_closed",
            Self::TemplateNotFound => "template_not_found",
            Self::TemplateExists => "template_exists",
            Self::TemplateInUse => "template_in_use",
            Self::InvalidImage => "invalid_image",
            Self::ImageNotFound => "image_not_found",
            Self::ImageTooLarge => "image_too_large",
            Self::RegistryUnreachable => "registry_unreachable",
            Self::RegistryUnauthorized => "registry_unauthorized",
            Self::BuildFailed => "build_failed",
            Self::ContextNotFound => "context_not_found",
            Self::KernelUnavailable => "kernel_unavailable",
            Self::PolicyNotFound => "policy_not_found",
            Self::PolicyDenied => "policy_denied",
            Self::ApprovalPending => "approval_pending",
            Self::ApprovalRejected => "approval_rejected",
            Self::ApprovalExpired => "approval_expired",
            Self::ApprovalNotFound => "approval_not_found",
            Self::ApprovalDecided => "approval_decided",
            Self::ExecutionNotFound => "execution_not_found",
        }
    }

    /// The HTTP status this code is answered with.
    pub fn http_status(self) -> u16 {
        match self {
            Self::Unauthorized => 401,
            Self::Forbidden | Self::PermissionDenied | Self::PolicyDenied | Self::ApprovalRejected => 403,
            Self::ApprovalExpired => 410,
            Self::InvalidRequest
            | Self::NotADirectory
            | Self::IsADirectory
            | Self::InvalidPath
            | Self::InvalidArchive
            | Self::InvalidImage => 400,
            Self::SandboxNotFound
            | Self::ProcessNotFound
            | Self::FileNotFound
            | Self::KeyNotFound
            | Self::SnapshotNotFound
            | Self::VolumeNotFound
            | Self::SecretNotFound
            | Self::TemplateNotFound
            | Self::ImageNotFound
            | Self::ContextNotFound
            | Self::PolicyNotFound
            | Self::ApprovalNotFound
            | Self::ExecutionNotFound => 404,
            Self::SandboxNotRunning
            | Self::AlreadyExists
            | Self::DirectoryNotEmpty
            | Self::VolumeExists
            | Self::VolumeInUse
            | Self::TemplateExists
            | Self::TemplateInUse
            | Self::ApprovalPending
            | Self::ApprovalDecided => 409,
            Self::QuotaExceeded => 429,
            Self::NoSpace => 507,
            Self::PayloadTooLarge | Self::ImageTooLarge => 413,
            Self::Unsupported => 501,
            Self::Timeout => 504,
            Self::Unavailable | Self::SandboxRecovering => 503,
            Self::Internal => 500,
            Self::PortClosed | Self::RegistryUnreachable | Self::RegistryUnauthorized => 502,
            Self::BuildFailed | Self::KernelUnavailable => 422,
        }
    }
}

/// Every error response: `{"code": "...", "message": "..."}`, plus the offending field for
/// validation errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiErrorBody {
    /// Stable machine-readable code.
    pub code: ErrorCode,
    /// Human-readable explanation (may change between versions).
    pub message: String,
    /// The request field that is invalid (`invalid_request`), e.g. `limits.memory`, or the quota that
    /// refused (`quota_exceeded`), e.g. `max_snapshots`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The approval a held request waits on (`approval_pending`, `approval_rejected`,
    /// `approval_expired`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_str_matches_serde() {
        for code in [
            ErrorCode::Unauthorized,
            ErrorCode::SandboxNotFound,
            ErrorCode::QuotaExceeded,
            ErrorCode::InvalidRequest,
            ErrorCode::Internal,
            ErrorCode::DirectoryNotEmpty,
            ErrorCode::InvalidArchive,
            ErrorCode::VolumeNotFound,
            ErrorCode::SecretNotFound,
            ErrorCode::VolumeExists,
            ErrorCode::VolumeInUse,
            ErrorCode::TemplateNotFound,
            ErrorCode::TemplateExists,
            ErrorCode::TemplateInUse,
            ErrorCode::InvalidImage,
            ErrorCode::ImageNotFound,
            ErrorCode::ImageTooLarge,
            ErrorCode::RegistryUnreachable,
            ErrorCode::RegistryUnauthorized,
            ErrorCode::BuildFailed,
            ErrorCode::ContextNotFound,
            ErrorCode::KernelUnavailable,
            ErrorCode::PolicyNotFound,
            ErrorCode::PolicyDenied,
            ErrorCode::ApprovalPending,
            ErrorCode::ApprovalRejected,
            ErrorCode::ApprovalExpired,
            ErrorCode::ApprovalNotFound,
            ErrorCode::ApprovalDecided,
            ErrorCode::ExecutionNotFound,
        ] {
            let json = serde_json::to_string(&code).expect("serializes");
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }
}
