//! `paddock run`: a fresh sandbox for one command.
//!
//! This module does not serve a sandbox's network: a [`RunNetwork`] handed in by the caller does
//! (`run_network.rs`, the egress proxy), so the `paddock` front, which runs only sandboxes without
//! one, does not link the proxy (see the crate's documentation).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;

use anyhow::Context;
use paddock_protocol::{CommandSpec, ExitStatus, SpawnRequest, Stream};
use paddock_runtime::agent_client::{AgentClient, AgentClientError, ProcessEvent, ProcessEvents};
use paddock_runtime::{RuntimeError, SandboxBackend, SandboxHandle};
use paddock_types::{Limits, RootfsSpec, SandboxId, SandboxSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::RunArgs;
use crate::config::Config;
use crate::tty::TerminalSession;

/// The exit code of a command killed by `--timeout`, as timeout(1) uses.
const EXIT_TIMEOUT: u8 = 124;
/// Default PATH inside the sandbox.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How the command's run ended.
enum Outcome {
    Exited(ExitStatus),
    TimedOut,
    Interrupted(i32),
}

/// A `paddock run` sandbox's network, served in this process for as long as the command runs.
pub trait RunNetwork {
    /// Before creation: the network's part of the spec (its CA, the proxy's ports).
    fn prepare(&mut self, spec: &mut SandboxSpec) -> anyhow::Result<()>;
    /// After creation: serves the sandbox's link; returns what its processes' environment gets.
    fn serve<'a>(
        &'a mut self,
        handle: &'a SandboxHandle,
    ) -> LocalFuture<'a, anyhow::Result<Vec<(String, String)>>>;
    /// After the command, before teardown: stops serving the sandbox.
    fn stop(&mut self, id: &SandboxId);
}

/// A boxed future on this (single) thread.
pub type LocalFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Runs the command; returns paddock's exit code. `network` serves the sandbox's network when the
/// flags ask for one.
pub fn run(config: &Config, args: RunArgs, network: Option<Box<dyn RunNetwork>>) -> anyhow::Result<ExitCode> {
    // One thread: the sandbox's init is a child of this thread, and its parent-death signal fires when
    // the thread that started it exits.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("failed to start the async runtime")?;
    let result = rt.block_on(run_async(config, args, network));
    // A read of this process's stdin may still block on a helper thread (a terminal, an open pipe);
    // dropping the runtime would wait for it forever.
    rt.shutdown_background();
    result
}

/// The sandbox's limits: the flags', within what this host allows (one line naming the flag
/// otherwise); a flag left out gets the built-in default, lowered to the host's maximum.
fn run_limits(args: &RunArgs, host: &paddock_types::HostFacts) -> Result<Limits, crate::UsageError> {
    let max = host.max_limits();
    let defaults = paddock_types::clamp_limits(&Limits::default(), &max);
    let limits = Limits {
        memory: args.memory.or(defaults.memory),
        cpus: args.cpus,
        pids: args.pids.or(defaults.pids),
        disk: args.disk.or(defaults.disk),
    };
    paddock_types::check_limits(&limits, &max, host.millicpus())
        .map_err(|e| crate::UsageError::new(format!("--{} {}", e.field, e.reason)))?;
    Ok(limits)
}

fn sandbox_spec(args: &RunArgs, limits: Limits) -> SandboxSpec {
    let mut bytes = [0u8; 8];
    rand_bytes(&mut bytes);
    SandboxSpec {
        id: SandboxId::from_random(bytes),
        limits,
        rootfs: match &args.rootfs {
            Some(p) => RootfsSpec::Dir { path: p.clone() },
            None => RootfsSpec::Host,
        },
        mounts: args.mounts.clone(),
        workdir: args.workdir.clone(),
        user: args.user.clone(),
        env: args.env.clone(),
        volume: paddock_types::VolumeSource::Template,
        volumes: Vec::new(),
        network: None,
    }
}

fn rand_bytes(out: &mut [u8]) {
    use std::io::Read;
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if f.read_exact(out).is_ok() {
            return;
        }
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
        ^ u128::from(std::process::id());
    for (i, b) in out.iter_mut().enumerate() {
        *b = (seed >> ((i % 16) * 8)) as u8;
    }
}

fn environment(args: &RunArgs, spec: &SandboxSpec, network: &[(String, String)]) -> BTreeMap<String, String> {
    let home = if spec.user.as_str() == "root" {
        "/root"
    } else {
        "/home/user"
    };
    let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into());
    let mut env = BTreeMap::from([
        ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
        ("HOME".to_owned(), home.to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ("TERM".to_owned(), term),
    ]);
    env.extend(network.iter().cloned());
    for var in &args.env {
        env.insert(var.key.clone(), var.value.clone());
    }
    env
}

async fn run_async(
    config: &Config,
    args: RunArgs,
    network: Option<Box<dyn RunNetwork>>,
) -> anyhow::Result<ExitCode> {
    // Checked before anything is made: a refused flag leaves no pool or cgroup behind.
    let host = paddock_runtime::native::host_facts(&config.state_dir, config.pool_size)
        .context("cannot read the host's limits")?;
    let limits = run_limits(&args, &host)?;
    let t = std::time::Instant::now();
    let backend = config.open_backend(true)?;
    tracing::debug!(step = "open backend", us = t.elapsed().as_micros() as u64);
    let t = std::time::Instant::now();
    // The empty parent cgroups stay: this run's creation needs them.
    if let Err(e) = backend.collect_garbage_keeping_parents() {
        tracing::warn!(error = %e, "garbage collection failed");
    }
    tracing::debug!(step = "gc", us = t.elapsed().as_micros() as u64);
    let mut spec = sandbox_spec(&args, limits);
    let mut network = match (args.wants_network(), network) {
        (false, _) => None,
        (true, None) => anyhow::bail!("this paddock binary serves no sandbox networks"),
        (true, Some(mut network)) => {
            network.prepare(&mut spec)?;
            Some(network)
        }
    };
    // Signals arriving during creation must still lead to teardown: install handlers first.
    let mut signals = Signals::new()?;
    // The next run's volume is made while this one starts and runs: its snapshot's commit is off
    // every creation's path (this one takes the spare an earlier run made, or snapshots its own).
    let maker = backend.spare_maker();
    let spare = std::thread::Builder::new()
        .name("spare".into())
        .spawn(move || maker.make())
        .ok();
    let handle = match backend.create_sandbox(&spec) {
        Ok(handle) => handle,
        Err(e) => {
            join_spare(spare);
            return Err(anyhow::Error::new(e).context("failed to create the sandbox"));
        }
    };
    let outcome = match network.as_mut() {
        None => drive(&handle, &args, &spec, &[], &mut signals).await,
        Some(network) => match network.serve(&handle).await {
            Err(e) => Err(e.context("failed to serve the sandbox's network")),
            Ok(env) => {
                let outcome = drive(&handle, &args, &spec, &env, &mut signals).await;
                network.stop(&handle.id);
                outcome
            }
        },
    };
    let teardown = backend.destroy_sandbox(handle);
    join_spare(spare);
    let outcome = outcome?;
    if let Err(e) = teardown {
        eprintln!("paddock: warning: {e}");
    }
    Ok(match outcome {
        Outcome::Exited(status) => ExitCode::from(status.shell_code().clamp(0, 255) as u8),
        Outcome::TimedOut => ExitCode::from(EXIT_TIMEOUT),
        Outcome::Interrupted(sig) => ExitCode::from((128 + sig) as u8),
    })
}

/// Waits for the thread making the next run's spare volume: a spare is never left half-made by
/// this process's exit (gc would clean it up, but a run leaves nothing to clean).
fn join_spare(spare: Option<std::thread::JoinHandle<Result<paddock_runtime::native::Made, RuntimeError>>>) {
    let t = std::time::Instant::now();
    match spare.map(std::thread::JoinHandle::join) {
        Some(Ok(Err(e))) => tracing::warn!(error = %e, "cannot make a spare volume"),
        Some(Err(_)) => tracing::warn!("the spare volume's thread panicked"),
        Some(Ok(Ok(_))) | None => {}
    }
    tracing::debug!(step = "spare wait", us = t.elapsed().as_micros() as u64);
}

struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    winch: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        let s = |k| signal(k).context("failed to install a signal handler");
        Ok(Self {
            int: s(SignalKind::interrupt())?,
            term: s(SignalKind::terminate())?,
            hup: s(SignalKind::hangup())?,
            winch: s(SignalKind::window_change())?,
        })
    }
}

async fn drive(
    handle: &SandboxHandle,
    args: &RunArgs,
    spec: &SandboxSpec,
    network_env: &[(String, String)],
    signals: &mut Signals,
) -> anyhow::Result<Outcome> {
    let terminal = if args.tty {
        Some(TerminalSession::start()?)
    } else {
        None
    };
    let request = SpawnRequest {
        command: CommandSpec::Argv {
            argv: args.command.clone(),
        },
        env: environment(args, spec, network_env),
        cwd: args.workdir.as_ref().map(|p| p.to_string()),
        user: Some(args.user.to_string()),
        stdin: true,
        pty: terminal.as_ref().map(|t| t.size()),
        timeout_ms: None,
        tag: None,
        detached: false,
    };
    // The handshake and the spawn in one round trip.
    let t = std::time::Instant::now();
    let (client, pid, events) = AgentClient::connect_and_spawn(&handle.agent_socket, request)
        .await
        .map_err(|e| match e {
            AgentClientError::Connect { .. } => {
                anyhow::Error::new(e).context("failed to reach the sandbox agent")
            }
            e => anyhow::Error::new(e).context(format!("failed to start {:?}", args.command[0])),
        })?;
    tracing::debug!(step = "connect and spawn", us = t.elapsed().as_micros() as u64);
    let deadline = args.timeout.map(|t| tokio::time::Instant::now() + t);
    let outcome = pump(&client, pid, events, terminal.as_ref(), deadline, signals).await;
    tracing::debug!(step = "spawn to exit", us = t.elapsed().as_micros() as u64);
    drop(terminal);
    outcome
}

async fn pump(
    client: &AgentClient,
    pid: u32,
    mut events: ProcessEvents,
    terminal: Option<&TerminalSession>,
    deadline: Option<tokio::time::Instant>,
    signals: &mut Signals,
) -> anyhow::Result<Outcome> {
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let stdin_pump = forward_stdin(client, pid);
    tokio::pin!(stdin_pump);
    let mut stdin_done = false;
    let timeout = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timeout);
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(ProcessEvent::Output { stream, data, .. }) => {
                    let sink: &mut (dyn tokio::io::AsyncWrite + Unpin + Send) = match stream {
                        Stream::Stderr => &mut stderr,
                        Stream::Stdout | Stream::Pty => &mut stdout,
                    };
                    // A closed stdout (e.g. `| head`) must not stop the sandbox from being torn down.
                    if sink.write_all(&data).await.is_ok() {
                        let _ = sink.flush().await;
                    }
                }
                Some(ProcessEvent::Exited(status)) => return Ok(Outcome::Exited(status)),
                None => anyhow::bail!("the sandbox agent exited unexpectedly"),
            },
            result = &mut stdin_pump, if !stdin_done => {
                stdin_done = true;
                if let Err(e) = result {
                    tracing::debug!(error = %e, "stdin forwarding ended");
                }
            }
            _ = &mut timeout => return Ok(Outcome::TimedOut),
            _ = signals.int.recv() => return Ok(Outcome::Interrupted(libc::SIGINT)),
            _ = signals.term.recv() => return Ok(Outcome::Interrupted(libc::SIGTERM)),
            _ = signals.hup.recv() => return Ok(Outcome::Interrupted(libc::SIGHUP)),
            _ = signals.winch.recv() => {
                if let Some(t) = terminal {
                    let _ = client.resize(pid, t.size()).await;
                }
            }
        }
    }
}

/// Copies this process's stdin to the command's stdin, then closes it.
async fn forward_stdin(client: &AgentClient, pid: u32) -> anyhow::Result<()> {
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = stdin.read(&mut buf).await.context("read stdin")?;
        if n == 0 {
            client.write_stdin(pid, &[], true).await.context("close stdin")?;
            return Ok(());
        }
        client
            .write_stdin(pid, &buf[..n], false)
            .await
            .context("write stdin")?;
    }
}
