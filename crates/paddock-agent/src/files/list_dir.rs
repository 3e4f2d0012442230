//! `ListDir`: a directory's entries, sorted by name, in pages that fit a reply header.

use paddock_protocol::{FileStat, Reply, MAX_HEADER_LEN};

use crate::agent::Agent;
use crate::error_code::fs_error;
use crate::files::path::sandbox_path;
use crate::files::stat::file_stat;
use crate::outbound::Answer;

/// JSON bytes of entries per page (the rest of the header is a few dozen bytes).
const PAGE_BUDGET: usize = MAX_HEADER_LEN - 1024;

/// Answers `ListDir { path, after }`: the entries named after `after`, as many as fit.
pub(crate) fn list_dir(agent: &Agent, path: &str, after: Option<&str>) -> Answer {
    let resolved = sandbox_path(agent, path)?;
    let entries = agent
        .root
        .list_dir(&resolved)
        .map_err(|err| fs_error("list", path, &err))?;
    let entries = entries
        .into_iter()
        .map(file_stat)
        .filter(|e| after.is_none_or(|a| e.name.as_str() > a));
    let (entries, more) = paginate(entries);
    Ok((Reply::Entries { entries, more }, Vec::new()))
}

/// Takes entries while their JSON fits [`PAGE_BUDGET`]; `more` when some were left.
fn paginate(entries: impl Iterator<Item = FileStat>) -> (Vec<FileStat>, bool) {
    let mut page = Vec::new();
    let mut used = 2;
    for entry in entries {
        let size = serde_json::to_vec(&entry).map_or(PAGE_BUDGET, |v| v.len()) + 1;
        if used + size > PAGE_BUDGET && !page.is_empty() {
            return (page, true);
        }
        used += size;
        page.push(entry);
    }
    (page, false)
}

#[cfg(test)]
mod tests {
    use paddock_protocol::FileKind;

    use super::*;

    #[test]
    fn pages_fit_the_header() {
        let entry = |i: usize| FileStat {
            name: format!("file-{i:05}-{}", "x".repeat(100)),
            kind: FileKind::File,
            size: 1,
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime_ms: 0,
            symlink_target: None,
        };
        let (page, more) = paginate((0..2000).map(entry));
        assert!(more);
        assert!(serde_json::to_vec(&page).expect("json").len() <= PAGE_BUDGET);
        let (page, more) = paginate((0..3).map(entry));
        assert_eq!((page.len(), more), (3, false));
    }
}
