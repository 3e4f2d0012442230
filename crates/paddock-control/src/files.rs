//! Files inside a sandbox; every path resolves inside the sandbox root (the agent opens it with
//! `openat2(RESOLVE_IN_ROOT)`), and tar archives are made and unpacked by `tar` running inside the
//! sandbox as the sandbox's user, so neither can reach a host path.

use paddock_types::api::{ErrorCode, FileEntry, FileList, MkdirRequest, RenameRequest, WrittenFile};

use crate::{ByteStream, FileDownload, Principal, SandboxService, ServiceError, WatchStream};

fn pending() -> ServiceError {
    ServiceError::new(ErrorCode::Unsupported, "not implemented yet")
}

/// How [`SandboxService::write_file`] creates a file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteFileOptions {
    /// Permission bits if the file is created (default 0o644).
    pub mode: Option<u32>,
    /// Owner if the file is created (the sandbox's default user when absent).
    pub user: Option<String>,
}

impl SandboxService {
    /// Streams a file's contents.
    pub async fn read_file(&self, p: &Principal, id: &str, path: &str) -> Result<FileDownload, ServiceError> {
        let _ = (p, id, path);
        Err(pending())
    }

    /// Writes (replaces) a file from a stream, never holding more than one chunk in memory.
    pub async fn write_file(
        &self,
        p: &Principal,
        id: &str,
        path: &str,
        options: WriteFileOptions,
        body: ByteStream,
    ) -> Result<WrittenFile, ServiceError> {
        let _ = (p, id, path, options, body);
        Err(pending())
    }

    /// Lists a directory.
    pub async fn list_dir(&self, p: &Principal, id: &str, path: &str) -> Result<FileList, ServiceError> {
        let _ = (p, id, path);
        Err(pending())
    }

    /// Metadata of one path (symlinks not followed).
    pub async fn stat_file(&self, p: &Principal, id: &str, path: &str) -> Result<FileEntry, ServiceError> {
        let _ = (p, id, path);
        Err(pending())
    }

    /// Creates a directory.
    pub async fn make_dir(
        &self,
        p: &Principal,
        id: &str,
        req: MkdirRequest,
    ) -> Result<FileEntry, ServiceError> {
        let _ = (p, id, req);
        Err(pending())
    }

    /// Removes a file, or a directory (`recursive` for a non-empty one).
    pub async fn remove_file(
        &self,
        p: &Principal,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<(), ServiceError> {
        let _ = (p, id, path, recursive);
        Err(pending())
    }

    /// Renames (moves) a path.
    pub async fn rename_file(
        &self,
        p: &Principal,
        id: &str,
        req: RenameRequest,
    ) -> Result<FileEntry, ServiceError> {
        let _ = (p, id, req);
        Err(pending())
    }

    /// Streams a tar archive of a directory.
    pub async fn download_tar(
        &self,
        p: &Principal,
        id: &str,
        path: &str,
    ) -> Result<ByteStream, ServiceError> {
        let _ = (p, id, path);
        Err(pending())
    }

    /// Unpacks a tar archive into a directory (created if missing).
    pub async fn upload_tar(
        &self,
        p: &Principal,
        id: &str,
        path: &str,
        body: ByteStream,
    ) -> Result<(), ServiceError> {
        let _ = (p, id, path, body);
        Err(pending())
    }

    /// Streams the changes under a directory.
    pub async fn watch_dir(
        &self,
        p: &Principal,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<WatchStream, ServiceError> {
        let _ = (p, id, path, recursive);
        Err(pending())
    }
}
