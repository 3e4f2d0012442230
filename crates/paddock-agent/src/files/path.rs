//! Turning a request path into a path inside the root: absolute paths stay as they are (the kernel
//! resolves them inside the root), relative ones start at the default user's home.

use std::path::PathBuf;

use paddock_protocol::{AgentError, ErrorCode};

use crate::agent::Agent;
use crate::error_code::agent_error;

/// The in-root path for request path `path`.
pub(crate) fn sandbox_path(agent: &Agent, path: &str) -> Result<PathBuf, AgentError> {
    if path.is_empty() || path.contains('\0') {
        return Err(agent_error(
            ErrorCode::InvalidPath,
            format!("invalid path {path:?}"),
        ));
    }
    if path.starts_with('/') {
        return Ok(PathBuf::from(path));
    }
    let home = agent.user(None)?.home;
    Ok(PathBuf::from(home).join(path))
}
