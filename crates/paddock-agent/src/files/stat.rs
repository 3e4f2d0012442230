//! `Stat`: describe a path without following a final symlink.

use paddock_protocol::{FileKind, FileStat, Reply};
use paddock_sys::fs_in_root::{EntryKind, EntryStat};

use crate::agent::Agent;
use crate::error_code::fs_error;
use crate::files::path::sandbox_path;
use crate::outbound::Answer;

/// Answers `Stat { path }`.
pub(crate) fn stat(agent: &Agent, path: &str) -> Answer {
    let resolved = sandbox_path(agent, path)?;
    let entry = agent
        .root
        .lstat(&resolved)
        .map_err(|err| fs_error("stat", path, &err))?;
    Ok((
        Reply::Stat {
            stat: file_stat(entry),
        },
        Vec::new(),
    ))
}

/// The protocol form of an entry (names that are not UTF-8 are shown lossily).
pub(crate) fn file_stat(entry: EntryStat) -> FileStat {
    FileStat {
        name: entry.name.to_string_lossy().into_owned(),
        kind: match entry.kind {
            EntryKind::File => FileKind::File,
            EntryKind::Dir => FileKind::Dir,
            EntryKind::Symlink => FileKind::Symlink,
            EntryKind::Other => FileKind::Other,
        },
        size: entry.size,
        mode: entry.mode,
        uid: entry.uid,
        gid: entry.gid,
        mtime_ms: entry.mtime_ms,
        symlink_target: entry.symlink_target.map(|t| t.to_string_lossy().into_owned()),
    }
}
