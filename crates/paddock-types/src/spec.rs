//! The desired state of a sandbox.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Limits, MountSpec, SandboxId, SandboxPath, SnapshotId, VolumeMount};

/// What root file system a sandbox gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RootfsSpec {
    /// The host's system directories read-only, a curated `/etc`, private `/home/user` and `/tmp`.
    Host,
    /// A full root file system directory (e.g. made by debootstrap), mounted read-only, with private
    /// writable `/home/user` and `/tmp` on the sandbox's storage.
    Dir {
        /// Absolute host path of the root directory.
        path: PathBuf,
    },
    /// A template built from an image (or a recipe): the sandbox's volume is a writable snapshot of
    /// the template's whole tree, so its `/usr`, `/etc` and users are the image's own, writable by
    /// the sandbox (on `nosuid`, `nodev` mounts) and charged to it as it changes them.
    Image {
        /// The template.
        template: crate::TemplateId,
    },
}

/// What a new sandbox's writable file system (`/etc`, `/home`, `/root`, `/tmp`) starts as.
///
/// On the wire: `{"kind":"template"}`, `{"kind":"snapshot","id":"sn-..."}`, `{"kind":"sandbox","id":"sb-..."}`
/// or `{"kind":"stopped"}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "snake_case", deny_unknown_fields)]
pub enum VolumeSource {
    /// A fresh copy of the pool's template.
    #[default]
    Template,
    /// A writable copy of this snapshot (a fork of the sandbox it was taken of).
    Snapshot(SnapshotId),
    /// A writable copy of this running sandbox's file system as it is now: a fork's copy. The caller
    /// keeps that sandbox frozen (`SandboxBackend::freeze_sandbox` in paddock-runtime) until every
    /// copy it makes is made, so that all hold the same instant and none a write half done.
    Sandbox(SandboxId),
    /// The sandbox's own file system, kept when it was stopped (`SandboxBackend::stop_sandbox` in paddock-runtime): the sandbox
    /// resumes with the same id.
    Stopped,
}

/// The user a process runs as inside the sandbox: a name from the sandbox's `/etc/passwd`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UserSpec(String);

/// Why a string is not a user name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid user {value:?}: use a user name such as 'user' or 'root'")]
pub struct UserSpecError {
    value: String,
}

impl UserSpec {
    /// The unprivileged default user, uid 1000.
    pub fn default_user() -> Self {
        Self("user".to_owned())
    }
    /// Root inside the sandbox (still an unprivileged host uid).
    pub fn root() -> Self {
        Self("root".to_owned())
    }
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for UserSpec {
    fn default() -> Self {
        Self::default_user()
    }
}

impl FromStr for UserSpec {
    type Err = UserSpecError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut bytes = s.bytes();
        let ok = s.len() <= 32
            && bytes.next().is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(UserSpecError { value: s.to_owned() })
        }
    }
}

impl TryFrom<String> for UserSpec {
    type Error = UserSpecError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<UserSpec> for String {
    fn from(u: UserSpec) -> Self {
        u.0
    }
}

impl fmt::Display for UserSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One environment variable, `KEY=VALUE`. Keys are non-empty and contain neither `=` nor NUL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    /// Name.
    pub key: String,
    /// Value.
    pub value: String,
}

/// Why a `--env` argument is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid environment variable {value:?}: use KEY=VALUE")]
pub struct EnvVarError {
    value: String,
}

impl FromStr for EnvVar {
    type Err = EnvVarError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('=') {
            Some((k, v)) if !k.is_empty() && !k.contains('\0') && !v.contains('\0') => Ok(Self {
                key: k.to_owned(),
                value: v.to_owned(),
            }),
            _ => Err(EnvVarError { value: s.to_owned() }),
        }
    }
}

/// Everything that defines a sandbox's environment (not the commands run in it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// Its id, also its hostname.
    pub id: SandboxId,
    /// Resource limits.
    pub limits: Limits,
    /// Root file system.
    pub rootfs: RootfsSpec,
    /// Extra host paths mounted in.
    pub mounts: Vec<MountSpec>,
    /// Default working directory of processes (default `/home/user`).
    pub workdir: Option<SandboxPath>,
    /// Default user of processes.
    pub user: UserSpec,
    /// Environment added to every process on top of the clean default (PATH, HOME, LANG, TERM).
    pub env: Vec<EnvVar>,
    /// What its writable file system starts as (the template when omitted).
    #[serde(default)]
    pub volume: VolumeSource,
    /// Named volumes mounted in (shared with every other sandbox mounting them; not part of the
    /// sandbox's own file system, so snapshots and diffs leave them out).
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
    /// Network access through the egress proxy; `None`: loopback only.
    #[serde(default)]
    pub network: Option<crate::NetworkSpec>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_and_env() {
        assert!("root".parse::<UserSpec>().is_ok());
        assert!("_apt".parse::<UserSpec>().is_ok());
        for bad in ["", "Root", "1user", "a b", "a:b"] {
            assert!(bad.parse::<UserSpec>().is_err(), "{bad:?} accepted");
        }
        let e: EnvVar = "A=b=c".parse().expect("valid");
        assert_eq!((e.key.as_str(), e.value.as_str()), ("A", "b=c"));
        assert!("=x".parse::<EnvVar>().is_err());
        assert!("novalue".parse::<EnvVar>().is_err());
    }

    #[test]
    fn volume_sources() {
        let snapshot = VolumeSource::Snapshot("sn-0011223344556677".parse().expect("snapshot id"));
        let json = serde_json::to_string(&snapshot).expect("serialize");
        assert_eq!(json, r#"{"kind":"snapshot","id":"sn-0011223344556677"}"#);
        assert_eq!(serde_json::from_str::<VolumeSource>(&json).ok(), Some(snapshot));
        let fork = VolumeSource::Sandbox("sb-0011223344556677".parse().expect("sandbox id"));
        let json = serde_json::to_string(&fork).expect("serialize");
        assert_eq!(json, r#"{"kind":"sandbox","id":"sb-0011223344556677"}"#);
        assert_eq!(serde_json::from_str::<VolumeSource>(&json).ok(), Some(fork));
        let template = serde_json::to_string(&VolumeSource::Template).expect("serialize");
        assert_eq!(template, r#"{"kind":"template"}"#);
        assert_eq!(
            serde_json::from_str::<VolumeSource>(&template).ok(),
            Some(VolumeSource::Template)
        );
        for bad in [
            r#"{"kind":"snapshot","id":"../x"}"#,
            r#"{"kind":"snapshot"}"#,
            r#"{"kind":"sandbox","id":"../x"}"#,
            r#"{"kind":"sandbox"}"#,
            r#"{"kind":"template","extra":1}"#,
            r#"{"kind":"image"}"#,
        ] {
            assert!(
                serde_json::from_str::<VolumeSource>(bad).is_err(),
                "{bad} accepted"
            );
        }
        // Omitted in a spec: the template.
        let spec = SandboxSpec {
            id: "sb-1".parse().expect("id"),
            limits: Limits::default(),
            rootfs: RootfsSpec::Host,
            mounts: Vec::new(),
            workdir: None,
            user: UserSpec::default(),
            env: Vec::new(),
            volume: VolumeSource::Template,
            volumes: Vec::new(),
            network: None,
        };
        let mut json = serde_json::to_value(&spec).expect("serialize");
        json.as_object_mut().expect("object").remove("volume");
        json.as_object_mut().expect("object").remove("volumes");
        json.as_object_mut().expect("object").remove("network");
        assert_eq!(serde_json::from_value::<SandboxSpec>(json).ok(), Some(spec));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let bad = r#"{"memory":null,"cpus":null,"pids":null,"disk":null,"swap":1}"#;
        assert!(serde_json::from_str::<Limits>(bad).is_err());
    }
}
