//! The agent's command line, parsed by hand: four flags do not justify an argument-parsing crate in a
//! binary that must stay small.

use std::path::PathBuf;

/// Where the agent accepts host connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// An already bound and listening unix socket inherited as this descriptor number (production:
    /// the setup shim binds it outside the sandbox).
    Fd(i32),
    /// Bind a unix socket at this path (tests).
    Path(PathBuf),
}

/// The agent's configuration, from its command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// Where to accept connections.
    pub listen: Listen,
    /// The directory file operations are confined to (`/` in production).
    pub root: PathBuf,
    /// The user for processes and file ownership when a request names none.
    pub default_user: String,
    /// Most verbose level logged to stderr.
    pub log_level: tracing::Level,
}

/// The usage text.
pub const USAGE: &str =
    "usage: paddock-agent (--listen-fd N | --listen PATH) [--root DIR] [--default-user NAME] \
                         [--log-level error|warn|info|debug|trace]";

/// Why the command line is not acceptable.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A flag is missing its value.
    #[error("flag {flag} needs a value")]
    MissingValue {
        /// The flag.
        flag: String,
    },
    /// A flag's value does not parse.
    #[error("invalid value {value:?} for {flag}")]
    InvalidValue {
        /// The flag.
        flag: String,
        /// The value given.
        value: String,
    },
    /// An argument that is not a known flag.
    #[error("unknown argument {0:?}")]
    Unknown(String),
    /// Neither or both of `--listen-fd` and `--listen`.
    #[error("exactly one of --listen-fd and --listen is required")]
    ListenRequired,
}

/// Parses the arguments after the program name.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<AgentConfig, CliError> {
    let mut listen = None;
    let mut listens = 0;
    let mut root = PathBuf::from("/");
    let mut default_user = "user".to_owned();
    let mut log_level = tracing::Level::INFO;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or(CliError::MissingValue { flag: flag.clone() })
        };
        match flag.as_str() {
            "--listen-fd" => {
                let v = value()?;
                let fd = v.parse::<i32>().ok().filter(|fd| *fd >= 0);
                let fd = fd.ok_or(CliError::InvalidValue {
                    flag: flag.clone(),
                    value: v,
                })?;
                listen = Some(Listen::Fd(fd));
                listens += 1;
            }
            "--listen" => {
                listen = Some(Listen::Path(PathBuf::from(value()?)));
                listens += 1;
            }
            "--root" => root = PathBuf::from(value()?),
            "--default-user" => default_user = value()?,
            "--log-level" => {
                let v = value()?;
                log_level = v.parse().map_err(|_| CliError::InvalidValue {
                    flag: flag.clone(),
                    value: v,
                })?;
            }
            _ => return Err(CliError::Unknown(arg)),
        }
    }
    match listen {
        Some(listen) if listens == 1 => Ok(AgentConfig {
            listen,
            root,
            default_user,
            log_level,
        }),
        _ => Err(CliError::ListenRequired),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<AgentConfig, CliError> {
        parse_args(args.iter().map(|s| (*s).to_owned()))
    }

    #[test]
    fn defaults_and_flags() {
        let c = parse(&["--listen-fd", "3"]).expect("parses");
        assert_eq!(c.listen, Listen::Fd(3));
        assert_eq!(c.root, PathBuf::from("/"));
        assert_eq!(c.default_user, "user");
        let c = parse(&[
            "--listen=/tmp/s",
            "--root",
            "/srv",
            "--default-user=dev",
            "--log-level",
            "debug",
        ])
        .expect("parses");
        assert_eq!(c.listen, Listen::Path("/tmp/s".into()));
        assert_eq!(c.root, PathBuf::from("/srv"));
        assert_eq!(c.default_user, "dev");
        assert_eq!(c.log_level, tracing::Level::DEBUG);
    }

    #[test]
    fn rejects_bad_command_lines() {
        assert!(matches!(parse(&[]), Err(CliError::ListenRequired)));
        assert!(matches!(
            parse(&["--listen-fd", "3", "--listen", "/s"]),
            Err(CliError::ListenRequired)
        ));
        assert!(matches!(
            parse(&["--listen-fd", "x"]),
            Err(CliError::InvalidValue { .. })
        ));
        assert!(matches!(parse(&["--listen"]), Err(CliError::MissingValue { .. })));
        assert!(matches!(parse(&["--bogus"]), Err(CliError::Unknown(_))));
    }
}
