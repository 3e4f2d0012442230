//! How failures become protocol errors: a stable [`ErrorCode`] plus a message that names the path or
//! pid involved.

use std::io;

use paddock_protocol::{AgentError, ErrorCode};

/// An [`AgentError`] with `code` and `message`.
pub(crate) fn agent_error(code: ErrorCode, message: impl Into<String>) -> AgentError {
    AgentError {
        code,
        message: message.into(),
    }
}

/// The error code for a system error (`errno`).
pub(crate) fn io_error_code(err: &io::Error) -> ErrorCode {
    match err.raw_os_error() {
        Some(libc::ENOENT) => ErrorCode::NotFound,
        Some(libc::EEXIST) => ErrorCode::AlreadyExists,
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => ErrorCode::PermissionDenied,
        Some(libc::ENOTDIR) => ErrorCode::NotADirectory,
        Some(libc::EISDIR) => ErrorCode::IsADirectory,
        Some(libc::ENOTEMPTY) => ErrorCode::DirectoryNotEmpty,
        // EXDEV: a resolution that would leave the root (or a rename across file systems); ELOOP: a
        // magic link or a symlink loop; EINVAL: NUL bytes or renaming a directory into itself.
        Some(libc::EXDEV | libc::ELOOP | libc::EINVAL | libc::ENAMETOOLONG) => ErrorCode::InvalidPath,
        Some(libc::ENOSPC | libc::EDQUOT) => ErrorCode::NoSpace,
        None if err.kind() == io::ErrorKind::InvalidInput => ErrorCode::InvalidPath,
        _ => ErrorCode::Io,
    }
}

/// The error for file operation `op` on `path` failing with `err`.
pub(crate) fn fs_error(op: &str, path: &str, err: &io::Error) -> AgentError {
    agent_error(io_error_code(err), format!("{op} {path:?}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        let code = |errno| io_error_code(&io::Error::from_raw_os_error(errno));
        assert_eq!(code(libc::ENOENT), ErrorCode::NotFound);
        assert_eq!(code(libc::EEXIST), ErrorCode::AlreadyExists);
        assert_eq!(code(libc::EPERM), ErrorCode::PermissionDenied);
        assert_eq!(code(libc::ENOTDIR), ErrorCode::NotADirectory);
        assert_eq!(code(libc::EISDIR), ErrorCode::IsADirectory);
        assert_eq!(code(libc::ENOTEMPTY), ErrorCode::DirectoryNotEmpty);
        assert_eq!(code(libc::EXDEV), ErrorCode::InvalidPath);
        assert_eq!(code(libc::ELOOP), ErrorCode::InvalidPath);
        assert_eq!(code(libc::EDQUOT), ErrorCode::NoSpace);
        assert_eq!(code(libc::EIO), ErrorCode::Io);
        let invalid = io::Error::new(io::ErrorKind::InvalidInput, "bad name");
        assert_eq!(io_error_code(&invalid), ErrorCode::InvalidPath);
        let e = fs_error("read", "/x", &io::Error::from_raw_os_error(libc::ENOENT));
        assert!(e.message.contains("\"/x\""), "{}", e.message);
    }
}
