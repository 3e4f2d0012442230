//! Paths inside a sandbox and host directories mounted into it.

use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An absolute, normalized path inside a sandbox: starts with `/`, has no `.` or `..` components, no
/// empty components, no NUL. It names a place in the sandbox's own tree, never a host path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxPath(String);

/// Why a string is not a sandbox path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid sandbox path {value:?}: {reason}")]
pub struct SandboxPathError {
    value: String,
    reason: &'static str,
}

impl SandboxPath {
    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// The path as a `Path`.
    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }
    /// The path without its leading `/`, for joining under a root directory.
    pub fn relative(&self) -> &str {
        &self.0[1..]
    }
    /// Whether this path is `other` or lies beneath it.
    pub fn starts_with(&self, other: &SandboxPath) -> bool {
        self.as_path().starts_with(other.as_path())
    }
}

impl FromStr for SandboxPath {
    type Err = SandboxPathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| SandboxPathError {
            value: s.to_owned(),
            reason,
        };
        if !s.starts_with('/') {
            return Err(err("must be absolute"));
        }
        if s.contains('\0') {
            return Err(err("contains NUL"));
        }
        if s.len() > 4096 {
            return Err(err("longer than 4096 bytes"));
        }
        let mut out = String::with_capacity(s.len());
        for c in Path::new(s).components() {
            match c {
                Component::RootDir => {}
                Component::Normal(part) => {
                    out.push('/');
                    out.push_str(part.to_str().ok_or_else(|| err("not UTF-8"))?);
                }
                Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                    return Err(err("must not contain '.' or '..'"))
                }
            }
        }
        if s.split('/').skip(1).any(|p| p == "." || p == "..") {
            return Err(err("must not contain '.' or '..'"));
        }
        if out.is_empty() {
            out.push('/');
        }
        Ok(Self(out))
    }
}

impl TryFrom<String> for SandboxPath {
    type Error = SandboxPathError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<SandboxPath> for String {
    fn from(p: SandboxPath) -> Self {
        p.0
    }
}

impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A host directory or file made visible inside the sandbox (`--mount HOST:SANDBOX[:ro]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// Absolute host path (existence is checked when the sandbox is created, not here).
    pub host: PathBuf,
    /// Where it appears in the sandbox.
    pub sandbox: SandboxPath,
    /// Mounted read-only.
    pub read_only: bool,
}

/// Why a `--mount` argument is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountSpecError {
    /// Not `HOST:SANDBOX[:ro|:rw]`.
    #[error("invalid mount {value:?}: use HOST:SANDBOX[:ro]")]
    Syntax {
        /// The argument as given.
        value: String,
    },
    /// The host side is relative.
    #[error("invalid mount {value:?}: the host path must be absolute")]
    RelativeHost {
        /// The argument as given.
        value: String,
    },
    /// The sandbox side is not a valid sandbox path.
    #[error(transparent)]
    SandboxPath(#[from] SandboxPathError),
    /// The sandbox side is `/` or a place paddock itself manages.
    #[error("invalid mount {value:?}: cannot mount over {target}")]
    ReservedTarget {
        /// The argument as given.
        value: String,
        /// The reserved target.
        target: String,
    },
}

/// Sandbox paths a user mount may not replace: the root and the kernel interfaces.
const RESERVED_TARGETS: [&str; 4] = ["/", "/proc", "/dev", "/sys"];

impl FromStr for MountSpec {
    type Err = MountSpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.split(':');
        let (host, sandbox) = match (parts.next(), parts.next()) {
            (Some(h), Some(sb)) if !h.is_empty() && !sb.is_empty() => (h, sb),
            _ => return Err(MountSpecError::Syntax { value: s.to_owned() }),
        };
        let read_only = match parts.next() {
            None | Some("rw") => false,
            Some("ro") => true,
            Some(_) => return Err(MountSpecError::Syntax { value: s.to_owned() }),
        };
        if parts.next().is_some() {
            return Err(MountSpecError::Syntax { value: s.to_owned() });
        }
        if !host.starts_with('/') {
            return Err(MountSpecError::RelativeHost { value: s.to_owned() });
        }
        let sandbox: SandboxPath = sandbox.parse()?;
        for reserved in RESERVED_TARGETS {
            let reserved: SandboxPath = reserved.parse().map_err(MountSpecError::SandboxPath)?;
            if sandbox == reserved || (reserved.as_str() != "/" && sandbox.starts_with(&reserved)) {
                return Err(MountSpecError::ReservedTarget {
                    value: s.to_owned(),
                    target: sandbox.to_string(),
                });
            }
        }
        Ok(Self {
            host: PathBuf::from(host),
            sandbox,
            read_only,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sandbox_paths() {
        assert_eq!(
            "/home/user//x/".parse::<SandboxPath>().expect("valid").as_str(),
            "/home/user/x"
        );
        assert_eq!("/".parse::<SandboxPath>().expect("valid").as_str(), "/");
        for bad in ["relative", "/a/../b", "/a/./b", "/..", "/a\0b"] {
            assert!(bad.parse::<SandboxPath>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn mounts() {
        let m: MountSpec = "/srv/data:/data:ro".parse().expect("valid");
        assert_eq!(m.host, PathBuf::from("/srv/data"));
        assert_eq!(m.sandbox.as_str(), "/data");
        assert!(m.read_only);
        assert!(!"/a:/b".parse::<MountSpec>().expect("valid").read_only);
        for bad in [
            "/a",
            "a:/b",
            "/a:b",
            "/a:/b:rx",
            "/a:/b:ro:x",
            "/a:/",
            "/a:/proc/x",
            ":/b",
            "/a:/dev",
        ] {
            assert!(bad.parse::<MountSpec>().is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn parsed_paths_never_escape(s in "[/a-z.]{0,24}") {
            if let Ok(p) = s.parse::<SandboxPath>() {
                prop_assert!(p.as_str().starts_with('/'));
                prop_assert!(!p.as_str().split('/').any(|c| c == ".." || c == "."));
            }
        }
    }
}
