//! `Mkdir`: create a directory (optionally with its parents), owned by the requested user.

use paddock_protocol::Reply;

use crate::agent::Agent;
use crate::error_code::fs_error;
use crate::files::path::sandbox_path;
use crate::outbound::Answer;

/// Mode of a new directory when the request gives none.
const DEFAULT_DIR_MODE: u32 = 0o755;

/// Answers `Mkdir { path, parents, mode, user }`.
pub(crate) fn mkdir(
    agent: &Agent,
    path: &str,
    parents: bool,
    mode: Option<u32>,
    user: Option<&str>,
) -> Answer {
    let resolved = sandbox_path(agent, path)?;
    let owner = agent.owner(user)?;
    let mode = mode.unwrap_or(DEFAULT_DIR_MODE);
    let result = if parents {
        agent.root.mkdir_all(&resolved, mode, Some(owner))
    } else {
        agent.root.mkdir(&resolved, mode, Some(owner))
    };
    result.map_err(|err| fs_error("mkdir", path, &err))?;
    Ok((Reply::Done, Vec::new()))
}
