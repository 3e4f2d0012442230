//! Files inside a sandbox. Every path resolves inside the sandbox root (the agent opens it with
//! `openat2(RESOLVE_IN_ROOT)`), and tar archives are made and unpacked by `tar` running inside the
//! sandbox as the sandbox's user, so neither can reach a host path.

pub(crate) mod accounts;
mod gate;
pub(crate) mod watch;

use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use paddock_policy::FileOp;
use paddock_protocol::{CommandSpec, FileKind, FileStat, SpawnRequest, Stream, MAX_PAYLOAD_LEN};
use paddock_runtime::agent_client::{AgentClientError, MkdirOptions, ProcessEvent, WriteOptions};
use paddock_types::api::{
    ErrorCode, FileEntry, FileKindBody, FileList, MkdirRequest, RenameRequest, WrittenFile,
};

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::LiveSandbox;
use crate::core::time::rfc3339;
use crate::{ByteStream, FileDownload, Principal, SandboxService, ServiceError, WatchStream};
use paddock_types::SandboxId;

/// Longest accepted path.
const MAX_PATH: usize = 4096;
/// Bytes of a tar's stderr kept for its error message.
const TAR_STDERR_MAX: usize = 16 * 1024;

/// How [`SandboxService::write_file`] creates a file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteFileOptions {
    /// Permission bits if the file is created (default 0o644).
    pub mode: Option<u32>,
    /// Owner if the file is created (the sandbox's default user when absent).
    pub user: Option<String>,
    /// Create missing parent directories first (mode 0o755, owned by `user`), as E2B's uploads do.
    pub parents: bool,
    /// The approval the write runs under, when the sandbox's approval policy asks.
    pub approval_id: Option<String>,
}

/// Maps an agent error on a file operation to the API's codes.
pub(crate) fn file_error(what: &'static str, path: &str, e: AgentClientError) -> ServiceError {
    use paddock_protocol::ErrorCode as A;
    match &e {
        AgentClientError::Agent(err) => {
            let code = match err.code {
                A::NotFound => ErrorCode::FileNotFound,
                A::AlreadyExists => ErrorCode::AlreadyExists,
                A::PermissionDenied => ErrorCode::PermissionDenied,
                A::NotADirectory => ErrorCode::NotADirectory,
                A::IsADirectory => ErrorCode::IsADirectory,
                A::DirectoryNotEmpty => ErrorCode::DirectoryNotEmpty,
                A::InvalidPath => ErrorCode::InvalidPath,
                A::NoSpace => ErrorCode::NoSpace,
                A::UnknownUser => return ServiceError::invalid("user", err.message.clone()),
                A::BadRequest => ErrorCode::InvalidRequest,
                _ => return ServiceError::internal(what, &e),
            };
            ServiceError::new(code, format!("{path}: {}", err.message))
        }
        _ => crate::core::error::process_error(what, 0, e),
    }
}

/// Checks an API path: absolute, no NUL, bounded. (Confinement itself is the agent's job.)
pub(crate) fn check_path(field: &str, path: &str) -> Result<(), ServiceError> {
    if !path.starts_with('/') {
        return Err(ServiceError {
            code: ErrorCode::InvalidPath,
            message: format!("{path:?} is not an absolute path"),
            field: Some(field.to_owned()),
            approval_id: None,
        });
    }
    if path.contains('\0') || path.len() > MAX_PATH {
        return Err(ServiceError {
            code: ErrorCode::InvalidPath,
            message: "paths cannot contain NUL bytes or exceed 4096 bytes".into(),
            field: Some(field.to_owned()),
            approval_id: None,
        });
    }
    Ok(())
}

fn not_regular(path: &str) -> ServiceError {
    ServiceError::invalid(
        "path",
        format!("{path} is not a regular file (a fifo, socket or device)"),
    )
}

/// The directory a file is in, `None` for `/` itself and for files right under it.
fn parent_dir(path: &str) -> Option<&str> {
    let (dir, _) = path.trim_end_matches('/').rsplit_once('/')?;
    let dir = dir.trim_end_matches('/');
    (!dir.is_empty()).then_some(dir)
}

fn join(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn entry(path: String, stat: FileStat) -> FileEntry {
    FileEntry {
        name: stat.name,
        path,
        kind: match stat.kind {
            FileKind::File => FileKindBody::File,
            FileKind::Dir => FileKindBody::Dir,
            FileKind::Symlink => FileKindBody::Symlink,
            FileKind::Other => FileKindBody::Other,
        },
        size: stat.size,
        mode: stat.mode,
        uid: stat.uid,
        gid: stat.gid,
        modified_at: rfc3339(stat.mtime_ms),
        symlink_target: stat.symlink_target,
    }
}

impl SandboxService {
    /// Streams a file's contents.
    pub async fn read_file(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
    ) -> Result<FileDownload, ServiceError> {
        check_path("path", path)?;
        let sb = self.owned_live(p, id).await?;
        let stat = sb
            .client
            .stat(path)
            .await
            .map_err(|e| file_error("stat a file", path, e))?;
        // Sizes of /proc files read as 0 and a symlink's is its target's length: those stream
        // without a known length.
        let known_size = match stat.kind {
            FileKind::Dir => {
                return Err(ServiceError::new(
                    ErrorCode::IsADirectory,
                    format!("{path} is a directory (download it as tar)"),
                ))
            }
            FileKind::Other => return Err(not_regular(path)),
            FileKind::File => (stat.size > 0).then_some(stat.size),
            FileKind::Symlink => None,
        };
        // Read the first chunk now, so "not found" or "permission denied" is an error response and
        // not a broken stream.
        let first = sb
            .client
            .read_file(path, 0, None)
            .await
            .map_err(|e| file_error("read a file", path, e))?;
        self.audit(
            AuditEntry::ok(p, AuditAction::FileRead, Some(id)).detail(audit::FileRead {
                path: path.to_owned(),
                bytes_out: first.size,
            }),
        )
        .await?;
        let size = known_size;
        let client = sb.client.clone();
        let path = path.to_owned();
        let state = (client, path, Some(first), 0u64, false);
        let stream =
            futures_util::stream::unfold(state, |(client, path, pending, offset, done)| async move {
                if done {
                    return None;
                }
                let chunk = match pending {
                    Some(chunk) => chunk,
                    None => match client.read_file(&path, offset, None).await {
                        Ok(chunk) => chunk,
                        Err(e) => {
                            let err = std::io::Error::other(format!("reading {path} failed: {e}"));
                            return Some((Err(err), (client, path, None, offset, true)));
                        }
                    },
                };
                let len = chunk.data.len() as u64;
                let finished = chunk.eof || len == 0;
                if len == 0 {
                    return None;
                }
                Some((
                    Ok(Bytes::from(chunk.data)),
                    (client, path, None, offset + len, finished),
                ))
            });
        Ok(FileDownload {
            size,
            stream: Box::pin(stream),
        })
    }

    /// Writes (replaces) a file from a stream, never holding more than one agent frame in memory.
    pub async fn write_file(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
        options: WriteFileOptions,
        mut body: ByteStream,
    ) -> Result<WrittenFile, ServiceError> {
        check_path("path", path)?;
        if options.mode.is_some_and(|m| m > 0o7777) {
            return Err(ServiceError::invalid("mode", "mode must be at most 0o7777"));
        }
        self.owned_live(p, id).await?;
        let request = serde_json::json!({
            "op": "write", "path": path, "mode": options.mode, "user": options.user, "parents": options.parents,
        });
        self.gate_file(
            p,
            id,
            &[(FileOp::Write, path)],
            request,
            options.approval_id.as_deref(),
        )
        .await?;
        let sb = self.owned_live(p, id).await?;
        // Writing into a fifo or a device would block or fail late: only files (new or existing).
        match sb.client.stat(path).await {
            Ok(stat) if stat.kind == FileKind::Other => return Err(not_regular(path)),
            Ok(stat) if stat.kind == FileKind::Dir => {
                return Err(ServiceError::new(
                    ErrorCode::IsADirectory,
                    format!("{path} is a directory"),
                ))
            }
            _ => {}
        }
        let user = options.user.clone().unwrap_or_else(|| sb.spec().user);
        if options.parents {
            if let Some(parent) = parent_dir(path) {
                let mkdir = MkdirOptions {
                    parents: true,
                    mode: None,
                    user: Some(user.clone()),
                };
                sb.client.mkdir(parent, &mkdir).await.map_err(|e| {
                    match file_error("create the parent directories", parent, e) {
                        // It exists, and is not a directory.
                        e if e.code == ErrorCode::AlreadyExists => ServiceError::new(
                            ErrorCode::NotADirectory,
                            format!("{parent} is not a directory"),
                        ),
                        e => e,
                    }
                })?;
            }
        }
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut written = 0u64;
        let mut first = true;
        loop {
            let next = body.next().await;
            let end = next.is_none();
            if let Some(chunk) = next {
                let chunk = chunk.map_err(|e| {
                    ServiceError::new(
                        ErrorCode::InvalidRequest,
                        format!("reading the request body failed: {e}"),
                    )
                })?;
                buf.extend_from_slice(&chunk);
            }
            while buf.len() >= MAX_PAYLOAD_LEN || (end && (first || !buf.is_empty())) {
                let take = buf.len().min(MAX_PAYLOAD_LEN);
                let write = WriteOptions {
                    offset: written,
                    truncate: first,
                    mode: options.mode,
                    user: Some(user.clone()),
                };
                written += sb
                    .client
                    .write_file(path, &buf[..take], &write)
                    .await
                    .map_err(|e| file_error("write a file", path, e))?;
                buf.drain(..take);
                first = false;
            }
            if end {
                break;
            }
        }
        self.audit(
            AuditEntry::ok(p, AuditAction::FileWrite, Some(id)).detail(audit::FileWritten {
                path: path.to_owned(),
                bytes_in: written,
            }),
        )
        .await?;
        Ok(WrittenFile {
            path: path.to_owned(),
            bytes: written,
        })
    }

    /// Lists a directory.
    pub async fn list_dir(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
    ) -> Result<FileList, ServiceError> {
        check_path("path", path)?;
        let sb = self.owned_live(p, id).await?;
        let entries = sb
            .client
            .list_dir(path)
            .await
            .map_err(|e| file_error("list a directory", path, e))?;
        self.audit(
            AuditEntry::ok(p, AuditAction::FileList, Some(id)).detail(audit::FilePath {
                path: path.to_owned(),
            }),
        )
        .await?;
        Ok(FileList {
            entries: entries
                .into_iter()
                .map(|stat| entry(join(path, &stat.name), stat))
                .collect(),
        })
    }

    /// Metadata of one path (symlinks not followed).
    pub async fn stat_file(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
    ) -> Result<FileEntry, ServiceError> {
        check_path("path", path)?;
        let sb = self.owned_live(p, id).await?;
        let stat = sb
            .client
            .stat(path)
            .await
            .map_err(|e| file_error("stat a file", path, e))?;
        Ok(entry(path.to_owned(), stat))
    }

    /// Creates a directory.
    pub async fn make_dir(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: MkdirRequest,
    ) -> Result<FileEntry, ServiceError> {
        check_path("path", &req.path)?;
        if req.mode.is_some_and(|m| m > 0o7777) {
            return Err(ServiceError::invalid("mode", "mode must be at most 0o7777"));
        }
        self.owned_live(p, id).await?;
        let request = serde_json::json!({
            "op": "mkdir", "path": req.path, "mode": req.mode, "user": req.user, "parents": req.parents,
        });
        self.gate_file(
            p,
            id,
            &[(FileOp::Write, &req.path)],
            request,
            req.approval_id.as_deref(),
        )
        .await?;
        let sb = self.owned_live(p, id).await?;
        let options = MkdirOptions {
            parents: req.parents,
            mode: req.mode,
            user: Some(req.user.clone().unwrap_or_else(|| sb.spec().user)),
        };
        sb.client
            .mkdir(&req.path, &options)
            .await
            .map_err(|e| file_error("create a directory", &req.path, e))?;
        self.audit(
            AuditEntry::ok(p, AuditAction::FileMkdir, Some(id)).detail(audit::FilePath {
                path: req.path.clone(),
            }),
        )
        .await?;
        let stat = sb
            .client
            .stat(&req.path)
            .await
            .map_err(|e| file_error("stat a directory", &req.path, e))?;
        Ok(entry(req.path, stat))
    }

    /// Removes a file, or a directory (`recursive` for a non-empty one).
    pub async fn remove_file(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
        recursive: bool,
        approval_id: Option<&str>,
    ) -> Result<(), ServiceError> {
        check_path("path", path)?;
        if path.trim_end_matches('/').is_empty() {
            return Err(ServiceError {
                code: ErrorCode::InvalidPath,
                message: "the root directory cannot be removed".into(),
                field: Some("path".into()),
                approval_id: None,
            });
        }
        self.owned_live(p, id).await?;
        let request = serde_json::json!({"op": "remove", "path": path, "recursive": recursive});
        self.gate_file(p, id, &[(FileOp::Delete, path)], request, approval_id)
            .await?;
        let sb = self.owned_live(p, id).await?;
        sb.client
            .remove(path, recursive)
            .await
            .map_err(|e| file_error("remove a file", path, e))?;
        self.audit(
            AuditEntry::ok(p, AuditAction::FileRemove, Some(id)).detail(audit::FilePathRecursive {
                path: path.to_owned(),
                recursive,
            }),
        )
        .await
    }

    /// Renames (moves) a path.
    pub async fn rename_file(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: RenameRequest,
    ) -> Result<FileEntry, ServiceError> {
        check_path("from", &req.from)?;
        check_path("to", &req.to)?;
        self.owned_live(p, id).await?;
        let request = serde_json::json!({"op": "rename", "from": req.from, "to": req.to});
        let parts = [
            (FileOp::Delete, req.from.as_str()),
            (FileOp::Write, req.to.as_str()),
        ];
        self.gate_file(p, id, &parts, request, req.approval_id.as_deref())
            .await?;
        let sb = self.owned_live(p, id).await?;
        sb.client
            .rename(&req.from, &req.to)
            .await
            .map_err(|e| file_error("rename a file", &req.from, e))?;
        self.audit(
            AuditEntry::ok(p, AuditAction::FileRename, Some(id)).detail(audit::FileRenamed {
                from: req.from.clone(),
                to: req.to.clone(),
            }),
        )
        .await?;
        let stat = sb
            .client
            .stat(&req.to)
            .await
            .map_err(|e| file_error("stat a file", &req.to, e))?;
        Ok(entry(req.to, stat))
    }

    /// Streams a tar archive of a directory, made by `tar` inside the sandbox.
    pub async fn download_tar(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
    ) -> Result<ByteStream, ServiceError> {
        check_path("path", path)?;
        let sb = self.owned_live(p, id).await?;
        let stat = sb
            .client
            .stat(path)
            .await
            .map_err(|e| file_error("stat a directory", path, e))?;
        if stat.kind != FileKind::Dir {
            return Err(ServiceError::new(
                ErrorCode::NotADirectory,
                format!("{path} is not a directory"),
            ));
        }
        // A connection of its own: a slow download must not stall the sandbox's shared connection.
        let client = sb.own_connection().await?;
        let (pid, events) = client
            .spawn(tar_spawn(
                &sb,
                vec![
                    "tar".into(),
                    "-C".into(),
                    path.into(),
                    "-cf".into(),
                    "-".into(),
                    ".".into(),
                ],
                false,
            ))
            .await
            .map_err(|e| tar_error(path, e))?;
        self.audit(
            AuditEntry::ok(p, AuditAction::FileTarDownload, Some(id)).detail(audit::TarDownload {
                path: path.to_owned(),
                pid,
            }),
        )
        .await?;
        let state = (client, events, Vec::<u8>::new(), false);
        let stream =
            futures_util::stream::unfold(state, |(client, mut events, mut stderr, done)| async move {
                if done {
                    return None;
                }
                loop {
                    match events.recv().await {
                        Some(ProcessEvent::Output {
                            stream: Stream::Stderr,
                            data,
                            ..
                        }) => {
                            crate::core::output::streams::append_capped(&mut stderr, &data, TAR_STDERR_MAX);
                        }
                        Some(ProcessEvent::Output { data, .. }) => {
                            return Some((Ok(Bytes::from(data)), (client, events, stderr, false)));
                        }
                        Some(ProcessEvent::Exited(status)) if status.shell_code() == 0 => return None,
                        Some(ProcessEvent::Exited(status)) => {
                            let message = format!(
                                "tar exited with {}: {}",
                                status.shell_code(),
                                String::from_utf8_lossy(&stderr).trim()
                            );
                            return Some((
                                Err(std::io::Error::other(message)),
                                (client, events, stderr, true),
                            ));
                        }
                        None => {
                            let err = std::io::Error::other("the sandbox ended during the download");
                            return Some((Err(err), (client, events, stderr, true)));
                        }
                    }
                }
            });
        Ok(Box::pin(stream))
    }

    /// Unpacks a tar archive into a directory (created if missing), with `tar` inside the sandbox.
    pub async fn upload_tar(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
        approval_id: Option<&str>,
        mut body: ByteStream,
    ) -> Result<(), ServiceError> {
        check_path("path", path)?;
        self.owned_live(p, id).await?;
        let request = serde_json::json!({"op": "untar", "path": path});
        self.gate_file(p, id, &[(FileOp::Write, path)], request, approval_id)
            .await?;
        let sb = self.owned_live(p, id).await?;
        let mkdir = MkdirOptions {
            parents: true,
            mode: None,
            user: Some(sb.spec().user),
        };
        sb.client
            .mkdir(path, &mkdir)
            .await
            .map_err(|e| file_error("create a directory", path, e))?;
        let client = sb.own_connection().await?;
        let argv = vec![
            "tar".into(),
            "-C".into(),
            path.into(),
            "-xf".into(),
            "-".into(),
            "--no-same-owner".into(),
        ];
        let (pid, mut events) = client
            .spawn(tar_spawn(&sb, argv, true))
            .await
            .map_err(|e| tar_error(path, e))?;
        // Events are consumed concurrently with the stdin writes (the connection's reader stops
        // when an events queue is full).
        let collector = tokio::spawn(async move {
            let mut stderr = Vec::new();
            while let Some(event) = events.recv().await {
                match event {
                    ProcessEvent::Output { data, .. } => {
                        crate::core::output::streams::append_capped(&mut stderr, &data, TAR_STDERR_MAX);
                    }
                    ProcessEvent::Exited(status) => return Some((status, stderr)),
                }
            }
            None
        });
        let mut bytes_in = 0u64;
        let mut feed_error = None;
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(chunk) => {
                    bytes_in += chunk.len() as u64;
                    if let Err(e) = client.write_stdin(pid, &chunk, false).await {
                        // tar stopped reading (a bad archive): its exit says why.
                        tracing::debug!(error = %e, "tar stdin closed early");
                        break;
                    }
                }
                Err(e) => {
                    feed_error = Some(e);
                    let _ = client.kill_tree(pid, None).await;
                    break;
                }
            }
        }
        let _ = client.write_stdin(pid, &[], true).await;
        let outcome = collector.await.ok().flatten();
        let result = match (feed_error, outcome) {
            (Some(e), _) => Err(ServiceError::new(
                ErrorCode::InvalidRequest,
                format!("reading the request body failed: {e}"),
            )),
            (None, Some((status, _))) if status.shell_code() == 0 => Ok(()),
            (None, Some((status, stderr))) => Err(ServiceError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "unpacking the archive failed (tar exited with {}): {}",
                    status.shell_code(),
                    String::from_utf8_lossy(&stderr).trim()
                ),
            )),
            (None, None) => Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                "the sandbox ended during the upload",
            )),
        };
        let entry = AuditEntry::ok(p, AuditAction::FileTarUpload, Some(id))
            .outcome(match &result {
                Ok(()) => "ok".to_owned(),
                Err(e) => e.code.as_str().to_owned(),
            })
            .detail(audit::TarUpload {
                path: path.to_owned(),
                pid,
                bytes_in,
            });
        self.audit(entry).await?;
        result
    }

    /// Streams the changes under a directory.
    pub async fn watch_dir(
        &self,
        p: &Principal,
        id: &SandboxId,
        path: &str,
        recursive: bool,
    ) -> Result<WatchStream, ServiceError> {
        check_path("path", path)?;
        let sb = self.owned_live(p, id).await?;
        crate::ops::files::watch::start_watch(self, p, id, &sb, path, recursive).await
    }
}

fn tar_spawn(sb: &Arc<LiveSandbox>, argv: Vec<String>, stdin: bool) -> SpawnRequest {
    SpawnRequest {
        command: CommandSpec::Argv { argv },
        env: Default::default(),
        cwd: Some("/".into()),
        user: Some(sb.spec().user),
        stdin,
        pty: None,
        timeout_ms: None,
        tag: Some("paddock:tar".into()),
        detached: false,
    }
}

fn tar_error(path: &str, e: AgentClientError) -> ServiceError {
    match e.code() {
        Some(paddock_protocol::ErrorCode::ExecFailed) => ServiceError::new(
            ErrorCode::Unsupported,
            "this sandbox has no `tar` program, which tar transfers need",
        ),
        _ => file_error("run tar", path, e),
    }
}

#[cfg(test)]
mod tests {
    use super::parent_dir;

    #[test]
    fn parents_of_paths() {
        assert_eq!(parent_dir("/home/user/a.txt"), Some("/home/user"));
        assert_eq!(parent_dir("/home//user//a.txt"), Some("/home//user"));
        assert_eq!(parent_dir("/home/user/d/"), Some("/home/user"));
        assert_eq!(parent_dir("/a.txt"), None);
        assert_eq!(parent_dir("//a.txt"), None);
        assert_eq!(parent_dir("/"), None);
    }
}
