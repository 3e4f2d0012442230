//! Paths as envd takes them: relative paths and `~` against the calling user's home, then
//! normalised lexically (`.`, `..`, repeated slashes), so every `path` answered is absolute and
//! clean. And the calling user: the one `Authorization: Basic` names, else the sandbox's default.
//!
//! It does not confine anything (the agent resolves every path inside the sandbox's root) or
//! follow symlinks.

use paddock_control::SandboxAccounts;

use crate::envd::connect::service_error;
use crate::envd::EnvdCaller;
use crate::{ConnectCode, ConnectError, E2bState};

/// The longest path accepted, after resolution.
const MAX_PATH: usize = 4096;

/// `path` made absolute against `home` and normalised; `invalid_argument` for a NUL byte, a
/// `~user` form, or an over-long result.
pub fn resolve_path(path: &str, home: &str) -> Result<String, ConnectError> {
    let invalid = |m: String| ConnectError::new(ConnectCode::InvalidArgument, m);
    if path.contains('\0') {
        return Err(invalid("paths cannot contain NUL bytes".into()));
    }
    let joined = if path == "~" {
        home.to_owned()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('~') {
        return Err(invalid(format!(
            "path '{path}': only '~' and '~/...' name a home directory"
        )));
    } else if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("{home}/{path}")
    };
    let clean = normalize(&joined);
    if clean.len() > MAX_PATH {
        return Err(invalid(format!("a path may be at most {MAX_PATH} bytes")));
    }
    Ok(clean)
}

/// An absolute path without `.`, `..` (which stops at the root) or empty components.
pub fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        "/".to_owned()
    } else {
        format!("/{}", parts.join("/"))
    }
}

/// The directory containing `path` (`/` for `/` itself).
pub fn parent(path: &str) -> String {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/".to_owned(),
        Some((dir, _)) => dir.to_owned(),
    }
}

/// `child` relative to `root` (both absolute and normalised), if it is inside it.
pub fn relative_to<'a>(child: &'a str, root: &str) -> Option<&'a str> {
    if root == "/" {
        return child.strip_prefix('/').filter(|r| !r.is_empty());
    }
    child
        .strip_prefix(root)
        .and_then(|r| r.strip_prefix('/'))
        .filter(|r| !r.is_empty())
}

/// The user a call acts as, and the sandbox's accounts (for owner names).
#[derive(Debug, Clone)]
pub struct UserContext {
    /// The user's name.
    pub name: String,
    /// Their home directory.
    pub home: String,
    /// The sandbox's users and groups.
    pub accounts: SandboxAccounts,
}

impl UserContext {
    /// The user `named` (the sandbox's default user when `None`): an unknown user is
    /// `unauthenticated` "invalid username", as envd answers.
    pub async fn load(
        state: &E2bState,
        caller: &EnvdCaller,
        named: Option<&str>,
    ) -> Result<Self, ConnectError> {
        let accounts = state
            .service
            .sandbox_accounts(&caller.principal, &caller.id)
            .await
            .map_err(service_error)?;
        let name = named.unwrap_or(&accounts.default_user).to_owned();
        let home = match accounts.user(&name) {
            Some(user) => user.home.clone(),
            None if named.is_some() => {
                return Err(ConnectError::new(
                    ConnectCode::Unauthenticated,
                    format!("invalid username: '{name}'"),
                ))
            }
            // A default user missing from /etc/passwd: its conventional home.
            None if name == "root" => "/root".to_owned(),
            None => format!("/home/{name}"),
        };
        Ok(Self {
            name,
            home: normalize(&home),
            accounts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_against_the_home() {
        let home = "/home/user";
        let ok = |p: &str| resolve_path(p, home).expect(p);
        assert_eq!(ok("a.txt"), "/home/user/a.txt");
        assert_eq!(ok(""), "/home/user");
        assert_eq!(ok("~"), "/home/user");
        assert_eq!(ok("~/x/../y/./z/"), "/home/user/y/z");
        assert_eq!(ok("/tmp//a/./b/.."), "/tmp/a");
        assert_eq!(ok("../../../.."), "/");
        assert_eq!(ok("/"), "/");
        for bad in ["~root/x", "a\0b"] {
            let e = resolve_path(bad, home).expect_err(bad);
            assert_eq!(e.code, ConnectCode::InvalidArgument);
        }
        assert!(resolve_path(&"a/".repeat(3000), home).is_err());
    }

    #[test]
    fn parents_and_relative_names() {
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
        assert_eq!(parent("/"), "/");
        assert_eq!(relative_to("/a/b/c", "/a"), Some("b/c"));
        assert_eq!(relative_to("/ab", "/a"), None);
        assert_eq!(relative_to("/a", "/a"), None);
        assert_eq!(relative_to("/x", "/"), Some("x"));
    }
}
