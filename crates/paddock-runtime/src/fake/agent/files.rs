//! File requests over the sandbox's in-memory view: read, write, list (in pages), stat, mkdir,
//! remove, rename. Relative paths start at the default user's home, as the real agent's; errors
//! carry the real agent's codes and messages (`"{op} {path:?}: {errno text}"`).

use paddock_protocol::{
    AgentError, ErrorCode, FileKind, FileStat, Reply, Request, MAX_HEADER_LEN, MAX_PAYLOAD_LEN,
};

use super::outbound::{agent_error, Answer};
use super::shell::User;
use super::Agent;
use crate::fake::fs::{Entry, FsError};
use crate::fake::tree::NodeKind;

/// JSON bytes of entries per listing page.
const PAGE_BUDGET: usize = MAX_HEADER_LEN - 1024;
const DEFAULT_FILE_MODE: u32 = 0o644;
const DEFAULT_DIR_MODE: u32 = 0o755;

fn fs_error(op: &str, path: &str, e: FsError) -> AgentError {
    agent_error(e.code(), format!("{op} {path:?}: {}", e.io()))
}

/// The path inside the sandbox for request path `path`.
pub(crate) fn sandbox_path(agent: &Agent, path: &str) -> Result<String, AgentError> {
    if path.is_empty() || path.contains('\0') {
        return Err(agent_error(
            ErrorCode::InvalidPath,
            format!("invalid path {path:?}"),
        ));
    }
    if path.starts_with('/') {
        return Ok(path.to_owned());
    }
    let home = User::lookup(agent, &agent.default_user)?.home;
    Ok(format!("{}/{path}", home.trim_end_matches('/')))
}

/// The protocol form of an entry.
pub(crate) fn file_stat(entry: Entry) -> FileStat {
    let (kind, symlink_target) = match &entry.node.kind {
        NodeKind::File(_) => (FileKind::File, None),
        NodeKind::Dir(_) => (FileKind::Dir, None),
        NodeKind::Symlink(target) => (FileKind::Symlink, Some(target.clone())),
    };
    FileStat {
        name: entry.name,
        kind,
        size: entry.node.size(),
        mode: entry.node.mode,
        uid: entry.node.uid,
        gid: entry.node.gid,
        mtime_ms: entry.node.mtime_ms,
        symlink_target,
    }
}

/// The owner of files a request creates: `user`'s (or the default user's) uid and gid.
fn owner(agent: &Agent, user: Option<&str>) -> Result<(u32, u32), AgentError> {
    let user = User::lookup(agent, user.unwrap_or(&agent.default_user))?;
    Ok((user.uid, user.gid))
}

/// Answers a file request.
pub(crate) fn answer(agent: &Agent, request: Request, payload: &[u8]) -> Answer {
    let done = Ok((Reply::Done, Vec::new()));
    match request {
        Request::ReadFile {
            path,
            offset,
            max_len,
        } => {
            let resolved = sandbox_path(agent, &path)?;
            let want = max_len
                .map_or(MAX_PAYLOAD_LEN, |m| m as usize)
                .min(MAX_PAYLOAD_LEN);
            let (data, size) = agent
                .read_fs(|fs| fs.read(&resolved, offset, want))
                .map_err(|e| fs_error("read", &path, e))?;
            let eof = data.len() < want || (size > 0 && offset + data.len() as u64 >= size);
            Ok((Reply::FileData { eof, size }, data))
        }
        Request::WriteFile {
            path,
            offset,
            truncate,
            mode,
            user,
        } => {
            let resolved = sandbox_path(agent, &path)?;
            let (uid, gid) = owner(agent, user.as_deref())?;
            let mode = mode.unwrap_or(DEFAULT_FILE_MODE);
            agent
                .change_fs(|fs| fs.write(&resolved, offset, truncate, payload, (mode, uid, gid)))
                .map_err(|e| fs_error("write", &path, e))?;
            Ok((
                Reply::Written {
                    bytes: payload.len() as u64,
                },
                Vec::new(),
            ))
        }
        Request::ListDir { path, after } => {
            let resolved = sandbox_path(agent, &path)?;
            let entries = agent
                .read_fs(|fs| fs.list(&resolved))
                .map_err(|e| fs_error("list", &path, e))?;
            let mut page = Vec::new();
            let mut used = 2;
            let mut more = false;
            for stat in entries
                .into_iter()
                .map(file_stat)
                .filter(|e| after.as_deref().is_none_or(|a| e.name.as_str() > a))
            {
                let size = serde_json::to_vec(&stat).map_or(PAGE_BUDGET, |v| v.len()) + 1;
                if used + size > PAGE_BUDGET && !page.is_empty() {
                    more = true;
                    break;
                }
                used += size;
                page.push(stat);
            }
            Ok((Reply::Entries { entries: page, more }, Vec::new()))
        }
        Request::Stat { path } => {
            let resolved = sandbox_path(agent, &path)?;
            let entry = agent
                .read_fs(|fs| fs.stat(&resolved))
                .map_err(|e| fs_error("stat", &path, e))?;
            Ok((
                Reply::Stat {
                    stat: file_stat(entry),
                },
                Vec::new(),
            ))
        }
        Request::Mkdir {
            path,
            parents,
            mode,
            user,
        } => {
            let resolved = sandbox_path(agent, &path)?;
            let (uid, gid) = owner(agent, user.as_deref())?;
            let mode = mode.unwrap_or(DEFAULT_DIR_MODE);
            agent
                .change_fs(|fs| fs.mkdir(&resolved, parents, (mode, uid, gid)))
                .map_err(|e| fs_error("mkdir", &path, e))?;
            done
        }
        Request::Remove { path, recursive } => {
            let resolved = sandbox_path(agent, &path)?;
            agent
                .change_fs(|fs| fs.remove(&resolved, recursive))
                .map_err(|e| fs_error("remove", &path, e))?;
            done
        }
        Request::Rename { from, to } => {
            let source = sandbox_path(agent, &from)?;
            let target = sandbox_path(agent, &to)?;
            agent
                .change_fs(|fs| fs.rename(&source, &target))
                .map_err(|e| fs_error("rename", &format!("{from} -> {to}"), e))?;
            done
        }
        Request::Prefetch { paths } => {
            use paddock_protocol::{PREFETCH_MAX_FILE_BYTES, PREFETCH_MAX_PATHS};
            if paths.len() > PREFETCH_MAX_PATHS {
                return Err(agent_error(
                    ErrorCode::BadRequest,
                    format!("at most {PREFETCH_MAX_PATHS} paths may be prefetched at once"),
                ));
            }
            let (mut files, mut bytes) = (0u32, 0u64);
            for path in paths.iter().filter(|p| p.starts_with('/')) {
                let max = PREFETCH_MAX_FILE_BYTES as usize;
                if let Ok((data, _)) = agent.read_fs(|fs| fs.read(path, 0, max)) {
                    files += 1;
                    bytes += data.len() as u64;
                }
            }
            Ok((Reply::Prefetched { files, bytes }, Vec::new()))
        }
        _ => Err(agent_error(ErrorCode::BadRequest, "not a file request")),
    }
}
