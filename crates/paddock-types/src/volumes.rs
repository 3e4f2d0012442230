//! Named volumes: persistent storage that outlives sandboxes and is mounted into several of them.
//!
//! A volume has an id (`vol-` and 16 hex digits, naming its subvolume) and a name unique within its
//! tenant. A sandbox mounts volumes at paths of its own tree ([`VolumeMount`]); [`check_volume_mounts`]
//! says which paths are acceptable, as a pure function.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SandboxPath;

/// A volume id: `vol-` and 16 hex digits (the sandbox id alphabet, since it names a subvolume).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VolumeId(String);

/// Why a string is not a volume id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid volume id {value:?}: volume ids are 'vol-' and 16 hex digits")]
pub struct VolumeIdError {
    value: String,
}

impl VolumeId {
    const PREFIX: &'static str = "vol-";

    /// Builds an id from 8 random bytes, rendered as `vol-` and 16 hex digits.
    pub fn from_random(bytes: [u8; 8]) -> Self {
        let mut s = String::from(Self::PREFIX);
        for b in bytes {
            s.push_str(&format!("{b:02x}"));
        }
        Self(s)
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for VolumeId {
    type Err = VolumeIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = s.strip_prefix(Self::PREFIX).is_some_and(|hex| {
            hex.len() == 16
                && hex
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(VolumeIdError { value: s.to_owned() })
        }
    }
}

impl TryFrom<String> for VolumeId {
    type Error = VolumeIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<VolumeId> for String {
    fn from(id: VolumeId) -> Self {
        id.0
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A volume's name: 1 to 63 characters of `[A-Za-z0-9._-]`, starting with a letter or digit, and not
/// starting with `vol-` (so a name never reads as an id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VolumeName(String);

/// Why a string is not a volume name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid volume name {value:?}: use 1-63 characters of A-Z, a-z, 0-9, '.', '_' and '-', starting \
     with a letter or digit and not with 'vol-'"
)]
pub struct VolumeNameError {
    value: String,
}

impl VolumeName {
    /// The longest name accepted.
    pub const MAX_LEN: usize = 63;

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl FromStr for VolumeName {
    type Err = VolumeNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = !s.is_empty()
            && s.len() <= Self::MAX_LEN
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && !s.starts_with(VolumeId::PREFIX);
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(VolumeNameError { value: s.to_owned() })
        }
    }
}

impl TryFrom<String> for VolumeName {
    type Error = VolumeNameError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<VolumeName> for String {
    fn from(n: VolumeName) -> Self {
        n.0
    }
}

impl fmt::Display for VolumeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A volume mounted into a sandbox: bound at `path` with nosuid and nodev (and read-only when asked).
/// The volume is shared, never copied: every sandbox mounting it sees the same files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume.
    pub volume: VolumeId,
    /// Where it appears in the sandbox.
    pub path: SandboxPath,
    /// Mounted read-only.
    pub read_only: bool,
}

/// The most volumes one sandbox mounts.
pub const MAX_VOLUME_MOUNTS: usize = 16;

/// Trees a volume may not be mounted in or over: the kernel interfaces and the host's read-only
/// system directories (`/etc` too: with a `--rootfs` it is that directory's, read-only).
const FORBIDDEN_TREES: [&str; 11] = [
    "/proc", "/sys", "/dev", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];
/// The sandbox's own writable directories: a volume may go beneath them, never replace them.
const OWN_DIRS: [&str; 3] = ["/home", "/root", "/tmp"];

/// Why a set of volume mounts is refused: which one (its index) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct VolumeMountError {
    /// Index of the offending mount.
    pub index: usize,
    /// Why.
    pub reason: String,
}

/// Checks where volumes are mounted: never `/`, never in or over `/proc`, `/sys`, `/dev` or the system
/// directories, never over `/home`, `/root` or `/tmp` themselves (beneath them is fine), and no two
/// mounts at the same place or one inside another.
pub fn check_volume_mounts(mounts: &[VolumeMount]) -> Result<(), VolumeMountError> {
    let err = |index: usize, reason: String| Err(VolumeMountError { index, reason });
    if mounts.len() > MAX_VOLUME_MOUNTS {
        return err(
            MAX_VOLUME_MOUNTS,
            format!("at most {MAX_VOLUME_MOUNTS} volumes per sandbox"),
        );
    }
    for (i, m) in mounts.iter().enumerate() {
        let path = m.path.as_path();
        if m.path.as_str() == "/" {
            return err(i, "a volume cannot be mounted over the sandbox's root".into());
        }
        if let Some(tree) = FORBIDDEN_TREES.iter().find(|t| path.starts_with(t)) {
            return err(
                i,
                format!("{} is inside {tree}, which volumes cannot be mounted in", m.path),
            );
        }
        if OWN_DIRS.contains(&m.path.as_str()) {
            return err(
                i,
                format!(
                    "{} is one of the sandbox's own directories; mount the volume beneath it",
                    m.path
                ),
            );
        }
        for (j, other) in mounts.iter().enumerate().take(i) {
            if m.path.starts_with(&other.path) || other.path.starts_with(&m.path) {
                return err(
                    i,
                    format!(
                        "{} overlaps {}, where volume {} is mounted (mounts {j} and {i})",
                        m.path, other.path, other.volume
                    ),
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(path: &str) -> VolumeMount {
        VolumeMount {
            volume: VolumeId::from_random([1, 2, 3, 4, 5, 6, 7, 8]),
            path: path.parse().expect("sandbox path"),
            read_only: false,
        }
    }

    #[test]
    fn ids_and_names() {
        let id = VolumeId::from_random([0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3]);
        assert_eq!(id.as_str(), "vol-deadbeef00010203");
        assert_eq!(id.to_string().parse::<VolumeId>(), Ok(id));
        for bad in [
            "",
            "vol-",
            "vol-DEADBEEF00010203",
            "vol-deadbeef0001020",
            "x-deadbeef00010203",
            "vol-../../etc/x",
        ] {
            assert!(bad.parse::<VolumeId>().is_err(), "{bad:?} accepted");
        }
        assert!(serde_json::from_str::<VolumeId>("\"../x\"").is_err());
        for good in ["data", "Data.v2", "a", "x_y-z", &"n".repeat(63)] {
            assert!(good.parse::<VolumeName>().is_ok(), "{good:?} refused");
        }
        for bad in [
            "",
            "-x",
            ".x",
            "a/b",
            "a b",
            "vol-data",
            "..",
            &"n".repeat(64),
            "é",
        ] {
            assert!(bad.parse::<VolumeName>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn mount_paths() {
        for good in [
            vec!["/data"],
            vec!["/home/user/data", "/tmp/cache", "/root/x", "/mnt/a", "/mnt/b"],
            vec!["/workspace", "/workspaces"],
        ] {
            let mounts: Vec<_> = good.iter().map(|p| mount(p)).collect();
            assert_eq!(check_volume_mounts(&mounts), Ok(()), "{good:?}");
        }
        for (bad, index) in [
            (vec!["/"], 0),
            (vec!["/data", "/proc"], 1),
            (vec!["/proc/self"], 0),
            (vec!["/sys/fs"], 0),
            (vec!["/dev"], 0),
            (vec!["/dev/shm/x"], 0),
            (vec!["/usr/local"], 0),
            (vec!["/etc"], 0),
            (vec!["/home"], 0),
            (vec!["/tmp"], 0),
            (vec!["/data", "/data"], 1),
            (vec!["/data", "/data/inner"], 1),
            (vec!["/data/inner", "/data"], 1),
        ] {
            let mounts: Vec<_> = bad.iter().map(|p| mount(p)).collect();
            let e = check_volume_mounts(&mounts).expect_err(&format!("{bad:?} accepted"));
            assert_eq!(e.index, index, "{bad:?}: {e}");
        }
        let many: Vec<_> = (0..=MAX_VOLUME_MOUNTS)
            .map(|i| mount(&format!("/v{i}")))
            .collect();
        assert!(check_volume_mounts(&many).is_err());
    }
}
