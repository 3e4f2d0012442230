//! `Symlink`: create a symbolic link inside the sandbox, owned by the requested user. Its target is
//! stored as given: it resolves when the link is used, inside the sandbox.

use paddock_protocol::Reply;

use crate::agent::Agent;
use crate::error_code::fs_error;
use crate::files::path::sandbox_path;
use crate::outbound::Answer;

/// Answers `Symlink { path, target, user }`.
pub(crate) fn symlink(agent: &Agent, path: &str, target: &str, user: Option<&str>) -> Answer {
    let resolved = sandbox_path(agent, path)?;
    let owner = agent.owner(user)?;
    agent
        .root
        .symlink(&resolved, std::ffi::OsStr::new(target), Some(owner))
        .map_err(|err| fs_error("symlink", path, &err))?;
    Ok((Reply::Done, Vec::new()))
}
