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
use crate::run_lean::{Attached, HandOver, HAND_OVER_AFTER};
use crate::tty::TerminalSession;

/// The exit code of a command killed by `--timeout`, as timeout(1) uses.
pub(crate) const EXIT_TIMEOUT: u8 = 124;
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
    // This process is `paddock` again after `paddock-wait`: the run only needs its teardown.
    if let Some(finished) = crate::run_lean::finish(config, &args) {
        return finished;
    }
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

/// The spec of a `--keep-ready` run's sandbox, for its teardown's maker (`None` without the flag, or
/// for a run no sandbox is made ahead for), with an id of its own.
pub(crate) fn ready_spec(config: &Config, args: &RunArgs) -> Option<SandboxSpec> {
    if !args.keep_ready {
        return None;
    }
    let host = paddock_runtime::native::host_facts(&config.state_dir, config.pool_size).ok()?;
    let spec = sandbox_spec(args, run_limits(args, &host).ok()?);
    keeps_ready(args, &spec).then_some(spec)
}

/// Whether a run of `args` and `spec` takes and leaves sandboxes made ahead (`--keep-ready`, and a
/// sandbox that can be made ahead: no network, mounts or `--rootfs`).
fn keeps_ready(args: &RunArgs, spec: &SandboxSpec) -> bool {
    args.keep_ready && !args.wants_network() && paddock_runtime::native::ready_eligible(spec)
}

/// A new random sandbox id.
fn new_id() -> SandboxId {
    let mut bytes = [0u8; 8];
    rand_bytes(&mut bytes);
    SandboxId::from_random(bytes)
}

fn sandbox_spec(args: &RunArgs, limits: Limits) -> SandboxSpec {
    SandboxSpec {
        id: new_id(),
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
    let keep_ready = keeps_ready(&args, &spec);
    let t = std::time::Instant::now();
    let claimed = if keep_ready {
        backend.claim_ready(&spec)
    } else {
        None
    };
    if keep_ready {
        tracing::debug!(
            step = "claim ready",
            claimed = claimed.is_some(),
            us = t.elapsed().as_micros() as u64
        );
    }
    let (handle, mut spare) = match claimed {
        Some(handle) => (handle, None),
        None => {
            // The next run's volume is made while this one starts and runs: its snapshot's commit is
            // off every creation's path (this one takes the spare an earlier run made, or snapshots
            // its own).
            let maker = backend.spare_maker();
            let spare = std::thread::Builder::new()
                .name("spare".into())
                .spawn(move || maker.make())
                .ok();
            match backend.create_sandbox(&spec) {
                Ok(handle) => (handle, spare),
                Err(e) => {
                    join_spare(spare);
                    return Err(anyhow::Error::new(e).context("failed to create the sandbox"));
                }
            }
        }
    };
    let outcome = match network.as_mut() {
        None => {
            // Only a run without a network or a terminal may become `paddock-wait` (run_lean.rs).
            let lean = (!args.tty).then_some(Lean {
                backend: &backend,
                spare: &mut spare,
            });
            drive(&handle, &args, &spec, &[], &mut signals, lean).await
        }
        Some(network) => match network.serve(&handle).await {
            Err(e) => Err(e.context("failed to serve the sandbox's network")),
            Ok(env) => {
                let outcome = drive(&handle, &args, &spec, &env, &mut signals, None).await;
                network.stop(&handle.id);
                outcome
            }
        },
    };
    // The next run's sandbox, made by the maker the teardown starts, gets an id of its own.
    let ready = keep_ready.then(|| SandboxSpec {
        id: new_id(),
        ..spec.clone()
    });
    let teardown = crate::run_ready::tear_down(config, &backend, handle, ready.as_ref());
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

/// The thread making the next run's spare volume.
type SpareThread = std::thread::JoinHandle<Result<paddock_runtime::native::Made, RuntimeError>>;

/// Waits for the thread making the next run's spare volume: a spare is never left half-made by
/// this process's exit or exec (gc would clean it up, but a run leaves nothing to clean).
fn join_spare(spare: Option<SpareThread>) {
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
    /// The ending signal that has arrived and was not yet taken, without waiting.
    fn pending(&mut self) -> Option<i32> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        for (stream, sig) in [
            (&mut self.int, libc::SIGINT),
            (&mut self.term, libc::SIGTERM),
            (&mut self.hup, libc::SIGHUP),
        ] {
            if stream.poll_recv(&mut cx).is_ready() {
                return Some(sig);
            }
        }
        None
    }

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

/// What a run that may hand over to `paddock-wait` lends the pump.
struct Lean<'a> {
    backend: &'a paddock_runtime::native::NativeBackend,
    /// Joined before the exec.
    spare: &'a mut Option<SpareThread>,
}

async fn drive(
    handle: &SandboxHandle,
    args: &RunArgs,
    spec: &SandboxSpec,
    network_env: &[(String, String)],
    signals: &mut Signals,
    lean: Option<Lean<'_>>,
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
    let lean = lean.map(|lean| (lean, handle));
    let outcome = pump(&client, pid, events, terminal.as_ref(), deadline, signals, lean).await;
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
    mut lean: Option<(Lean<'_>, &SandboxHandle)>,
) -> anyhow::Result<Outcome> {
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    // True while nothing read from stdin is on its way to the command: a hand-over is safe then.
    let stdin_idle = std::cell::Cell::new(false);
    let stdin_pump = forward_stdin(client, pid, &stdin_idle);
    tokio::pin!(stdin_pump);
    let mut stdin_done = false;
    let timeout = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timeout);
    // Where the output written so far ends, per stream (stdout and PTY, stderr).
    let mut written = [0u64; 2];
    let hand_over_at = tokio::time::sleep(HAND_OVER_AFTER);
    tokio::pin!(hand_over_at);
    // The second connection of a hand-over under way, until the front has caught up with it.
    let mut attached: Option<Attached> = None;
    loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(ProcessEvent::Output { stream, data, offset }) => {
                    let sink: &mut (dyn tokio::io::AsyncWrite + Unpin + Send) = match stream {
                        Stream::Stderr => &mut stderr,
                        Stream::Stdout | Stream::Pty => &mut stdout,
                    };
                    // A closed stdout (e.g. `| head`) must not stop the sandbox from being torn down.
                    if sink.write_all(&data).await.is_ok() {
                        let _ = sink.flush().await;
                    }
                    let i = usize::from(stream == Stream::Stderr);
                    written[i] = written[i].max(offset.saturating_add(data.len() as u64));
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
            _ = &mut hand_over_at, if lean.is_some() && attached.is_none() => {
                if !(stdin_done || stdin_idle.get()) {
                    // Stdin is being copied (or is a terminal or a file still open): later.
                    hand_over_at.as_mut().reset(tokio::time::Instant::now() + HAND_OVER_AFTER);
                    continue;
                }
                let (l, handle) = lean.as_mut().expect("guarded");
                join_spare(l.spare.take());
                match crate::run_lean::attach(&handle.agent_socket, pid, written) {
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot attach a second connection; the run keeps this process");
                        lean = None;
                    }
                    Ok(a) => attached = Some(a),
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
        // A hand-over under way goes ahead once this side has written up to where the second
        // connection's replay starts (at once, usually), unless stdin is on its way by then.
        if let (Some(a), Some((l, handle))) = (&attached, &lean) {
            if !caught_up(written, a) {
                continue;
            }
            if !(stdin_done || stdin_idle.get()) {
                attached = None;
                hand_over_at
                    .as_mut()
                    .reset(tokio::time::Instant::now() + HAND_OVER_AFTER);
                continue;
            }
            let stdin_open = !stdin_done;
            let over = HandOver {
                backend: l.backend,
                handle,
                pid,
                deadline,
                stdin_open,
            };
            if let Some(outcome) = hand_over(&over, a, written, signals).await {
                return Ok(outcome);
            }
            attached = None;
            lean = None;
        }
    }
}

fn caught_up(written: [u64; 2], attached: &Attached) -> bool {
    written[0] >= attached.start[0] && written[1] >= attached.start[1]
}

/// Hands the run over to `paddock-wait` (run_lean.rs): returns only if that did not happen, with the
/// run's outcome when an ending signal had arrived first, or `None` (the run goes on here, and never
/// tries again).
async fn hand_over(
    over: &HandOver<'_>,
    attached: &Attached,
    written: [u64; 2],
    signals: &mut Signals,
) -> Option<Outcome> {
    if let Err(e) = crate::run_lean::block_ending_signals() {
        tracing::debug!(error = %e, "the run keeps this process");
        return None;
    }
    // A signal caught before the block may not have reached its stream yet: the runtime reads its
    // handler's pipe when it polls for events, which a yield lets it do before this task goes on.
    tokio::task::yield_now().await;
    if let Some(sig) = signals.pending() {
        crate::run_lean::unblock_ending_signals();
        return Some(Outcome::Interrupted(sig));
    }
    let e = crate::run_lean::exec_waiter(over, attached, written);
    crate::run_lean::unblock_ending_signals();
    tracing::warn!(error = %e, "cannot hand the run over to paddock-wait; it keeps this process");
    None
}

/// Copies this process's stdin to the command's stdin, then closes it. A pipe or a socket is read
/// between waits (`stdin.rs`), and `idle` is true while nothing read is on its way; anything else (a
/// terminal, a file, a device) is read on the runtime's helper thread and never idle.
async fn forward_stdin(client: &AgentClient, pid: u32, idle: &std::cell::Cell<bool>) -> anyhow::Result<()> {
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    if crate::stdin::pollable(stdin.as_fd()) {
        let fd = stdin.as_fd().try_clone_to_owned().context("duplicate stdin")?;
        let fd = watch_stdin(fd).context("watch stdin")?;
        return forward_pollable(client, pid, &fd, idle).await;
    }
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

/// Registers this process's (duplicated) stdin with the runtime's reactor.
#[expect(
    deprecated,
    reason = "AsyncFd::with_interest is deprecated for descriptors whose owner could swap or close them \
              under the reactor (tokio#8587); the OwnedFd moved in stays open and unchanged until the \
              AsyncFd is dropped (get_mut is never used), which is what the unsafe replacement would \
              require, and unsafe belongs in paddock-sys only"
)]
fn watch_stdin(fd: std::os::fd::OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    tokio::io::unix::AsyncFd::with_interest(fd, tokio::io::Interest::READABLE)
}

/// [`forward_stdin`] for a pipe or a socket: waits, reads what is there, delivers it (the agent
/// answers once the bytes are in the command's pipe), and only then waits again.
async fn forward_pollable(
    client: &AgentClient,
    pid: u32,
    fd: &tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>,
    idle: &std::cell::Cell<bool>,
) -> anyhow::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        idle.set(true);
        let mut ready = fd.readable().await.context("wait for stdin")?;
        let n = match ready.try_io(|fd| crate::stdin::read_available(fd, &mut buf)) {
            Err(_would_block) => continue,
            Ok(read) => read,
        };
        // No await between the read and this: nothing read is ever unaccounted for.
        idle.set(false);
        match n.context("read stdin")? {
            0 => {
                client.write_stdin(pid, &[], true).await.context("close stdin")?;
                return Ok(());
            }
            n => client
                .write_stdin(pid, &buf[..n], false)
                .await
                .context("write stdin")?,
        }
    }
}
