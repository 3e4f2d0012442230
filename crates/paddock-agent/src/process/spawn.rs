//! Starting a process: user and working directory from the sandbox's `/etc/passwd`, `PATH` search in
//! the requested environment, pipes or a PTY, the privilege drop (in `paddock_sys::reap`), and the
//! tasks that pump its output, feed its stdin and enforce its timeout.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paddock_protocol::{AgentError, CommandSpec, ErrorCode, SpawnRequest};
use paddock_sys::reap::{spawn_child, ChildSpec, ChildStdio, Credentials, SpawnError, SpawnStage};
use tokio::net::unix::pipe;

use crate::agent::Agent;
use crate::error_code::{agent_error, io_error_code};
use crate::process::kill_tree::kill_tree;
use crate::process::output::pump_output;
use crate::process::stdin::start_stdin_writer;
use crate::process::table::Process;

/// `PATH` used for the search when the requested environment has none (glibc's `execvp` default
/// plus the sbin directories).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The program and arguments to exec, with the candidates `PATH` search produced.
#[derive(Debug)]
struct Program {
    candidates: Vec<String>,
    argv: Vec<String>,
    /// What to call it in errors.
    display: String,
}

/// The parent's ends of a new process's stdio.
#[derive(Debug)]
struct ParentEnds {
    outputs: Vec<pipe::Receiver>,
    stdin: Option<pipe::Sender>,
    /// A descriptor of the PTY master kept for resizing.
    pty_master: Option<OwnedFd>,
}

/// Starts the process `request` describes and registers it; the caller answers the request.
pub(crate) fn spawn_process(agent: &Rc<Agent>, request: &SpawnRequest) -> Result<Rc<Process>, AgentError> {
    let user = agent.user(request.user.as_deref())?;
    let program = resolve_program(&request.command, &request.env)?;
    let env = environment(&request.env)?;
    let cwds = match &request.cwd {
        Some(cwd) if cwd.starts_with('/') => vec![cwd.clone()],
        Some(cwd) => vec![format!("{}/{cwd}", user.home.trim_end_matches('/'))],
        None => vec![user.home.clone(), "/".to_owned()],
    };
    let creds = Credentials {
        uid: user.uid,
        gid: user.gid,
        groups: user.groups.clone(),
    };
    let spec = ChildSpec::new(&program.candidates, &program.argv, &env, &cwds, &creds)
        .map_err(|err| agent_error(ErrorCode::BadRequest, format!("spawn request: {err}")))?;

    let (pid, ends) = start_child(request, &spec).map_err(|err| spawn_error(&err, &program, &cwds))?;
    let started_at_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let process = Rc::new(Process::new(
        pid,
        request.command.clone(),
        request.tag.clone(),
        request.pty.is_some(),
        started_at_ms,
    ));
    agent.processes.borrow_mut().insert(process.clone());
    tracing::info!(pid, user = %user.name, pty = request.pty.is_some(), "process started");

    for (index, fd) in ends.outputs.into_iter().enumerate() {
        tokio::task::spawn_local(pump_output(agent.clone(), process.clone(), index, fd));
    }
    if let Some(stdin) = ends.stdin {
        process.set_stdin(start_stdin_writer(&process, stdin));
    }
    if let Some(master) = ends.pty_master {
        process.set_pty_master(master);
    }
    if let Some(ms) = request.timeout_ms {
        process.set_timeout_task(tokio::task::spawn_local(enforce_timeout(process.clone(), ms)));
    }
    Ok(process)
}

/// Creates the pipes or PTY and forks the child; returns its pid and the parent's ends.
fn start_child(request: &SpawnRequest, spec: &ChildSpec) -> Result<(u32, ParentEnds), SpawnError> {
    let stdio_error = |err: std::io::Error| SpawnError {
        stage: SpawnStage::Stdio,
        source: err,
    };
    if let Some(size) = request.pty {
        let size = paddock_sys::pty::WinSize {
            rows: size.rows,
            cols: size.cols,
        };
        let (master, slave) = paddock_sys::pty::open_pty(Some(size)).map_err(stdio_error)?;
        let stdio = ChildStdio {
            stdin: slave.as_fd(),
            stdout: slave.as_fd(),
            stderr: slave.as_fd(),
            terminal: Some(slave.as_fd()),
        };
        let pid = spawn_child(spec, stdio)?;
        drop(slave);
        // The master is read by the pump, written by the stdin task and resized by requests: three
        // descriptors of one non-blocking open file.
        rustix::io::ioctl_fionbio(&master, true).map_err(|e| stdio_error(e.into()))?;
        let reader = pipe::Receiver::from_owned_fd_unchecked(master.try_clone().map_err(stdio_error)?);
        let writer = pipe::Sender::from_owned_fd_unchecked(master.try_clone().map_err(stdio_error)?);
        let ends = ParentEnds {
            outputs: vec![reader.map_err(stdio_error)?],
            stdin: Some(writer.map_err(stdio_error)?),
            pty_master: Some(master),
        };
        return Ok((pid, ends));
    }
    let pipe =
        || rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| stdio_error(e.into()));
    let (out_read, out_write) = pipe()?;
    let (err_read, err_write) = pipe()?;
    let (stdin_child, stdin_parent): (OwnedFd, Option<OwnedFd>) = if request.stdin {
        let (read, write) = pipe()?;
        (read, Some(write))
    } else {
        (File::open("/dev/null").map_err(stdio_error)?.into(), None)
    };
    let stdio = ChildStdio {
        stdin: stdin_child.as_fd(),
        stdout: out_write.as_fd(),
        stderr: err_write.as_fd(),
        terminal: None,
    };
    let pid = spawn_child(spec, stdio)?;
    drop((stdin_child, out_write, err_write));
    let ends = ParentEnds {
        outputs: vec![
            pipe::Receiver::from_owned_fd(out_read).map_err(stdio_error)?,
            pipe::Receiver::from_owned_fd(err_read).map_err(stdio_error)?,
        ],
        stdin: stdin_parent
            .map(pipe::Sender::from_owned_fd)
            .transpose()
            .map_err(stdio_error)?,
        pty_master: None,
    };
    Ok((pid, ends))
}

/// The exec candidates: `argv[0]` itself if it contains a slash, else every `PATH` entry of the
/// requested environment; a shell script runs under `/bin/bash -c`, or `/bin/sh -c` without bash.
fn resolve_program(command: &CommandSpec, env: &BTreeMap<String, String>) -> Result<Program, AgentError> {
    match command {
        CommandSpec::Argv { argv } => {
            let Some(name) = argv.first().filter(|n| !n.is_empty()) else {
                return Err(agent_error(ErrorCode::BadRequest, "argv must not be empty"));
            };
            let candidates = if name.contains('/') {
                vec![name.clone()]
            } else {
                let path = env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
                path.split(':')
                    .map(|dir| if dir.is_empty() { "." } else { dir })
                    .map(|dir| format!("{}/{name}", dir.trim_end_matches('/')))
                    .collect()
            };
            Ok(Program {
                candidates,
                argv: argv.clone(),
                display: name.clone(),
            })
        }
        CommandSpec::Shell { script } => {
            let shell = if std::path::Path::new("/bin/bash").exists() {
                "/bin/bash"
            } else {
                "/bin/sh"
            };
            Ok(Program {
                candidates: vec![shell.to_owned()],
                argv: vec![shell.to_owned(), "-c".to_owned(), script.clone()],
                display: shell.to_owned(),
            })
        }
    }
}

/// `KEY=VALUE` strings, refusing keys that cannot be environment variable names.
fn environment(env: &BTreeMap<String, String>) -> Result<Vec<String>, AgentError> {
    env.iter()
        .map(|(key, value)| {
            if key.is_empty() || key.contains('=') {
                return Err(agent_error(
                    ErrorCode::BadRequest,
                    format!("invalid environment variable name {key:?}"),
                ));
            }
            Ok(format!("{key}={value}"))
        })
        .collect()
}

/// Maps a failed spawn to the protocol: exec problems are `ExecFailed`, a bad working directory
/// gets the code of its errno, the rest is `Io` naming the failing step.
fn spawn_error(err: &SpawnError, program: &Program, cwds: &[String]) -> AgentError {
    match err.stage {
        SpawnStage::Exec => {
            let searched = program.candidates.len() > 1 || !program.display.contains('/');
            let how = if searched { " (searched PATH)" } else { "" };
            agent_error(
                ErrorCode::ExecFailed,
                format!("cannot execute {:?}{how}: {}", program.display, err.source),
            )
        }
        SpawnStage::Chdir => agent_error(
            io_error_code(&err.source),
            format!("working directory {:?}: {}", cwds[0], err.source),
        ),
        _ => agent_error(ErrorCode::Io, format!("{err}: {}", err.source)),
    }
}

/// Kills the process tree with `SIGKILL` once `ms` milliseconds have passed; the exit then reports
/// `timed_out`. Aborted when the process exits first.
async fn enforce_timeout(process: Rc<Process>, ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
    if process.exit_status().is_none() {
        tracing::info!(
            pid = process.pid(),
            timeout_ms = ms,
            "process timed out; killing its tree"
        );
        process.mark_timed_out();
        kill_tree(process.pid(), libc::SIGKILL, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_search_uses_the_requested_path() {
        let env = BTreeMap::from([("PATH".to_owned(), "/opt/bin::/usr/bin/".to_owned())]);
        let argv = CommandSpec::Argv {
            argv: vec!["tool".into(), "-v".into()],
        };
        let p = resolve_program(&argv, &env).expect("resolves");
        assert_eq!(p.candidates, vec!["/opt/bin/tool", "./tool", "/usr/bin/tool"]);
        let p = resolve_program(&argv, &BTreeMap::new()).expect("resolves");
        assert_eq!(p.candidates.last().map(String::as_str), Some("/bin/tool"));
        let abs = CommandSpec::Argv {
            argv: vec!["./x".into()],
        };
        assert_eq!(
            resolve_program(&abs, &env).expect("resolves").candidates,
            vec!["./x"]
        );
        let empty = CommandSpec::Argv { argv: vec![] };
        assert_eq!(
            resolve_program(&empty, &env).expect_err("empty").code,
            ErrorCode::BadRequest
        );
    }

    #[test]
    fn environment_names_are_checked() {
        let ok = BTreeMap::from([("A".to_owned(), "1=2".to_owned())]);
        assert_eq!(environment(&ok).expect("ok"), vec!["A=1=2"]);
        let bad = BTreeMap::from([("A=B".to_owned(), "1".to_owned())]);
        assert_eq!(environment(&bad).expect_err("bad").code, ErrorCode::BadRequest);
    }
}
