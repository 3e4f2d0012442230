//! What an image template carries besides its files: the process defaults of the image's config.

use serde::{Deserialize, Serialize};

/// The process defaults of an image's config (`Env`, `WorkingDir`, `User`, `ExposedPorts`,
/// `Entrypoint`, `Cmd`), as the image states them: sandboxes made from its template start with them
/// (a create request's own values win).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    /// `NAME=value` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// The working directory, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The user (`name`, `uid`, `name:group`, `uid:gid`), if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Exposed ports (`80/tcp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
    /// The entrypoint, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// The default command, if set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
}

impl ImageConfig {
    /// The start command: the entrypoint followed by the command, as docker runs them; `None` when
    /// both are unset or empty.
    pub fn start_command(&self) -> Option<Vec<String>> {
        let argv: Vec<String> = self
            .entrypoint
            .iter()
            .flatten()
            .chain(self.cmd.iter().flatten())
            .cloned()
            .collect();
        (!argv.is_empty()).then_some(argv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_command_is_entrypoint_then_cmd() {
        let mut c = ImageConfig::default();
        assert_eq!(c.start_command(), None);
        c.cmd = Some(vec!["serve".into(), "--port=8000".into()]);
        assert_eq!(
            c.start_command(),
            Some(vec!["serve".into(), "--port=8000".into()])
        );
        c.entrypoint = Some(vec!["/bin/app".into()]);
        assert_eq!(
            c.start_command(),
            Some(vec!["/bin/app".into(), "serve".into(), "--port=8000".into()])
        );
        let json = serde_json::to_string(&ImageConfig::default()).expect("json");
        assert_eq!(json, "{}");
    }
}
