//! `ReadFile`: up to 1 MiB of a file from an offset.

use std::os::unix::fs::FileExt;

use paddock_protocol::{ErrorCode, Reply, MAX_PAYLOAD_LEN};

use crate::agent::Agent;
use crate::error_code::{agent_error, fs_error};
use crate::files::path::sandbox_path;
use crate::outbound::Answer;

/// Answers `ReadFile { path, offset, max_len }` with the bytes as payload.
pub(crate) fn read_file(agent: &Agent, path: &str, offset: u64, max_len: Option<u32>) -> Answer {
    let resolved = sandbox_path(agent, path)?;
    let file = agent
        .root
        .open_read(&resolved)
        .map_err(|err| fs_error("read", path, &err))?;
    let meta = file.metadata().map_err(|err| fs_error("stat", path, &err))?;
    if meta.is_dir() {
        return Err(agent_error(
            ErrorCode::IsADirectory,
            format!("read {path:?}: is a directory"),
        ));
    }
    let size = meta.len();
    let want = max_len
        .map_or(MAX_PAYLOAD_LEN, |m| m as usize)
        .min(MAX_PAYLOAD_LEN);
    let mut data = vec![0u8; want];
    let mut filled = 0;
    let mut hit_end = false;
    while filled < want {
        match file.read_at(&mut data[filled..], offset + filled as u64) {
            Ok(0) => {
                hit_end = true;
                break;
            }
            Ok(n) => filled += n,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            // A FIFO or device with nothing to read right now: return what there is.
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(err) => return Err(fs_error("read", path, &err)),
        }
    }
    data.truncate(filled);
    let eof = hit_end || (size > 0 && offset + filled as u64 >= size);
    Ok((Reply::FileData { eof, size }, data))
}
