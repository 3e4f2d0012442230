//! A sandbox's accounts as its own `/etc/passwd` and `/etc/group` say: for front-ends that name
//! users and groups (E2B's envd reports a file's owner by name, resolves `~` against the calling
//! user's home and refuses an unknown user before it does anything).
//!
//! It does not: look anything up on the host, cache (each call reads the two files anew, so they
//! stay current), or follow NSS (only the two files, as the agent's own lookup does).

use paddock_types::SandboxId;

use crate::core::error::process_error;
use crate::{Principal, SandboxService, ServiceError};

/// The most of each account file that is read; a longer file's excess lines are ignored.
const MAX_ACCOUNT_FILE: u64 = 1 << 20;

/// A user of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountUser {
    /// Login name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Home directory.
    pub home: String,
}

/// The sandbox's users and groups, and its default user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxAccounts {
    /// The user processes run as when a request names none.
    pub default_user: String,
    /// The default working directory of processes, when the sandbox has one.
    pub default_workdir: Option<String>,
    /// `/etc/passwd`'s entries, in file order.
    pub users: Vec<AccountUser>,
    /// `/etc/group`'s entries (name, gid), in file order.
    pub groups: Vec<(String, u32)>,
}

impl SandboxAccounts {
    /// The user called `name`.
    pub fn user(&self, name: &str) -> Option<&AccountUser> {
        self.users.iter().find(|u| u.name == name)
    }

    /// The name of user id `uid` (the first entry with it), or the number.
    pub fn user_name(&self, uid: u32) -> String {
        self.users
            .iter()
            .find(|u| u.uid == uid)
            .map_or_else(|| uid.to_string(), |u| u.name.clone())
    }

    /// The name of group id `gid` (the first entry with it), or the number.
    pub fn group_name(&self, gid: u32) -> String {
        self.groups
            .iter()
            .find(|g| g.1 == gid)
            .map_or_else(|| gid.to_string(), |g| g.0.clone())
    }
}

/// `name:x:uid:gid:gecos:home:shell` lines; malformed ones are skipped.
pub(crate) fn parse_passwd(text: &str) -> Vec<AccountUser> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 6 || fields[0].is_empty() || line.starts_with('#') {
                return None;
            }
            Some(AccountUser {
                name: fields[0].to_owned(),
                uid: fields[2].parse().ok()?,
                gid: fields[3].parse().ok()?,
                home: fields[5].to_owned(),
            })
        })
        .collect()
}

/// `name:x:gid:members` lines; malformed ones are skipped.
pub(crate) fn parse_group(text: &str) -> Vec<(String, u32)> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            if fields.len() < 3 || fields[0].is_empty() || line.starts_with('#') {
                return None;
            }
            Some((fields[0].to_owned(), fields[2].parse().ok()?))
        })
        .collect()
}

impl SandboxService {
    /// The sandbox's users and groups (from its own `/etc/passwd` and `/etc/group`, each read up
    /// to 1 MiB; a missing file has no entries) and its default user. Reads only: no audit row.
    pub async fn sandbox_accounts(
        &self,
        p: &Principal,
        id: &SandboxId,
    ) -> Result<SandboxAccounts, ServiceError> {
        let sb = self.owned_live(p, id).await?;
        let read = |path: &'static str| {
            let client = sb.client.clone();
            async move {
                match client.read_file(path, 0, Some(MAX_ACCOUNT_FILE as u32)).await {
                    Ok(chunk) => Ok(String::from_utf8_lossy(&chunk.data).into_owned()),
                    Err(e) if e.code() == Some(paddock_protocol::ErrorCode::NotFound) => Ok(String::new()),
                    Err(e) => Err(process_error("read the sandbox's accounts", 0, e)),
                }
            }
        };
        // Both at once: the agent answers requests concurrently.
        let (passwd, group) = tokio::try_join!(read("/etc/passwd"), read("/etc/group"))?;
        let spec = sb.spec();
        Ok(SandboxAccounts {
            default_user: spec.user.as_str().to_owned(),
            default_workdir: spec.workdir.as_ref().map(|w| w.as_str().to_owned()),
            users: parse_passwd(&passwd),
            groups: parse_group(&group),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_two_files_and_names_ids() {
        let users = parse_passwd(
            "root:x:0:0:root:/root:/bin/bash\n# comment\nbroken\nuser:x:1000:1000::/home/user:/bin/sh\nbad:x:z:1::/:\n",
        );
        assert_eq!(
            users
                .iter()
                .map(|u| (u.name.as_str(), u.uid, u.home.as_str()))
                .collect::<Vec<_>>(),
            [("root", 0, "/root"), ("user", 1000, "/home/user")]
        );
        let groups = parse_group("root:x:0:\nuser:x:1000:\nnope\n");
        let accounts = SandboxAccounts {
            default_user: "user".into(),
            default_workdir: None,
            users,
            groups,
        };
        assert_eq!(accounts.user_name(1000), "user");
        assert_eq!(accounts.user_name(1234), "1234");
        assert_eq!(accounts.group_name(0), "root");
        assert_eq!(accounts.group_name(7), "7");
        assert_eq!(accounts.user("user").map(|u| u.gid), Some(1000));
        assert!(accounts.user("nobody").is_none());
    }
}
