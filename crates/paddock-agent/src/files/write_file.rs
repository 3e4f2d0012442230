//! `WriteFile`: write bytes at an offset, creating the file (owned by the requested user, with the
//! requested mode) if it does not exist.

use std::os::unix::fs::FileExt;

use paddock_protocol::Reply;

use crate::agent::Agent;
use crate::error_code::fs_error;
use crate::files::path::sandbox_path;
use crate::outbound::Answer;

/// Mode of a new file when the request gives none.
const DEFAULT_FILE_MODE: u32 = 0o644;

/// What to write where.
#[derive(Debug)]
pub(crate) struct WriteFile<'a> {
    pub(crate) path: &'a str,
    pub(crate) offset: u64,
    pub(crate) truncate: bool,
    pub(crate) mode: Option<u32>,
    pub(crate) user: Option<&'a str>,
    pub(crate) data: &'a [u8],
}

/// Answers `WriteFile` with the number of bytes written.
pub(crate) fn write_file(agent: &Agent, request: &WriteFile<'_>) -> Answer {
    let path = request.path;
    let resolved = sandbox_path(agent, path)?;
    let owner = agent.owner(request.user)?;
    let mode = request.mode.unwrap_or(DEFAULT_FILE_MODE);
    let file = match agent.root.create_new(&resolved, mode, Some(owner)) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => agent
            .root
            .open_write(&resolved)
            .map_err(|err| fs_error("write", path, &err))?,
        Err(err) => return Err(fs_error("create", path, &err)),
    };
    if request.truncate {
        file.set_len(request.offset)
            .map_err(|err| fs_error("truncate", path, &err))?;
    }
    file.write_all_at(request.data, request.offset)
        .map_err(|err| fs_error("write", path, &err))?;
    Ok((
        Reply::Written {
            bytes: request.data.len() as u64,
        },
        Vec::new(),
    ))
}
