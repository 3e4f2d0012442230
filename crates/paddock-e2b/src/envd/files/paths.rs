//! Where a `/files` path points, by envd's rules: `~` and `~/...` are the user's home, a relative
//! path starts there (and is cleaned lexically, as Go's `filepath.Join` does), an absolute path is
//! kept as written. Pure.
//!
//! It does not confine anything: every path, `..` and symlinks included, resolves inside the
//! sandbox's root in the agent (`openat2(RESOLVE_IN_ROOT)`), whatever it says.

/// Longest user name accepted (Linux's `LOGIN_NAME_MAX` is 256, `useradd` takes 32).
const MAX_USER_NAME: usize = 32;

/// Why a path cannot be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// `~name/...`: another user's home, which envd does not expand either.
    #[error("failed to expand path '{0}': cannot expand user-specific home dir")]
    OtherUsersHome(String),
}

/// Whether `name` can be a user name: what `useradd` accepts (letters, digits, `.`, `_`, `-`, a
/// final `$`; not starting with `-`; at most 32 bytes), so it is one path segment of a home.
pub fn is_user_name(name: &str) -> bool {
    let body = name.strip_suffix('$').unwrap_or(name);
    !body.is_empty()
        && name.len() <= MAX_USER_NAME
        && !body.starts_with('-')
        && body != "."
        && body != ".."
        && body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A user's home: `/root` for `root`, `/home/<user>` for everyone else.
pub fn home_of(user: &str) -> String {
    if user == "root" {
        "/root".to_owned()
    } else {
        format!("/home/{user}")
    }
}

/// The absolute path `path` names for a user whose home is `home`.
pub fn resolve(path: &str, home: &str) -> Result<String, PathError> {
    let path = match path.strip_prefix('~') {
        None => path,
        Some(rest) if rest.is_empty() || rest.starts_with('/') => return Ok(clean(&format!("{home}{rest}"))),
        Some(_) => return Err(PathError::OtherUsersHome(path.to_owned())),
    };
    if path.starts_with('/') {
        return Ok(path.to_owned());
    }
    Ok(clean(&format!("{home}/{path}")))
}

/// Go's `filepath.Clean` for an absolute path: no empty or `.` segments, `..` removes the segment
/// before it (never above `/`), no trailing slash.
fn clean(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            s => segments.push(s),
        }
    }
    format!("/{}", segments.join("/"))
}

/// The last segment of an absolute path (`/` for the root itself).
pub fn base_name(path: &str) -> &str {
    match path.trim_end_matches('/').rsplit('/').next() {
        Some("") | None => "/",
        Some(name) => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn paths_resolve_as_envd_resolves_them() {
        let home = "/home/user";
        let ok = |p: &str| resolve(p, home).expect("resolves");
        assert_eq!(ok("a.txt"), "/home/user/a.txt");
        assert_eq!(ok("./d//a.txt"), "/home/user/d/a.txt");
        assert_eq!(ok("d/../a.txt"), "/home/user/a.txt");
        assert_eq!(ok("../../../etc/passwd"), "/etc/passwd");
        assert_eq!(ok("~"), "/home/user");
        assert_eq!(ok("~/a/"), "/home/user/a");
        assert_eq!(ok(""), "/home/user");
        assert_eq!(ok("/tmp//x/../y"), "/tmp//x/../y");
        assert_eq!(resolve("x", "/root").expect("resolves"), "/root/x");
        assert_eq!(
            resolve("~root/x", home),
            Err(PathError::OtherUsersHome("~root/x".into()))
        );
    }

    #[test]
    fn users_and_homes() {
        assert_eq!(home_of("root"), "/root");
        assert_eq!(home_of("user"), "/home/user");
        for good in ["user", "root", "a.b_c-d", "machine$", "U1"] {
            assert!(is_user_name(good), "{good}");
        }
        for bad in ["", "$", "-x", ".", "..", "a/b", "a b", "é", &"a".repeat(33)] {
            assert!(!is_user_name(bad), "{bad:?}");
        }
        assert_eq!(base_name("/home/user/a.txt"), "a.txt");
        assert_eq!(base_name("/home/user/"), "user");
        assert_eq!(base_name("/"), "/");
    }

    proptest! {
        #[test]
        fn relative_paths_resolve_to_clean_absolute_paths(path in "[a-z./~]{0,24}") {
            if let Ok(resolved) = resolve(&path, "/home/user") {
                prop_assert!(resolved.starts_with('/'));
                if !path.starts_with('/') {
                    prop_assert!(!resolved.contains("//"));
                    prop_assert!(resolved == "/" || !resolved.ends_with('/'));
                    prop_assert!(resolved.split('/').all(|s| s != "." && s != ".."));
                }
            }
        }
    }
}
