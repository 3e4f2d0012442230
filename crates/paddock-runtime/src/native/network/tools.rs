//! The command-line tools that make links, found once when the backend opens.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::NetworkError;

/// Where the tools are looked for (not `$PATH`: a server's environment should not pick them).
const TOOL_DIRS: [&str; 4] = ["/usr/sbin", "/usr/bin", "/sbin", "/bin"];

/// Absolute paths of the tools a link needs.
#[derive(Debug, Clone)]
pub struct NetworkTools {
    pub(super) ip: PathBuf,
    pub(super) nft: PathBuf,
    pub(super) unshare: PathBuf,
    pub(super) nsenter: PathBuf,
}

impl NetworkTools {
    /// Finds every tool, or says which are missing (`ip`: iproute2; `nft`: nftables; `unshare`,
    /// `nsenter`: util-linux).
    pub fn find() -> Result<Self, String> {
        let mut missing = Vec::new();
        let mut find = |name: &str| {
            let found = TOOL_DIRS
                .iter()
                .map(|dir| Path::new(dir).join(name))
                .find(|p| is_executable(p));
            if found.is_none() {
                missing.push(name.to_owned());
            }
            found.unwrap_or_default()
        };
        let tools = Self {
            ip: find("ip"),
            nft: find("nft"),
            unshare: find("unshare"),
            nsenter: find("nsenter"),
        };
        if missing.is_empty() {
            Ok(tools)
        } else {
            Err(missing.join(", "))
        }
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A tool started with its whole input written; [`Running::wait`] collects its verdict.
#[derive(Debug)]
pub(super) struct Running {
    step: &'static str,
    tool: PathBuf,
    child: Option<Child>,
}

impl Running {
    /// Starts `program args...` with an empty environment, feeds it `input` and closes its stdin.
    pub(super) fn start(
        step: &'static str,
        program: &Path,
        args: &[&str],
        input: &str,
    ) -> Result<Self, NetworkError> {
        let spawn_err = |source| NetworkError::Spawn {
            tool: program.to_owned(),
            source,
        };
        let mut child = Command::new(program)
            .args(args)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(spawn_err)?;
        let mut running = Self {
            step,
            tool: program.to_owned(),
            child: None,
        };
        // The input is a few hundred bytes: far below a pipe's capacity, so this never blocks.
        let written = child
            .stdin
            .take()
            .map(|mut stdin| stdin.write_all(input.as_bytes()));
        running.child = Some(child);
        if let Some(Err(e)) = written {
            drop(running.wait());
            return Err(spawn_err(e));
        }
        Ok(running)
    }

    /// Waits for the tool; its stderr on failure.
    pub(super) fn wait(mut self) -> Result<(), NetworkError> {
        let Some(child) = self.child.take() else {
            return Ok(());
        };
        let out = child.wait_with_output().map_err(|source| NetworkError::Spawn {
            tool: self.tool.clone(),
            source,
        })?;
        if out.status.success() {
            return Ok(());
        }
        Err(NetworkError::Tool {
            step: self.step,
            tool: std::mem::take(&mut self.tool),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

impl Drop for Running {
    /// A tool abandoned before [`Running::wait`] (an error elsewhere) is killed and reaped, so that
    /// nothing it would have done happens after the caller cleaned up.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs a tool to completion.
pub(super) fn run(
    step: &'static str,
    program: &Path,
    args: &[&str],
    input: &str,
) -> Result<(), NetworkError> {
    Running::start(step, program, args, input)?.wait()
}
