//! Which credentials a pull presents: explicit ones, then the environment's, then
//! `~/.docker/config.json`'s `auths`, else none.
//!
//! Only basic credentials are read from the docker config (`auth`, base64 of `user:password`, or
//! `username` and `password`); credential helpers (`credsStore`, `credHelpers`) and identity tokens
//! are not run or used. The registry answers a basic or a bearer-token challenge with them:
//! oci-client does both.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use crate::error::RegistryError;

/// The environment variable holding the registry user name (`PADDOCK_REGISTRY_USERNAME`).
pub const USERNAME_ENV: &str = "PADDOCK_REGISTRY_USERNAME";
/// The environment variable holding the registry password or token (`PADDOCK_REGISTRY_PASSWORD`).
pub const PASSWORD_ENV: &str = "PADDOCK_REGISTRY_PASSWORD";

/// The largest docker config file read.
const MAX_DOCKER_CONFIG: u64 = 1 << 20;

/// Credentials presented to a registry. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// No credentials: anonymous pulls (and anonymous bearer tokens).
    Anonymous,
    /// A user name and password (or token), for basic auth or a bearer-token exchange.
    Basic { username: String, password: String },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Anonymous => f.write_str("Anonymous"),
            Self::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
        }
    }
}

/// Where credentials may come from, in order of precedence: `explicit`, `environment`, the
/// docker config at `docker_config`, else anonymous.
#[derive(Debug, Clone, Default)]
pub struct CredentialSources {
    /// Given by the caller (flags, an API request).
    pub explicit: Option<Credentials>,
    /// From `PADDOCK_REGISTRY_USERNAME` / `PADDOCK_REGISTRY_PASSWORD`.
    pub environment: Option<Credentials>,
    /// A docker `config.json`; a missing file means no entry.
    pub docker_config: Option<PathBuf>,
}

impl CredentialSources {
    /// The process environment's sources: the two `PADDOCK_REGISTRY_*` variables (both must be
    /// set) and `$DOCKER_CONFIG/config.json` or `$HOME/.docker/config.json`. Meant for the binary,
    /// which reads its environment once.
    pub fn from_process_environment() -> Self {
        let environment = match (std::env::var(USERNAME_ENV), std::env::var(PASSWORD_ENV)) {
            (Ok(username), Ok(password)) if !username.is_empty() => {
                Some(Credentials::Basic { username, password })
            }
            _ => None,
        };
        let docker_config = std::env::var_os("DOCKER_CONFIG")
            .map(|d| PathBuf::from(d).join("config.json"))
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json")));
        Self {
            explicit: None,
            environment,
            docker_config,
        }
    }

    /// The credentials for `registry` (as written in the reference: `docker.io`, `host:5000`).
    pub fn resolve(&self, registry: &str) -> Result<Credentials, RegistryError> {
        if let Some(c) = self.explicit.clone().or_else(|| self.environment.clone()) {
            return Ok(c);
        }
        let Some(path) = &self.docker_config else {
            return Ok(Credentials::Anonymous);
        };
        let text = match read_capped(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Credentials::Anonymous),
            Err(e) => return Err(RegistryError::io("read docker config", path, e)),
        };
        docker_config_credentials(&text, registry)
            .map_err(|reason| {
                RegistryError::InvalidOptions(format!(
                    "docker config {} is invalid: {reason}",
                    path.display()
                ))
            })
            .map(|c| c.unwrap_or(Credentials::Anonymous))
    }
}

fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut buf = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_DOCKER_CONFIG + 1)
        .read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_DOCKER_CONFIG {
        return Err(std::io::Error::other("larger than 1 MiB"));
    }
    Ok(buf)
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
}

/// The registry a docker config key names, normalized: scheme and path dropped, Docker Hub's
/// names (`https://index.docker.io/v1/`, `index.docker.io`, `registry-1.docker.io`) as `docker.io`.
fn normalize_registry(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let host = rest.split('/').next().unwrap_or(rest).to_ascii_lowercase();
    match host.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".into(),
        _ => host,
    }
}

/// The credentials a docker config's `auths` holds for `registry`, if any.
fn docker_config_credentials(text: &[u8], registry: &str) -> Result<Option<Credentials>, String> {
    let config: DockerConfig = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    let wanted = normalize_registry(registry);
    let Some((key, entry)) = config.auths.iter().find(|(k, _)| normalize_registry(k) == wanted) else {
        return Ok(None);
    };
    if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| format!("auths[{key:?}].auth is not base64"))?;
        let decoded = String::from_utf8(decoded).map_err(|_| format!("auths[{key:?}].auth is not UTF-8"))?;
        let (username, password) = decoded
            .split_once(':')
            .ok_or_else(|| format!("auths[{key:?}].auth is not user:password"))?;
        return Ok(Some(Credentials::Basic {
            username: username.into(),
            password: password.into(),
        }));
    }
    match (&entry.username, &entry.password) {
        (Some(u), Some(p)) if !u.is_empty() => Ok(Some(Credentials::Basic {
            username: u.clone(),
            password: p.clone(),
        })),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(u: &str, p: &str) -> Credentials {
        Credentials::Basic {
            username: u.into(),
            password: p.into(),
        }
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    #[test]
    fn docker_config_keys_in_every_form() {
        let config = format!(
            r#"{{"auths": {{
                "https://index.docker.io/v1/": {{"auth": "{}"}},
                "https://reg.example:5000": {{"auth": "{}"}},
                "other.example": {{"username": "u3", "password": "p:3"}},
                "empty.example": {{}}
            }}}}"#,
            b64("hub:pw"),
            b64("u2:p2:with:colons")
        );
        let get = |r: &str| docker_config_credentials(config.as_bytes(), r).expect("parses");
        assert_eq!(get("docker.io"), Some(basic("hub", "pw")));
        assert_eq!(get("reg.example:5000"), Some(basic("u2", "p2:with:colons")));
        assert_eq!(get("other.example"), Some(basic("u3", "p:3")));
        assert_eq!(get("empty.example"), None);
        assert_eq!(get("reg.example"), None);
        assert_eq!(get("unknown.example"), None);
    }

    #[test]
    fn bad_docker_configs_say_why() {
        let bad = docker_config_credentials(br#"{"auths":{"h":{"auth":"%%%"}}}"#, "h");
        assert!(bad.expect_err("bad base64").contains("not base64"));
        let bad = docker_config_credentials(
            format!(r#"{{"auths":{{"h":{{"auth":"{}"}}}}}}"#, b64("nocolon")).as_bytes(),
            "h",
        );
        assert!(bad.expect_err("no colon").contains("user:password"));
        assert!(docker_config_credentials(b"not json", "h").is_err());
    }

    #[test]
    fn precedence_explicit_then_environment_then_file_then_anonymous() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            format!(r#"{{"auths":{{"h:1":{{"auth":"{}"}}}}}}"#, b64("f:f")),
        )
        .expect("write");
        let mut sources = CredentialSources {
            explicit: Some(basic("e", "e")),
            environment: Some(basic("v", "v")),
            docker_config: Some(path),
        };
        assert_eq!(sources.resolve("h:1").expect("resolve"), basic("e", "e"));
        sources.explicit = None;
        assert_eq!(sources.resolve("h:1").expect("resolve"), basic("v", "v"));
        sources.environment = None;
        assert_eq!(sources.resolve("h:1").expect("resolve"), basic("f", "f"));
        assert_eq!(sources.resolve("h:2").expect("resolve"), Credentials::Anonymous);
        sources.docker_config = Some(dir.path().join("missing.json"));
        assert_eq!(sources.resolve("h:1").expect("resolve"), Credentials::Anonymous);
        assert!(!format!("{:?}", basic("u", "secret")).contains("secret"));
    }
}
