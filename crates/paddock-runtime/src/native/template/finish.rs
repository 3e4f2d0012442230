//! The last steps of a build, on the complete tree: the directories paddock binds, the default
//! user, and the template's record.
//!
//! The tree is the image's (untrusted): every access is fd-relative inside it, never through a
//! symlink ([`Root`] with [`Symlinks::Refuse`]), bounded, and replaces rather than writes through.

use std::io;
use std::path::Path;

use paddock_sys::fs_in_root::{EntryKind, Owner, Root, Symlinks};
use serde::{Deserialize, Serialize};

use crate::native::image::ImageError;
use crate::native::users::IdRange;
use crate::RuntimeError;

/// The record's name at a template's root.
pub(super) const RECORD: &str = ".paddock-template.json";
/// Bumped when the record's meaning changes.
pub(super) const RECORD_VERSION: u32 = 1;
/// Most bytes of `/etc/passwd` or `/etc/group` read.
const MAX_ACCOUNTS_BYTES: u64 = 1 << 20;
/// The uid (and gid) the user `user` gets when free; else the next free one.
const DEFAULT_UID: u32 = 1000;

/// What a template records about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TemplateRecord {
    /// [`RECORD_VERSION`].
    pub(super) version: u32,
    /// The cached chains it was built from (`cache.rs`): what it keeps alive.
    pub(super) chain: Vec<String>,
    /// Its image's manifest digest (`recipe:<key>` for one made by a recipe's step).
    pub(super) digest: String,
    /// Its process defaults (absent in records written before they were kept).
    #[serde(default)]
    pub(super) config: paddock_types::ImageConfig,
}

fn tree_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> RuntimeError + 'a {
    crate::native::pool::pool_err(what, path)
}

/// Top-level names a recipe may ask for: not paddock's own (`proc`, `dev`, `sys` are mounted; the
/// record's name) and one plain component.
fn valid_top_level(name: &str) -> bool {
    !name.is_empty()
        && !matches!(name, "." | ".." | "proc" | "dev" | "sys" | RECORD)
        && !name.contains(['/', '\0'])
        && name.len() <= 255
}

/// Makes each of `names` a directory at the top of the tree at `tree` (0755, the sandbox's root),
/// where the image has nothing of that name: a template's top level is what its sandboxes can
/// use, so a recipe's `WORKDIR /app` or `COPY . /app` needs `/app` there first. An entry already
/// there is left as it is (a directory, or whatever the image made it).
pub(super) fn add_top_level_dirs(tree: &Path, names: &[String], ids: IdRange) -> Result<(), RuntimeError> {
    let root = Root::open(tree).map_err(tree_err("open", tree))?;
    let owner = Owner {
        uid: ids.host_uid(0),
        gid: ids.host_gid(0),
    };
    for name in names {
        if !valid_top_level(name) {
            return Err(RuntimeError::InvalidSpec(format!(
                "{name:?} cannot be a template's top-level directory"
            )));
        }
        match root.lstat(Path::new(name)) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => root
                .mkdir(Path::new(name), 0o755, Some(owner))
                .map_err(tree_err("create", &tree.join(name)))?,
            Err(e) => return Err(tree_err("stat", &tree.join(name))(e)),
        }
    }
    Ok(())
}

/// Adds what sandboxes need to the tree at `tree`: `etc`, `home`, `root` and `tmp` as directories
/// (refused with [`RuntimeError::Image`] if the image made one something else, such as a symlink),
/// `root` when the image has no accounts, and the user `user` with its group and home when
/// the image has no user of that name. Returns whether `user` was added.
pub(super) fn complete(tree: &Path, ids: IdRange) -> Result<bool, RuntimeError> {
    let root = Root::open(tree).map_err(tree_err("open", tree))?;
    let sandbox_root = Owner {
        uid: ids.host_uid(0),
        gid: ids.host_gid(0),
    };
    for (dir, mode) in [("etc", 0o755), ("home", 0o755), ("root", 0o700), ("tmp", 0o1777)] {
        match root.lstat(Path::new(dir)) {
            Ok(stat) if stat.kind == EntryKind::Dir => {}
            Ok(_) => {
                return Err(RuntimeError::Image(ImageError::invalid_image(format!(
                    "/{dir} in the image is not a directory (paddock mounts the sandbox's own there)"
                ))))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                root.mkdir(Path::new(dir), mode, Some(sandbox_root))
                    .map_err(tree_err("create", &tree.join(dir)))?;
                if mode & 0o7000 != 0 {
                    // mkdir applies the umask and drops the sticky bit's company: set it exactly.
                    let fd = root
                        .open_with(
                            Path::new(dir),
                            rustix::fs::OFlags::RDONLY
                                | rustix::fs::OFlags::DIRECTORY
                                | rustix::fs::OFlags::NOFOLLOW,
                            0,
                        )
                        .map_err(tree_err("open", &tree.join(dir)))?;
                    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(mode))
                        .map_err(|e| tree_err("chmod", &tree.join(dir))(e.into()))?;
                }
            }
            Err(e) => return Err(tree_err("stat", &tree.join(dir))(e)),
        }
    }
    let etc = root
        .open_dir(Path::new("etc"))
        .map_err(tree_err("open", &tree.join("etc")))?;
    let owner = Owner {
        uid: ids.host_uid(0),
        gid: ids.host_gid(0),
    };
    let mut passwd = read_accounts(&etc, "passwd", tree)?;
    let mut group = read_accounts(&etc, "group", tree)?;
    let (passwd_before, group_before) = (passwd.clone(), group.clone());
    // An image without accounts (`FROM scratch`) still runs as root: the agent names users from
    // `/etc/passwd`.
    if !has_name(&passwd, "root") && !has_id(&passwd, 0) {
        passwd = append_line(&passwd, "root:x:0:0:root:/root:/bin/sh");
    }
    if !has_name(&group, "root") && !has_id(&group, 0) {
        group = append_line(&group, "root:x:0:");
    }
    let added = !has_name(&passwd, "user");
    let mut ids_of_user = None;
    if added {
        let uid = first_free(&passwd, 2);
        let gid = match group_id(&group, "user") {
            Some(gid) => gid,
            None if !has_id(&group, uid) => uid,
            None => first_free(&group, 2),
        };
        passwd = append_line(&passwd, &format!("user:x:{uid}:{gid}:user:/home/user:/bin/sh"));
        if group_id(&group, "user").is_none() {
            group = append_line(&group, &format!("user:x:{gid}:"));
        }
        ids_of_user = Some((uid, gid));
    }
    for (name, before, now) in [
        ("passwd", &passwd_before, &passwd),
        ("group", &group_before, &group),
    ] {
        if before != now {
            etc.replace_file(Path::new(name), now.as_bytes(), 0o644, Some(owner))
                .map_err(tree_err("write", &tree.join("etc").join(name)))?;
        }
    }
    if let Some((uid, gid)) = ids_of_user {
        let home = root
            .open_dir(Path::new("home"))
            .map_err(tree_err("open", &tree.join("home")))?;
        if let Err(e) = home.lstat(Path::new("user")) {
            if e.kind() != io::ErrorKind::NotFound {
                return Err(tree_err("stat", &tree.join("home/user"))(e));
            }
            let user = Owner {
                uid: ids.host_uid(uid),
                gid: ids.host_gid(gid),
            };
            home.mkdir(Path::new("user"), 0o755, Some(user))
                .map_err(tree_err("create", &tree.join("home/user")))?;
        }
        // Else the image's own (whatever it is): the user's home as the image made it.
    }
    Ok(added)
}

fn has_name(table: &str, name: &str) -> bool {
    table.lines().any(|l| l.split(':').next() == Some(name))
}

fn has_id(table: &str, id: u32) -> bool {
    table
        .lines()
        .any(|l| l.split(':').nth(2).and_then(|f| f.parse::<u32>().ok()) == Some(id))
}

fn group_id(table: &str, name: &str) -> Option<u32> {
    table
        .lines()
        .find(|l| l.split(':').next() == Some(name))
        .and_then(|l| l.split(':').nth(2)?.parse().ok())
}

/// The image's `etc/<name>` ("" if absent), bounded; refused when it is not a regular file.
fn read_accounts(etc: &Root, name: &str, tree: &Path) -> Result<String, RuntimeError> {
    match etc.read_regular(Path::new(name), MAX_ACCOUNTS_BYTES, Symlinks::Refuse) {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(RuntimeError::Image(ImageError::invalid_image(format!(
            "/etc/{name} in the image cannot be read as a regular file of at most {MAX_ACCOUNTS_BYTES} bytes: {e} ({})",
            tree.display()
        )))),
    }
}

/// The smallest id from [`DEFAULT_UID`] up that column `column` of `table` does not use.
fn first_free(table: &str, column: usize) -> u32 {
    let used: std::collections::BTreeSet<u32> = table
        .lines()
        .filter_map(|l| l.split(':').nth(column)?.parse().ok())
        .collect();
    (DEFAULT_UID..)
        .find(|id| !used.contains(id))
        .unwrap_or(DEFAULT_UID)
}

fn append_line(table: &str, line: &str) -> String {
    let mut out = table.to_owned();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(line);
    out.push('\n');
    out
}

/// Writes `record` at the tree's root (replacing whatever the image put under that name).
pub(super) fn write_record(tree: &Path, record: &TemplateRecord, ids: IdRange) -> Result<(), RuntimeError> {
    let root = Root::open(tree).map_err(tree_err("open", tree))?;
    let json = serde_json::to_vec(record)
        .map_err(|e| tree_err("encode", &tree.join(RECORD))(io::Error::other(e)))?;
    let owner = Owner {
        uid: ids.host_uid(0),
        gid: ids.host_gid(0),
    };
    root.replace_file(Path::new(RECORD), &json, 0o600, Some(owner))
        .map_err(tree_err("write", &tree.join(RECORD)))
}

/// Reads the record of the template at `tree`.
pub(crate) fn read_record(tree: &Path) -> io::Result<TemplateRecord> {
    let bytes = Root::open(tree)?.read_regular(Path::new(RECORD), 1 << 20, Symlinks::Refuse)?;
    serde_json::from_slice(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ids_skip_the_used_ones() {
        assert_eq!(first_free("", 2), 1000);
        assert_eq!(
            first_free(
                "root:x:0:0::/root:/bin/sh\nnode:x:1000:1000::/home/node:/bin/sh\n",
                2
            ),
            1001
        );
        assert_eq!(append_line("a", "b"), "a\nb\n");
        assert_eq!(append_line("", "b"), "b\n");
    }
}
