//! A recipe's `COPY` (and `ADD`) step in its sandbox: the planned directories, files and links
//! (`context::Context::select`) are made by the sandbox's agent, which resolves every path inside
//! the sandbox (a symlink in the image cannot send a write to the host), as `root` or the
//! `--chown` user, with the members' permission bits. Data streams from the stored context in
//! chunks. This module does not choose what is copied (`context.rs` does) or snapshot the result
//! (`recipe.rs` does).

use std::io::Read as _;

use paddock_runtime::agent_client::{MkdirOptions, WriteOptions};
use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;

use super::context::Kind;
use super::recipe::CopyRun;
use crate::{SandboxService, ServiceError};

/// Bytes read from the context and sent per write.
const CHUNK: usize = 1 << 20;

/// The owner `--chown` names (`root` without one): a user, optionally with its own group.
fn owner(chown: Option<&str>) -> Result<String, ServiceError> {
    let Some(chown) = chown else {
        return Ok("root".to_owned());
    };
    let (user, group) = chown.split_once(':').unwrap_or((chown, ""));
    if user.is_empty() || (!group.is_empty() && group != user) {
        return Err(ServiceError::new(
            ErrorCode::Unsupported,
            format!("--chown={chown}: only a user (and a group of the same name) is supported"),
        ));
    }
    Ok(user.to_owned())
}

fn failed(what: &str, path: &str, e: impl std::fmt::Display) -> ServiceError {
    ServiceError::new(
        ErrorCode::BuildFailed,
        format!("COPY could not {what} {path}: {e}"),
    )
}

/// Why `path` could not be made (`what`: "make the directory", "write"...): when the image has no
/// top-level entry it would be under (or be), that the top level is fixed (the mount plan binds
/// the image's own entries); else the agent's reason.
async fn create_failed(
    client: &paddock_runtime::agent_client::AgentClient,
    path: &str,
    what: &str,
    e: impl std::fmt::Display,
) -> ServiceError {
    let top = format!(
        "/{}",
        path.trim_start_matches('/').split('/').next().unwrap_or_default()
    );
    if client.stat(&top).await.is_err() {
        return ServiceError::new(
            ErrorCode::BuildFailed,
            format!(
                "COPY cannot make {path}: the image has no {top}, and a template's top level is fixed (copy into a directory)"
            ),
        );
    }
    failed(what, path, e)
}

/// Makes the directory `dest` goes in (and its parents), unless it is the root.
async fn parent_of(
    client: &paddock_runtime::agent_client::AgentClient,
    dest: &str,
    options: &MkdirOptions,
) -> Result<(), ServiceError> {
    if let Some((parent, _)) = dest.rsplit_once('/').filter(|(p, _)| !p.is_empty()) {
        if let Err(e) = client.mkdir(parent, options).await {
            return Err(create_failed(client, parent, "make the directory", e).await);
        }
    }
    Ok(())
}

impl SandboxService {
    /// Makes what `copy` places, in `sandbox`.
    pub(super) async fn copy_in(&self, sandbox: &SandboxId, copy: &CopyRun<'_>) -> Result<(), ServiceError> {
        let user = owner(copy.chown.as_deref())?;
        let sb = self
            .live_sandbox(sandbox.as_str())
            .ok_or_else(|| ServiceError::sandbox_ending(sandbox))?;
        let client = &sb.client;
        let mkdir = |mode: u32| MkdirOptions {
            parents: true,
            mode: Some(mode),
            user: Some(user.clone()),
        };
        for placed in copy.placed {
            let dest = placed.dest.as_str();
            let mode = placed.member.mode;
            let (offset, size) = match &placed.member.kind {
                Kind::Dir => {
                    if let Err(e) = client.mkdir(dest, &mkdir(mode)).await {
                        return Err(create_failed(client, dest, "make the directory", e).await);
                    }
                    continue;
                }
                Kind::File { offset, size, .. } => (*offset, *size),
                Kind::Symlink { target } => {
                    parent_of(client, dest, &mkdir(0o755)).await?;
                    // A file or link already there is replaced (a directory is not).
                    let _ = client.remove(dest, false).await;
                    if let Err(e) = client.symlink(dest, target, Some(&user)).await {
                        return Err(create_failed(client, dest, "make the link", e).await);
                    }
                    continue;
                }
            };
            parent_of(client, dest, &mkdir(0o755)).await?;
            // A file already there is replaced, with its owner and mode (a directory is not).
            let _ = client.remove(dest, false).await;
            let context = placed.from.clone().unwrap_or_else(|| copy.context.clone());
            let mut reader = tokio::task::spawn_blocking(move || context.open_at(offset))
                .await
                .map_err(|e| ServiceError::internal("read the build context", &e))?
                .map_err(|e| ServiceError::internal("read the build context", &e))?;
            let mut written = 0u64;
            loop {
                let want = (size - written).min(CHUNK as u64) as usize;
                let (chunk, back) = tokio::task::spawn_blocking(move || {
                    let mut chunk = vec![0u8; want];
                    let read = reader.read_exact(&mut chunk);
                    (read.map(|()| chunk), reader)
                })
                .await
                .map_err(|e| ServiceError::internal("read the build context", &e))?;
                reader = back;
                let chunk = chunk.map_err(|e| ServiceError::internal("read the build context", &e))?;
                let options = WriteOptions {
                    offset: written,
                    truncate: written == 0,
                    mode: Some(mode),
                    user: Some(user.clone()),
                };
                if let Err(e) = client.write_file(dest, &chunk, &options).await {
                    return Err(create_failed(client, dest, "write", e).await);
                }
                written += chunk.len() as u64;
                if written >= size {
                    break;
                }
            }
        }
        Ok(())
    }
}
