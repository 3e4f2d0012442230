//! Looking users up in the sandbox's own `/etc/passwd` and `/etc/group` (read through the confined
//! root, so a symlinked `/etc/passwd` cannot point outside the sandbox).

use std::io::Read;
use std::path::Path;

use paddock_protocol::{AgentError, ErrorCode};
use paddock_sys::fs_in_root::Root;

use crate::error_code::{agent_error, fs_error};

/// Largest account database read (the files are re-read for every lookup, so they stay current).
const MAX_DB_LEN: u64 = 8 << 20;

/// A user of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct User {
    /// Login name.
    pub(crate) name: String,
    /// User id.
    pub(crate) uid: u32,
    /// Primary group id.
    pub(crate) gid: u32,
    /// Home directory (absolute).
    pub(crate) home: String,
    /// Supplementary groups, the primary group first.
    pub(crate) groups: Vec<u32>,
}

/// Looks `name` up in `/etc/passwd` under `root`, with its groups from `/etc/group`.
pub(crate) fn lookup_user(root: &Root, name: &str) -> Result<User, AgentError> {
    let passwd = read_db(root, "/etc/passwd")?.unwrap_or_default();
    let Some(mut user) = parse_passwd(&passwd, name) else {
        return Err(agent_error(
            ErrorCode::UnknownUser,
            format!("user {name:?} is not in the sandbox's /etc/passwd"),
        ));
    };
    let group = read_db(root, "/etc/group")?.unwrap_or_default();
    user.groups = parse_groups(&group, name, user.gid);
    Ok(user)
}

fn read_db(root: &Root, path: &str) -> Result<Option<String>, AgentError> {
    let file = match root.open_read(Path::new(path)) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(fs_error("read", path, &err)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_DB_LEN)
        .read_to_end(&mut bytes)
        .map_err(|err| fs_error("read", path, &err))?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// Finds `name:x:uid:gid:gecos:home:shell`.
fn parse_passwd(text: &str, name: &str) -> Option<User> {
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 7 || fields[0] != name {
            return None;
        }
        let home = if fields[5].starts_with('/') {
            fields[5].to_owned()
        } else {
            format!("/{}", fields[5])
        };
        Some(User {
            name: name.to_owned(),
            uid: fields[2].parse().ok()?,
            gid: fields[3].parse().ok()?,
            home,
            groups: Vec::new(),
        })
    })
}

/// The primary group plus every `group:x:gid:members` line listing `name` as a member.
fn parse_groups(text: &str, name: &str, primary: u32) -> Vec<u32> {
    let mut groups = vec![primary];
    for line in text.lines() {
        let fields: Vec<&str> = line.split(':').collect();
        if fields.len() < 4 || !fields[3].split(',').any(|m| m.trim() == name) {
            continue;
        }
        if let Ok(gid) = fields[2].parse() {
            if !groups.contains(&gid) {
                groups.push(gid);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str =
        "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\nbad:x:a:1::/:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nuser:x:1000:\nwheel:x:10:root,user\ndocker:x:999:user\n";

    #[test]
    fn finds_users_and_groups() {
        let user = parse_passwd(PASSWD, "user").expect("user");
        assert_eq!(
            (user.uid, user.gid, user.home.as_str()),
            (1000, 1000, "/home/user")
        );
        assert_eq!(parse_groups(GROUP, "user", 1000), vec![1000, 10, 999]);
        assert_eq!(parse_groups(GROUP, "root", 0), vec![0, 10]);
        assert!(parse_passwd(PASSWD, "nobody").is_none());
        assert!(
            parse_passwd(PASSWD, "bad").is_none(),
            "a non-numeric uid is no user"
        );
    }

    #[test]
    fn looks_up_through_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("etc")).expect("mkdir");
        std::fs::write(dir.path().join("etc/passwd"), PASSWD).expect("passwd");
        let root = Root::open(dir.path()).expect("root");
        assert_eq!(lookup_user(&root, "root").expect("root").groups, vec![0]);
        let err = lookup_user(&root, "ghost").expect_err("unknown");
        assert_eq!(err.code, ErrorCode::UnknownUser);
    }
}
