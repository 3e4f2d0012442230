//! The interpreter that stands in for programs: a spawned `argv` must name one of its commands
//! (bare, or under a `PATH` directory such as `/bin`), and a shell script (`CommandSpec::Shell`,
//! `sh -c`, `bash -c`) is parsed by `parse.rs` and run command by command. Commands read and write
//! the sandbox's in-memory files through the agent (so watches see their changes) and the process's
//! streams (waiting while an attached reader lags).
//!
//! The commands (`commands.rs`): `true`, `false`, `:`, `echo [-n] [-e]`, `printf`, `cat [FILE...]`
//! (stdin when none), `sleep SECONDS` (until killed or timed out), `exit [N]`, `ls [-a] [PATH...]`,
//! `pwd`, `cd`, `mkdir [-p]`, `rm [-r] [-f]`, `touch`, `hostname`, `whoami`, `id [-u|-un]`, `env`,
//! `test`/`[` (`-e`, `-f`, `-d`, `-s`, `=`, `!=`), `ln -s`, `chmod OCTAL`, `sh [-l] -c`/`bash [-l] -c`, `exec`,
//! and `tar` in the two
//! forms the control plane runs (`tar -C DIR -cf - .` and `tar -C DIR -xf - ...`). Anything else
//! is "not found" (127 in a script; `exec_failed` as a spawned program), as on a real system without
//! that program.

mod commands;
mod parse;
mod tar;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use paddock_protocol::{AgentError, CommandSpec, ErrorCode, Stream};
use tokio::sync::mpsc;

use super::outbound::agent_error;
use super::process::Process;
use super::Agent;
use crate::fake::fs::FsError;
use parse::{Connector, Redirect, Word};

/// Directories a spawned program may be named under.
const PATH_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// What a process runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Program {
    Argv(Vec<String>),
    Script(String),
}

/// The user a process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct User {
    pub(crate) name: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) home: String,
}

impl User {
    /// `name` from the sandbox's `/etc/passwd`.
    pub(crate) fn lookup(agent: &Agent, name: &str) -> Result<Self, AgentError> {
        agent
            .read_fs(|fs| Ok(fs.user(name)))
            .ok()
            .flatten()
            .map(|(uid, gid, home)| Self {
                name: name.to_owned(),
                uid,
                gid,
                home,
            })
            .ok_or_else(|| {
                agent_error(
                    ErrorCode::UnknownUser,
                    format!("user {name:?} is not in the sandbox's /etc/passwd"),
                )
            })
    }
}

/// The program a spawn runs, refused (`exec_failed`, as the real agent's exec) when the interpreter
/// has no such command.
pub(crate) fn resolve(command: &CommandSpec) -> Result<Program, AgentError> {
    match command {
        CommandSpec::Shell { script } => Ok(Program::Script(script.clone())),
        CommandSpec::Argv { argv } => {
            let Some(name) = argv.first().filter(|n| !n.is_empty()) else {
                return Err(agent_error(ErrorCode::BadRequest, "argv must not be empty"));
            };
            let base = match name.rsplit_once('/') {
                Some((dir, base)) if PATH_DIRS.contains(&dir) => base,
                Some(_) => "",
                None => name.as_str(),
            };
            if !commands::is_program(base) {
                let how = if name.contains('/') {
                    ""
                } else {
                    " (searched PATH)"
                };
                return Err(agent_error(
                    ErrorCode::ExecFailed,
                    format!("cannot execute {name:?}{how}: {}", FsError(libc::ENOENT).io()),
                ));
            }
            let mut argv = argv.clone();
            argv[0] = base.to_owned();
            Ok(Program::Argv(argv))
        }
    }
}

/// Refuses a working directory that is not a directory, as the real agent's `chdir` does.
pub(crate) fn check_cwd(agent: &Agent, cwd: &str) -> Result<(), AgentError> {
    let error = |e: FsError| agent_error(e.code(), format!("working directory {cwd:?}: {}", e.io()));
    let is_dir = agent
        .read_fs(|fs| {
            let abs = fs.resolve(cwd, true)?;
            Ok(fs.node(&abs).map(|n| n.is_dir()))
        })
        .map_err(error)?;
    match is_dir {
        Some(true) => Ok(()),
        Some(false) => Err(error(FsError(libc::ENOTDIR))),
        None => Err(error(FsError(libc::ENOENT))),
    }
}

/// What a process's commands run with.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) agent: Arc<Agent>,
    pub(crate) process: Arc<Process>,
    /// Its stdin pipe; `None` is `/dev/null`.
    pub(crate) stdin: Option<mpsc::Receiver<Vec<u8>>>,
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) cwd: String,
    pub(crate) user: User,
}

/// Where a command's output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Sink {
    Stream(Stream),
    /// Appended to this file (absolute path).
    File(String),
    Null,
}

/// Where a command's input comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Input {
    /// The process's stdin.
    Stdin,
    Bytes(Vec<u8>),
}

/// A command's streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Io {
    pub(crate) out: Sink,
    pub(crate) err: Sink,
    pub(crate) input: Input,
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Go on with this status.
    Next(i32),
    /// The script ends with this status (`exit`, `exec`).
    Exit(i32),
}

/// The interpreter of one process.
#[derive(Debug)]
pub(crate) struct Shell {
    ctx: Context,
    status: i32,
}

/// Runs a process's program to its end; its exit code.
pub(crate) async fn run(ctx: Context, program: Program) -> i32 {
    let mut shell = Shell { ctx, status: 0 };
    let io = Io {
        out: Sink::Stream(Stream::Stdout),
        err: Sink::Stream(Stream::Stderr),
        input: Input::Stdin,
    };
    let flow = match program {
        Program::Argv(argv) => shell.command(argv, io).await,
        Program::Script(script) => shell.script(&script, io).await,
    };
    match flow {
        Flow::Next(code) | Flow::Exit(code) => code,
    }
}

type Boxed<'a> = Pin<Box<dyn Future<Output = Flow> + Send + 'a>>;

impl Shell {
    /// Runs a script; `exit` ends it.
    pub(crate) fn script<'a>(&'a mut self, script: &'a str, io: Io) -> Boxed<'a> {
        Box::pin(async move {
            let commands = match parse::parse(script) {
                Ok(commands) => commands,
                Err(message) => {
                    self.say(&io.err, &format!("sh: 1: {message}\n")).await;
                    return Flow::Next(2);
                }
            };
            for (connector, command) in commands {
                let skip = match connector {
                    Connector::Always => false,
                    Connector::And => self.status != 0,
                    Connector::Or => self.status == 0,
                };
                if skip {
                    continue;
                }
                let flow = self.simple(command, io.clone()).await;
                match flow {
                    Flow::Next(status) => self.status = status,
                    Flow::Exit(status) => return Flow::Exit(status),
                }
            }
            Flow::Next(self.status)
        })
    }

    /// One command with its redirections.
    async fn simple(&mut self, command: parse::Command, mut io: Io) -> Flow {
        for (redirect, target) in command.redirects {
            let target = target.map(|w| self.expand(&w)).unwrap_or_default();
            let path = self.absolute(&target);
            let opened = match redirect {
                Redirect::Out | Redirect::ErrOut => self.open_output(&path, true),
                Redirect::Append | Redirect::ErrAppend => self.open_output(&path, false),
                Redirect::In => match self.read_file(&path) {
                    Ok(data) => {
                        io.input = Input::Bytes(data);
                        Ok(())
                    }
                    Err(e) => Err(e),
                },
                Redirect::OutToErr => {
                    io.out = io.err.clone();
                    Ok(())
                }
                Redirect::ErrToOut => {
                    io.err = io.out.clone();
                    Ok(())
                }
            };
            if let Err(e) = opened {
                let verb = if redirect == Redirect::In {
                    "open"
                } else {
                    "create"
                };
                self.say(&io.err, &format!("sh: 1: cannot {verb} {target}: {}\n", e.io()))
                    .await;
                return Flow::Next(2);
            }
            let sink = if path == "/dev/null" {
                Sink::Null
            } else {
                Sink::File(path)
            };
            match redirect {
                Redirect::Out | Redirect::Append => io.out = sink,
                Redirect::ErrOut | Redirect::ErrAppend => io.err = sink,
                _ => {}
            }
        }
        let mut argv = Vec::with_capacity(command.words.len());
        for word in &command.words {
            let text = self.expand(word);
            if !text.is_empty() || word.quoted {
                argv.push(text);
            }
        }
        if argv.is_empty() {
            return Flow::Next(0);
        }
        self.command(argv, io).await
    }

    /// Runs command `argv` (boxed: `sh -c` and `exec` recurse).
    pub(crate) fn command(&mut self, argv: Vec<String>, io: Io) -> Boxed<'_> {
        Box::pin(async move { commands::run(self, argv, io).await })
    }

    fn expand(&self, word: &Word) -> String {
        word.parts
            .iter()
            .map(|part| match part {
                parse::Part::Lit(s) => s.clone(),
                parse::Part::Var(name) if name == "?" => self.status.to_string(),
                parse::Part::Var(name) => self.ctx.env.get(name).cloned().unwrap_or_default(),
            })
            .collect()
    }

    /// `path` from the shell's working directory.
    pub(crate) fn absolute(&self, path: &str) -> String {
        if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("{}/{path}", self.ctx.cwd.trim_end_matches('/'))
        }
    }

    /// Creates (or with `truncate` empties) a redirection's file.
    fn open_output(&self, path: &str, truncate: bool) -> Result<(), FsError> {
        if path == "/dev/null" {
            return Ok(());
        }
        let owner = self.owner();
        self.ctx
            .agent
            .change_fs(|fs| fs.write(path, 0, truncate, &[], owner))
    }

    /// A whole file (at most 64 MiB).
    pub(crate) fn read_file(&self, path: &str) -> Result<Vec<u8>, FsError> {
        if path == "/dev/null" {
            return Ok(Vec::new());
        }
        self.ctx
            .agent
            .read_fs(|fs| fs.read(path, 0, 64 << 20))
            .map(|(data, _)| data)
    }

    /// Mode and owner of files the process creates.
    pub(crate) fn owner(&self) -> (u32, u32, u32) {
        (0o644, self.ctx.user.uid, self.ctx.user.gid)
    }

    /// Writes to a sink; false (after saying why on stderr) if a file refused it.
    pub(crate) async fn emit(&self, sink: &Sink, data: &[u8]) -> bool {
        // A frozen process writes nothing until it is thawed.
        self.ctx.agent.until_running().await;
        match sink {
            Sink::Null => true,
            Sink::Stream(stream) => {
                self.ctx.process.write(*stream, data).await;
                true
            }
            Sink::File(path) => {
                let owner = self.owner();
                let appended = self.ctx.agent.change_fs(|fs| {
                    let end = fs.stat(path).map_or(0, |e| e.node.size());
                    fs.write(path, end, false, data, owner)
                });
                if let Err(e) = appended {
                    let message = format!("sh: 1: write error: {}\n", e.io());
                    self.ctx.process.write(Stream::Stderr, message.as_bytes()).await;
                    return false;
                }
                true
            }
        }
    }

    /// Writes text to a sink.
    pub(crate) async fn say(&self, sink: &Sink, text: &str) -> bool {
        self.emit(sink, text.as_bytes()).await
    }

    /// The next chunk of input (`None` at its end); `Bytes` input comes whole, once.
    pub(crate) async fn read_input(&mut self, input: &mut Input) -> Option<Vec<u8>> {
        match input {
            Input::Bytes(data) if data.is_empty() => None,
            Input::Bytes(data) => Some(std::mem::take(data)),
            Input::Stdin => match self.ctx.stdin.as_mut() {
                Some(rx) => rx.recv().await,
                None => None,
            },
        }
    }

    pub(crate) fn ctx(&self) -> &Context {
        &self.ctx
    }

    pub(crate) fn ctx_mut(&mut self) -> &mut Context {
        &mut self.ctx
    }

    pub(crate) fn status(&self) -> i32 {
        self.status
    }
}
