//! `Remove`: unlink a file, symlink or directory; recursively without ever following a symlink.

use paddock_protocol::Reply;

use crate::agent::Agent;
use crate::error_code::fs_error;
use crate::files::path::sandbox_path;
use crate::outbound::Answer;

/// Answers `Remove { path, recursive }`.
pub(crate) fn remove(agent: &Agent, path: &str, recursive: bool) -> Answer {
    let resolved = sandbox_path(agent, path)?;
    let result = if recursive {
        agent.root.remove_tree(&resolved)
    } else {
        agent.root.remove(&resolved)
    };
    result.map_err(|err| fs_error("remove", path, &err))?;
    Ok((Reply::Done, Vec::new()))
}
