//! The service's one error type: a stable code, a message safe to show a client, and the field a
//! validation error is about. Internal causes are logged where they happen, never put in `message`.

use std::io;

use paddock_runtime::agent_client::AgentClientError;
use paddock_runtime::RuntimeError;
use paddock_store::StoreError;
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
    /// The approval a held request waits on (`approval_pending`, `approval_rejected`,
    /// `approval_expired`).
    pub approval_id: Option<String>,
}

impl ServiceError {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: None,
            approval_id: None,
        }
    }

    /// A validation error about `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: ErrorCode::InvalidRequest,
            message: message.into(),
            field: Some(field.into()),
            approval_id: None,
        }
    }

    /// An error about the held request's approval `id`.
    pub fn approval(code: ErrorCode, id: &str, message: impl Into<String>) -> Self {
        Self {
            approval_id: Some(id.to_owned()),
            ..Self::new(code, message)
        }
    }

    /// No such sandbox (also what another tenant's sandbox looks like).
    pub fn sandbox_not_found(id: &str) -> Self {
        Self::new(ErrorCode::SandboxNotFound, format!("sandbox {id} not found"))
    }

    /// No snapshot `id` of the caller's tenant (also what another tenant's snapshot looks like).
    pub fn snapshot_not_found(id: &str) -> Self {
        Self::new(ErrorCode::SnapshotNotFound, format!("snapshot {id} not found"))
    }

    /// A live sandbox whose handle was taken: it is being destroyed, stopped or rolled back.
    pub(crate) fn sandbox_ending(id: &str) -> Self {
        Self::new(ErrorCode::SandboxNotRunning, format!("sandbox {id} is ending"))
    }

    /// An internal failure: logs `cause` and returns an error that does not reveal it.
    pub fn internal(what: &str, cause: &dyn std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "{what}");
        Self::new(
            ErrorCode::Internal,
            format!("internal error while trying to {what}"),
        )
    }

    /// A write the database refused because the state directory's file system is full.
    pub fn state_directory_full() -> Self {
        Self::new(
            ErrorCode::NoSpace,
            "the state directory's file system is full: paddock cannot record changes, so it refuses \
             them until space is freed there (reads still work)",
        )
    }

    /// The storage pool had no room for what an operation had to write.
    pub fn pool_full() -> Self {
        Self::new(
            ErrorCode::NoSpace,
            "the storage pool is full: delete sandboxes, snapshots or volumes to free space (space \
             from just-deleted ones can take a few seconds to be reclaimed; retry then)",
        )
    }

    /// The API error of a failed backend operation `what`: the request's own fault, an unsupported
    /// operation, a full pool, or (logged) an internal failure.
    pub fn from_runtime(what: &'static str, e: RuntimeError) -> Self {
        match e {
            RuntimeError::InvalidSpec(message) => ServiceError::new(ErrorCode::InvalidRequest, message),
            RuntimeError::Unsupported(message) => ServiceError::new(ErrorCode::Unsupported, message),
            other if runtime_no_space(&other) => {
                tracing::warn!(error = %other, "the storage pool is full: failed to {what}");
                ServiceError::pool_full()
            }
            other => ServiceError::internal(what, &other),
        }
    }

    /// The JSON body of this error.
    pub fn body(&self) -> ApiErrorBody {
        ApiErrorBody {
            code: self.code,
            message: self.message.clone(),
            field: self.field.clone(),
            approval_id: self.approval_id.clone(),
        }
    }
}

/// Whether a backend failure was the pool running out of space: an `ENOSPC` or `EDQUOT` anywhere in
/// its chain of causes, or, for the failures that arrive as text (the setup shim answers with a
/// message, the agent with its own), that errno's message in the text.
fn runtime_no_space(e: &RuntimeError) -> bool {
    match e {
        RuntimeError::Setup(text) | RuntimeError::Agent(text) | RuntimeError::Teardown(text) => {
            text_says_no_space(text)
        }
        other => chain_has_no_space(other),
    }
}

pub(crate) fn chain_has_no_space(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if io_no_space(io) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

fn io_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || matches!(
            e.kind(),
            io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
        )
}

/// Whether a failure reported as text names `ENOSPC` or `EDQUOT`, as `io::Error`'s display does
/// ("No space left on device (os error 28)").
fn text_says_no_space(text: &str) -> bool {
    [libc::ENOSPC, libc::EDQUOT]
        .into_iter()
        .any(|errno| text.contains(&io::Error::from_raw_os_error(errno).to_string()))
}

/// The API error of a failed store operation that the caller has no more specific answer for.
pub(crate) fn store_no_space(e: &StoreError) -> Option<ServiceError> {
    e.is_no_space().then(ServiceError::state_directory_full)
}

/// Maps an agent error on a process operation to the API's codes.
pub(crate) fn process_error(what: &'static str, pid: u32, e: AgentClientError) -> ServiceError {
    use paddock_protocol::ErrorCode as A;
    match &e {
        AgentClientError::Agent(err) => match err.code {
            A::ProcessNotFound => {
                ServiceError::new(ErrorCode::ProcessNotFound, format!("process {pid} not found"))
            }
            A::ProcessExited => {
                ServiceError::new(ErrorCode::ProcessNotFound, format!("process {pid} has exited"))
            }
            A::UnknownUser => ServiceError::invalid("user", err.message.clone()),
            A::NotFound | A::NotADirectory => ServiceError::invalid("cwd", err.message.clone()),
            A::ExecFailed => ServiceError::invalid("argv", err.message.clone()),
            A::BadRequest | A::InvalidPath => {
                ServiceError::new(ErrorCode::InvalidRequest, err.message.clone())
            }
            A::PermissionDenied => ServiceError::new(ErrorCode::PermissionDenied, err.message.clone()),
            _ => ServiceError::internal(what, &e),
        },
        AgentClientError::Timeout { .. } => ServiceError::new(
            ErrorCode::Timeout,
            format!("the sandbox did not answer in time ({what})"),
        ),
        AgentClientError::Closed => ServiceError::new(ErrorCode::SandboxNotRunning, "the sandbox has ended"),
        AgentClientError::TooLarge { len, max, .. } => ServiceError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "the command with its environment and settings is {len} bytes, more than the {max} a \
                 request may be: write a long script to a file and run the file"
            ),
        ),
        _ => ServiceError::internal(what, &e),
    }
}

pub(crate) fn volume_not_found(id: &str) -> ServiceError {
    ServiceError::new(ErrorCode::VolumeNotFound, format!("volume {id} not found"))
}

pub(crate) fn volume_exists(name: &str) -> ServiceError {
    ServiceError::new(
        ErrorCode::VolumeExists,
        format!("a volume named {name} already exists"),
    )
}

pub(crate) fn snapshot_not_found(id: &str) -> ServiceError {
    ServiceError::snapshot_not_found(id)
}

/// The message and field of a quota refusal, in the quota's own units.
pub(crate) fn quota_exceeded(what: &'static str, limit: u64, requested_total: u64) -> ServiceError {
    let show = |v: u64| match what {
        "max_memory" | "max_storage" => paddock_types::ByteSize::bytes(v).to_string(),
        "max_cpus" => format!("{} cpus", v as f64 / 1000.0),
        _ => v.to_string(),
    };
    let noun = match what {
        "max_sandboxes" => "sandboxes (running, paused and stopped)",
        "max_memory" => "memory of running sandboxes",
        "max_cpus" => "CPUs of running sandboxes",
        "max_snapshots" => "snapshots (checkpoints and imports included)",
        "max_volumes" => "volumes",
        "max_pending_approvals" => "approvals waiting for a person",
        "max_pending_approvals_per_sandbox" => "approvals waiting for a person about one sandbox",
        "max_templates" => "templates (built and being built)",
        "max_storage" => "storage (sandbox disks, snapshots, volumes and templates)",
        other => other,
    };
    ServiceError {
        code: ErrorCode::QuotaExceeded,
        message: format!(
            "tenant quota exceeded: {what} ({noun}) is {}, this request would make it {}",
            show(limit),
            show(requested_total)
        ),
        field: Some(what.to_owned()),
        approval_id: None,
    }
}

/// A snapshot id read back from the store. Every id the store holds was parsed on its way in, so one
/// that does not parse is a damaged record: an internal error, never skipped.
pub(crate) fn stored_snapshot_id(id: &str) -> Result<paddock_types::SnapshotId, ServiceError> {
    id.parse()
        .map_err(|e| ServiceError::internal("read a stored snapshot id", &e))
}

/// A sandbox id read back from the store (see [`stored_snapshot_id`]).
pub(crate) fn stored_sandbox_id(id: &str) -> Result<paddock_types::SandboxId, ServiceError> {
    id.parse()
        .map_err(|e| ServiceError::internal("read a stored sandbox id", &e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn pool(source: io::Error) -> RuntimeError {
        RuntimeError::Pool {
            what: "snapshot",
            path: PathBuf::from("/pool/sandboxes/x"),
            source,
        }
    }

    #[test]
    fn enospc_and_edquot_in_the_chain_are_no_space() {
        for errno in [libc::ENOSPC, libc::EDQUOT] {
            let e = ServiceError::from_runtime("snapshot", pool(io::Error::from_raw_os_error(errno)));
            assert_eq!(e.code, ErrorCode::NoSpace, "{errno}");
        }
        let wrapped = io::Error::new(io::ErrorKind::StorageFull, "tar: failed to unpack");
        assert_eq!(
            ServiceError::from_runtime("import", pool(wrapped)).code,
            ErrorCode::NoSpace
        );
    }

    #[test]
    fn the_setup_shims_text_is_read() {
        let text = format!(
            "snapshot the template: {}",
            io::Error::from_raw_os_error(libc::ENOSPC)
        );
        let e = ServiceError::from_runtime("create a sandbox", RuntimeError::Setup(text));
        assert_eq!(e.code, ErrorCode::NoSpace);
    }

    #[test]
    fn other_failures_stay_internal() {
        let e = ServiceError::from_runtime("snapshot", pool(io::Error::from_raw_os_error(libc::EIO)));
        assert_eq!(e.code, ErrorCode::Internal);
        let e = ServiceError::from_runtime("create", RuntimeError::Setup("mount failed: EPERM".into()));
        assert_eq!(e.code, ErrorCode::Internal);
        let e = ServiceError::from_runtime("create", RuntimeError::InvalidSpec("bad".into()));
        assert_eq!(e.code, ErrorCode::InvalidRequest);
    }
}
