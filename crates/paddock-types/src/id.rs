//! Sandbox, snapshot and template identifiers.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A sandbox id: 1 to 40 characters of `[a-z0-9-]`, starting with a letter or digit.
///
/// It doubles as the sandbox's hostname, cgroup name and subvolume name, so the alphabet is the
/// intersection of what all of those accept.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

/// Why a string is not a sandbox id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid sandbox id {value:?}: use 1-40 characters of a-z, 0-9 and '-', not starting with '-'")]
pub struct SandboxIdError {
    value: String,
}

impl SandboxId {
    /// The longest id accepted.
    pub const MAX_LEN: usize = 40;

    /// Builds an id from 8 random bytes, rendered as `sb-` and 16 hex digits.
    pub fn from_random(bytes: [u8; 8]) -> Self {
        Self(random_id("sb-", bytes))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Whether `s` is 1 to 40 characters of `[a-z0-9-]` not starting with `-`: a valid hostname label,
/// cgroup name and subvolume name alike.
fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= SandboxId::MAX_LEN
        && !s.starts_with('-')
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// `prefix` followed by the 16 hex digits of `bytes`.
fn random_id(prefix: &str, bytes: [u8; 8]) -> String {
    let mut s = String::with_capacity(prefix.len() + 16);
    s.push_str(prefix);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

impl FromStr for SandboxId {
    type Err = SandboxIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if valid_id(s) {
            Ok(Self(s.to_owned()))
        } else {
            Err(SandboxIdError { value: s.to_owned() })
        }
    }
}

impl TryFrom<String> for SandboxId {
    type Error = SandboxIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> Self {
        id.0
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A snapshot id: the same alphabet as a [`SandboxId`] (1 to 40 characters of `[a-z0-9-]`, starting
/// with a letter or digit), since it names a subvolume too; new ones are `sn-` and 16 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SnapshotId(String);

/// Why a string is not a snapshot id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid snapshot id {value:?}: use 1-40 characters of a-z, 0-9 and '-', not starting with '-'")]
pub struct SnapshotIdError {
    value: String,
}

impl SnapshotId {
    /// The longest id accepted.
    pub const MAX_LEN: usize = SandboxId::MAX_LEN;

    /// Builds an id from 8 random bytes, rendered as `sn-` and 16 hex digits.
    pub fn from_random(bytes: [u8; 8]) -> Self {
        Self(random_id("sn-", bytes))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for SnapshotId {
    type Err = SnapshotIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if valid_id(s) {
            Ok(Self(s.to_owned()))
        } else {
            Err(SnapshotIdError { value: s.to_owned() })
        }
    }
}

impl TryFrom<String> for SnapshotId {
    type Error = SnapshotIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<SnapshotId> for String {
    fn from(id: SnapshotId) -> Self {
        id.0
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A template id: the alphabet of a [`SandboxId`] (it names a subvolume too); new ones are `tp-` and
/// 16 hex digits. A template's name (what users type) is separate and per tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TemplateId(String);

/// Why a string is not a template id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid template id {value:?}: use 1-40 characters of a-z, 0-9 and '-', not starting with '-'")]
pub struct TemplateIdError {
    value: String,
}

impl TemplateId {
    /// Builds an id from 8 random bytes, rendered as `tp-` and 16 hex digits.
    pub fn from_random(bytes: [u8; 8]) -> Self {
        Self(random_id("tp-", bytes))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for TemplateId {
    type Err = TemplateIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if valid_id(s) {
            Ok(Self(s.to_owned()))
        } else {
            Err(TemplateIdError { value: s.to_owned() })
        }
    }
}

impl TryFrom<String> for TemplateId {
    type Error = TemplateIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<TemplateId> for String {
    fn from(id: TemplateId) -> Self {
        id.0
    }
}

impl fmt::Display for TemplateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Ids read as the strings they are (store keys, paths, log fields) without being re-parsed: a typed
/// id can be passed wherever a `&str` is expected, and a map keyed by ids can be searched by `&str`.
macro_rules! id_as_str {
    ($($ty:ty),*) => {$(
        impl std::ops::Deref for $ty {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $ty {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $ty {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $ty {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $ty {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$ty> for str {
            fn eq(&self, other: &$ty) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$ty> for &str {
            fn eq(&self, other: &$ty) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$ty> for String {
            fn eq(&self, other: &$ty) -> bool {
                *self == other.0
            }
        }
    )*};
}

id_as_str!(SandboxId, SnapshotId, TemplateId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_rejects() {
        assert!("sb-0123abcd".parse::<SandboxId>().is_ok());
        for bad in ["", "-x", "A", "a/b", "a b", "..", &"x".repeat(41)] {
            assert!(bad.parse::<SandboxId>().is_err(), "{bad:?} accepted");
        }
        let id = SandboxId::from_random([0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3]);
        assert_eq!(id.as_str(), "sb-deadbeef00010203");
        assert!(id.as_str().parse::<SandboxId>().is_ok());
    }

    #[test]
    fn serde_goes_through_the_parser() {
        assert!(serde_json::from_str::<SandboxId>("\"../etc\"").is_err());
        let id: SandboxId = "sb-1".parse().expect("valid id");
        let as_str: &str = &id;
        assert_eq!(as_str, "sb-1");
        let map = std::collections::HashMap::from([(id.clone(), 1)]);
        assert_eq!(
            map.get("sb-1"),
            Some(&1),
            "a map keyed by ids is searched by the id's text"
        );
        let id: SandboxId = serde_json::from_str("\"abc\"").expect("valid id");
        assert_eq!(id.as_str(), "abc");
    }

    #[test]
    fn snapshot_ids() {
        let id = SnapshotId::from_random([0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3]);
        assert_eq!(id.as_str(), "sn-deadbeef00010203");
        assert_eq!(id.to_string().parse::<SnapshotId>(), Ok(id));
        for bad in ["", "-x", "A", "a/b", "..", ".hidden", &"x".repeat(41)] {
            assert!(bad.parse::<SnapshotId>().is_err(), "{bad:?} accepted");
        }
        assert!(serde_json::from_str::<SnapshotId>("\"../x\"").is_err());
        let id: SnapshotId = serde_json::from_str("\"sn-1\"").expect("valid id");
        assert_eq!(serde_json::to_string(&id).expect("serialize"), "\"sn-1\"");
    }
}
