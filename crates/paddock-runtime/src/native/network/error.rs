//! Why giving a sandbox its link failed.

use std::io;
use std::path::PathBuf;

/// Why creating, configuring or removing a sandbox's network link failed.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// A tool could not be started or waited for.
    #[error("failed to run {tool}")]
    Spawn {
        /// The tool's path.
        tool: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A tool ran and failed.
    #[error("{step} failed ({tool} exited with {status}): {stderr}")]
    Tool {
        /// What it was doing.
        step: &'static str,
        /// The tool's path.
        tool: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr (trimmed).
        stderr: String,
    },
    /// Every slot of the subnet is taken.
    #[error("no free network slot: all {slots} links of subnet {subnet} are in use")]
    NoFreeSlot {
        /// The subnet.
        subnet: String,
        /// How many links it has.
        slots: u32,
    },
    /// The path of the namespace pin cannot be handed to `ip` (its batch syntax splits words).
    #[error("unusable network namespace path {0} (whitespace, quotes, `#` or `\\` in it)")]
    UnusablePath(PathBuf),
    /// A file operation on the namespace pin, an interface's sysfs entry or a sandbox file failed.
    #[error("failed to {what} {path}")]
    File {
        /// The operation.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

pub(super) fn file_err<'a>(
    what: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(io::Error) -> NetworkError + 'a {
    move |source| NetworkError::File {
        what,
        path: path.to_owned(),
        source,
    }
}
