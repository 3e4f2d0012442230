//! `EntryInfo` from the service's `FileEntry`, as envd fills it: owner and group by name (the
//! number when the sandbox's account files have none), permission bits and Go's
//! `FileMode.String()`, RFC 3339 modification time; for a symlink, the type and permissions of
//! what it points to, its absolute target and `isSymlink`.
//!
//! Differences from envd: a directory's size is reported as 0 (E2B's own tests expect that);
//! a symlink's target is resolved by following the chain of links at its last component (each
//! target normalised lexically), not by resolving every intermediate component as
//! `filepath.EvalSymlinks` does; `metadata` (extended attributes) is never filled, the service
//! does not read them.

use paddock_types::api::{FileEntry, FileKindBody};

use crate::envd::filesystem::paths::{normalize, parent};
use crate::envd::proto::filesystem::{EntryInfo, FileType};
use crate::envd::proto::Timestamp;
use crate::envd::EnvdCaller;
use crate::E2bState;

use super::paths::UserContext;

/// Links followed before a chain counts as a loop (the kernel's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// What a symlink resolved to.
#[derive(Debug)]
struct Target {
    /// The last path of the chain, absolute.
    path: String,
    /// The entry there, when it exists and is no link.
    entry: Option<FileEntry>,
}

/// Follows the links from `entry` (a symlink) to what they point to.
async fn follow(state: &E2bState, caller: &EnvdCaller, entry: &FileEntry) -> Target {
    let mut path = entry.path.clone();
    let mut link = entry.symlink_target.clone();
    for _ in 0..MAX_LINKS {
        let Some(text) = link.take() else {
            break;
        };
        path = if text.starts_with('/') {
            normalize(&text)
        } else {
            normalize(&format!("{}/{text}", parent(&path)))
        };
        match state
            .service
            .stat_file(&caller.principal, &caller.id, &path)
            .await
        {
            Ok(next) if next.kind == FileKindBody::Symlink => link = next.symlink_target,
            Ok(next) => {
                return Target {
                    path,
                    entry: Some(next),
                }
            }
            Err(_) => break,
        }
    }
    Target { path, entry: None }
}

/// The `EntryInfo` of `entry`, reported at `path` (the path the caller named it by).
pub async fn entry_info(
    state: &E2bState,
    caller: &EnvdCaller,
    user: &UserContext,
    entry: &FileEntry,
    path: String,
) -> EntryInfo {
    let (file_type, mode, symlink_target) = match entry.kind {
        FileKindBody::Symlink => {
            let target = follow(state, caller, entry).await;
            match &target.entry {
                Some(t) => (type_of(&t.kind), t.mode, Some(target.path)),
                // A dangling link (or a loop): a symlink of its own permissions.
                None => (FileType::Symlink, entry.mode, Some(target.path)),
            }
        }
        ref kind => (type_of(kind), entry.mode, None),
    };
    let size = if file_type == FileType::Directory {
        0
    } else {
        i64::try_from(entry.size).unwrap_or(i64::MAX)
    };
    EntryInfo {
        name: entry.name.clone(),
        r#type: file_type as i32,
        path,
        size,
        mode: mode & 0o777,
        permissions: permissions(file_type, mode),
        owner: user.accounts.user_name(entry.uid),
        group: user.accounts.group_name(entry.gid),
        modified_time: Timestamp::parse(&entry.modified_at),
        is_symlink: symlink_target.is_some(),
        symlink_target,
        metadata: Default::default(),
    }
}

fn type_of(kind: &FileKindBody) -> FileType {
    match kind {
        FileKindBody::File => FileType::File,
        FileKindBody::Dir => FileType::Directory,
        FileKindBody::Symlink => FileType::Symlink,
        _ => FileType::Unspecified,
    }
}

/// Go's `FileMode.String()` for a file of this type and mode bits: one letter per special bit
/// (`d`, `L`, `u`, `g`, `t`, in Go's order) or `-`, then `rwxrwxrwx`.
pub fn permissions(file_type: FileType, mode: u32) -> String {
    let mut out = String::with_capacity(12);
    if file_type == FileType::Directory {
        out.push('d');
    }
    if file_type == FileType::Symlink {
        out.push('L');
    }
    if mode & 0o4000 != 0 {
        out.push('u');
    }
    if mode & 0o2000 != 0 {
        out.push('g');
    }
    if mode & 0o1000 != 0 {
        out.push('t');
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_as_go_writes_them() {
        assert_eq!(permissions(FileType::File, 0o644), "-rw-r--r--");
        assert_eq!(permissions(FileType::Directory, 0o755), "drwxr-xr-x");
        assert_eq!(permissions(FileType::Directory, 0o1777), "dtrwxrwxrwx");
        assert_eq!(permissions(FileType::File, 0o4755), "urwxr-xr-x");
        assert_eq!(permissions(FileType::Symlink, 0o777), "Lrwxrwxrwx");
        assert_eq!(permissions(FileType::File, 0), "----------");
    }
}
