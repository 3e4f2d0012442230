//! Starting a kernel: five free ports on 127.0.0.1, a connection file with a fresh key in a private
//! directory, the kernel as a detached `kernel`-tagged process, then the Jupyter handshake.
//!
//! The connection file lives in `/tmp/.paddock-kernels-<uid>/` (mode 0700, owned by the kernel's
//! user; an existing one must be a real directory with that owner and permissions; the sticky bit,
//! which ipykernel adds, is allowed), created
//! through the confined root without following symlinks, as a new file (`O_EXCL`) of mode 0600.
//!
//! What it does not do: reserve the ports until the kernel binds them (they are read and closed,
//! as Jupyter's own launcher does; a port taken meanwhile makes the kernel fail to start, reported
//! with its stderr), or retry a failed start.

use std::cell::RefCell;
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use jupyter_protocol::{ConnectionInfo, KernelInfoReply, Transport};
use paddock_protocol::kernel::{KernelInfo, KernelStart};
use paddock_protocol::{AgentError, CommandSpec, ErrorCode, SpawnRequest};
use paddock_sys::fs_in_root::{EntryKind, Owner};
use rand::TryRngCore;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::cell::{run_cells, watch_heartbeat};
use super::connection::{ClientError, KernelClient};
use super::{Kernel, MAX_QUEUED_CELLS};
use crate::agent::Agent;
use crate::error_code::{agent_error, fs_error};
use crate::process::kill_tree::kill_tree;
use crate::process::spawn::spawn_process;
use crate::process::table::Process;

/// The argument replaced by the connection file's path.
const CONNECTION_FILE_ARG: &str = "{connection_file}";
/// Stderr shown when a kernel fails to start.
const STDERR_TAIL: usize = 4096;
/// How long to wait for a dead kernel's stderr to be read to its end.
const STDERR_DRAIN: Duration = Duration::from_millis(500);

/// Starts the kernel `request` describes and waits until it answers.
pub(super) async fn start(
    agent: &Rc<Agent>,
    request: &KernelStart,
) -> Result<(Rc<Kernel>, KernelInfo), AgentError> {
    let deadline = Instant::now() + Duration::from_millis(request.ready_timeout_ms);
    let user = agent.user(request.user.as_deref())?;
    let owner = Owner {
        uid: user.uid,
        gid: user.gid,
    };
    let info = ConnectionInfo {
        ip: Ipv4Addr::LOCALHOST.to_string(),
        transport: Transport::TCP,
        shell_port: 0,
        iopub_port: 0,
        stdin_port: 0,
        control_port: 0,
        hb_port: 0,
        key: random_hex(32)?,
        signature_scheme: "hmac-sha256".to_owned(),
        kernel_name: None,
    };
    let info = with_free_ports(info)?;
    let session = random_hex(16)?;
    let connection_file = write_connection_file(agent, &info, owner)?;
    let seen_path = agent
        .root_path
        .join(connection_file.strip_prefix("/").unwrap_or(&connection_file));
    let argv = request
        .argv
        .iter()
        .map(|arg| arg.replace(CONNECTION_FILE_ARG, &seen_path.to_string_lossy()))
        .collect();
    // A kernel is a long-lived session of its user: it gets `HOME` (and `USER`) when the request
    // does not set them, as a login would (Deno keeps its cache there, matplotlib its config).
    let mut env = request.env.clone();
    env.entry("HOME".to_owned()).or_insert_with(|| user.home.clone());
    env.entry("USER".to_owned()).or_insert_with(|| user.name.clone());
    let spawn = SpawnRequest {
        command: CommandSpec::Argv { argv },
        env,
        cwd: request.cwd.clone(),
        user: request.user.clone(),
        stdin: false,
        pty: None,
        timeout_ms: None,
        tag: Some("kernel".to_owned()),
        detached: true,
    };
    let process = match spawn_process(agent, &spawn) {
        Ok(process) => process,
        Err(err) => {
            let _ = agent.root.remove(&connection_file);
            return Err(err);
        }
    };
    match connect(&process, &info, &session, deadline).await {
        Ok((client, reply)) => {
            let kernel_info = KernelInfo {
                pid: process.pid(),
                language: reply.language_info.name.clone(),
                language_version: reply.language_info.version.clone(),
                implementation: reply.implementation.clone(),
            };
            let kernel = launch(request, process, info, session, connection_file, client);
            tracing::info!(kernel_id = %request.kernel_id, pid = kernel.pid(), "kernel started");
            Ok((kernel, kernel_info))
        }
        Err(err) => {
            kill_tree(process.pid(), libc::SIGKILL, process.exit_status().is_none());
            let _ = agent.root.remove(&connection_file);
            Err(err)
        }
    }
}

/// Connects and shakes hands, failing early (with the kernel's stderr) if the process exits.
async fn connect(
    process: &Process,
    info: &ConnectionInfo,
    session: &str,
    deadline: Instant,
) -> Result<(KernelClient, KernelInfoReply), AgentError> {
    let exited = process.exit_notified();
    let handshake = async {
        let mut client = KernelClient::connect(info, session, deadline).await?;
        let reply = client.handshake(deadline).await?;
        Ok::<_, ClientError>((client, reply))
    };
    let result = if process.exit_status().is_some() {
        None
    } else {
        tokio::select! {
            result = handshake => Some(result),
            () = exited => None,
        }
    };
    match result {
        Some(Ok(done)) => Ok(done),
        Some(Err(ClientError::ReadyTimeout | ClientError::ConnectTimeout { .. })) => Err(agent_error(
            ErrorCode::Io,
            format!(
                "the kernel did not answer kernel_info_request in time{}",
                stderr_note(process)
            ),
        )),
        Some(Err(err)) => Err(agent_error(
            ErrorCode::Io,
            format!("talking to the kernel: {err}{}", stderr_note(process)),
        )),
        None => {
            wait_stderr_closed(process).await;
            let exit = process
                .exit_status()
                .map(|e| super::describe_exit(&e))
                .unwrap_or_default();
            Err(agent_error(
                ErrorCode::ProcessExited,
                format!(
                    "the kernel exited ({exit}) before answering{}",
                    stderr_note(process)
                ),
            ))
        }
    }
}

/// Starts the kernel's cell runner and heartbeat, and builds its record.
fn launch(
    request: &KernelStart,
    process: Rc<Process>,
    info: ConnectionInfo,
    session: String,
    connection_file: PathBuf,
    client: KernelClient,
) -> Rc<Kernel> {
    let (cells, jobs) = mpsc::channel(MAX_QUEUED_CELLS);
    let kernel = Rc::new(Kernel {
        id: request.kernel_id.clone(),
        process,
        info,
        session,
        connection_file,
        cells: RefCell::new(Some(cells)),
        dead: Default::default(),
        died: Notify::new(),
        running_cell: Default::default(),
        interrupted_cell: Default::default(),
        interrupt_requested: Notify::new(),
        interrupt: request.interrupt,
        barrier: request.barrier.clone(),
        heartbeat: Default::default(),
    });
    tokio::task::spawn_local(run_cells(kernel.clone(), client, jobs));
    let heartbeat = tokio::task::spawn_local(watch_heartbeat(Rc::downgrade(&kernel)));
    *kernel.heartbeat.borrow_mut() = Some(heartbeat);
    kernel
}

/// Fills in five ports that were free on 127.0.0.1 a moment ago.
fn with_free_ports(mut info: ConnectionInfo) -> Result<ConnectionInfo, AgentError> {
    let listeners = (0..5)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| agent_error(ErrorCode::Io, format!("finding free ports on 127.0.0.1: {err}")))?;
    let ports = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| agent_error(ErrorCode::Io, format!("finding free ports on 127.0.0.1: {err}")))?;
    [
        info.shell_port,
        info.iopub_port,
        info.stdin_port,
        info.control_port,
        info.hb_port,
    ] = [ports[0], ports[1], ports[2], ports[3], ports[4]];
    Ok(info)
}

/// Writes the connection file (mode 0600, owned by the kernel's user) in the user's private
/// directory; returns its path inside the root.
fn write_connection_file(agent: &Agent, info: &ConnectionInfo, owner: Owner) -> Result<PathBuf, AgentError> {
    let dir = PathBuf::from(format!("/tmp/.paddock-kernels-{}", owner.uid));
    private_dir(agent, &dir, owner)?;
    let path = dir.join(format!("kernel-{}.json", random_hex(8)?));
    let display = path.to_string_lossy().into_owned();
    let json = serde_json::to_vec_pretty(info)
        .map_err(|err| agent_error(ErrorCode::Io, format!("encoding the connection file: {err}")))?;
    let mut file = agent
        .root
        .create_new(&path, 0o600, Some(owner))
        .map_err(|err| fs_error("create", &display, &err))?;
    if let Err(err) = file.write_all(&json) {
        let _ = agent.root.remove(&path);
        return Err(fs_error("write", &display, &err));
    }
    Ok(path)
}

/// Makes sure `dir` is a directory of mode 0700 owned by `owner` (creating it if missing); refuses
/// anything else at that name (a symlink, someone else's directory).
fn private_dir(agent: &Agent, dir: &Path, owner: Owner) -> Result<(), AgentError> {
    let display = dir.to_string_lossy().into_owned();
    match agent.root.mkdir(dir, 0o700, Some(owner)) {
        Ok(()) => return Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(fs_error("mkdir", &display, &err)),
    }
    let stat = agent
        .root
        .lstat(dir)
        .map_err(|err| fs_error("stat", &display, &err))?;
    // jupyter_client sets the sticky bit on the directory of a connection file it writes.
    if stat.kind != EntryKind::Dir || stat.uid != owner.uid || stat.mode & 0o777 != 0o700 {
        return Err(agent_error(
            ErrorCode::PermissionDenied,
            format!(
                "{display} exists but is not a private directory of uid {} ({:?}, uid {}, mode {:o})",
                owner.uid, stat.kind, stat.uid, stat.mode
            ),
        ));
    }
    Ok(())
}

/// `bytes` random bytes from the OS, in hex.
fn random_hex(bytes: usize) -> Result<String, AgentError> {
    let mut buf = vec![0u8; bytes];
    rand::rngs::OsRng
        .try_fill_bytes(&mut buf)
        .map_err(|err| agent_error(ErrorCode::Io, format!("reading the OS random generator: {err}")))?;
    Ok(hex::encode(buf))
}

/// Waits (bounded) until the process's stderr was read to its end.
async fn wait_stderr_closed(process: &Process) {
    let closed = async {
        loop {
            let changed = process.change_notified();
            if process.stderr_stream().is_none_or(|s| s.is_closed()) {
                return;
            }
            changed.await;
        }
    };
    let _ = tokio::time::timeout(STDERR_DRAIN, closed).await;
}

/// `"; stderr: ..."` with the last bytes the kernel wrote to stderr, if any.
fn stderr_note(process: &Process) -> String {
    let tail = process
        .stderr_stream()
        .map(|s| s.tail(STDERR_TAIL))
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&tail);
    let text = text.trim();
    if text.is_empty() {
        String::new()
    } else {
        format!("; stderr: {text}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_keys_random() {
        let info = ConnectionInfo {
            ip: "127.0.0.1".into(),
            transport: Transport::TCP,
            shell_port: 0,
            iopub_port: 0,
            stdin_port: 0,
            control_port: 0,
            hb_port: 0,
            key: String::new(),
            signature_scheme: "hmac-sha256".into(),
            kernel_name: None,
        };
        let info = with_free_ports(info).expect("ports");
        let mut ports = vec![
            info.shell_port,
            info.iopub_port,
            info.stdin_port,
            info.control_port,
            info.hb_port,
        ];
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 5);
        assert!(!ports.contains(&0));
        let (a, b) = (random_hex(32).expect("rng"), random_hex(32).expect("rng"));
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
    }
}
