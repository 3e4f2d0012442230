//! `Rename`: move a path within the sandbox, replacing the target.

use paddock_protocol::Reply;

use crate::agent::Agent;
use crate::error_code::fs_error;
use crate::files::path::sandbox_path;
use crate::outbound::Answer;

/// Answers `Rename { from, to }`.
pub(crate) fn rename(agent: &Agent, from: &str, to: &str) -> Answer {
    let source = sandbox_path(agent, from)?;
    let target = sandbox_path(agent, to)?;
    agent
        .root
        .rename(&source, &target)
        .map_err(|err| fs_error("rename", &format!("{from} -> {to}"), &err))?;
    Ok((Reply::Done, Vec::new()))
}
