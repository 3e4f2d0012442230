//! `paddock run`: a fresh sandbox for one command.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context;
use paddock_protocol::{CommandSpec, ExitStatus, SpawnRequest, Stream};
use paddock_runtime::agent_client::{AgentClient, ProcessEvent, ProcessEvents};
use paddock_runtime::{SandboxBackend, SandboxHandle};
use paddock_types::{Limits, RootfsSpec, SandboxId, SandboxSpec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::RunArgs;
use crate::config::Config;
use crate::tty::TerminalSession;
use paddock_control::NetworkConfig;

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

/// Runs the command; returns paddock's exit code.
pub fn run(config: &Config, args: RunArgs, network: Option<NetworkConfig>) -> anyhow::Result<ExitCode> {
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

/// The sandbox's network: the egress proxy serving it in this process, and what its processes'
/// environment gets.
struct Network {
    egress: paddock_egress::Egress,
    env: Vec<(String, String)>,
}

/// `--secret NAME:HOST[,HOST...][:FIELD[,FIELD...]]`: the value from this process's environment
/// variable NAME, bound to those hosts and header fields (`Authorization` when none are given);
/// `?query` among the fields also binds it to query strings.
fn parse_secret(
    arg: &str,
    value_of: impl Fn(&str) -> Option<String>,
) -> anyhow::Result<paddock_egress::Secret> {
    let usage = || anyhow::anyhow!("--secret {arg:?}: use NAME:HOST[,HOST...][:HEADER[,HEADER...]]");
    let mut parts = arg.splitn(3, ':');
    let (Some(name), Some(hosts)) = (parts.next(), parts.next()) else {
        return Err(usage());
    };
    let name: paddock_egress::SecretName = name.parse()?;
    let hosts = hosts
        .split(',')
        .map(|h| h.parse::<paddock_types::DomainPattern>())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--secret {arg:?}"))?;
    let (headers, query) = match parts.next() {
        None => (None, false),
        Some(fields) => {
            let mut query = false;
            let mut headers = Vec::new();
            for f in fields.split(',') {
                if f == "?query" {
                    query = true;
                } else {
                    headers.push(
                        f.parse::<paddock_egress::BoundHeader>()
                            .with_context(|| format!("--secret {arg:?}"))?,
                    );
                }
            }
            (Some(headers), query)
        }
    };
    let binding = paddock_egress::SecretBinding::new(hosts, headers, query)
        .with_context(|| format!("--secret {arg:?}"))?;
    let value = value_of(name.as_str()).ok_or_else(|| {
        anyhow::anyhow!(
            "--secret {name}: paddock's environment has no variable {name} to take the value from"
        )
    })?;
    Ok(paddock_egress::Secret::new(
        name,
        zeroize::Zeroizing::new(value),
        binding,
    )?)
}

/// Serves a created sandbox's link on an egress proxy in this process.
async fn serve_network(
    config: NetworkConfig,
    handle: &SandboxHandle,
    policy: paddock_types::NetworkPolicy,
    secrets: Vec<paddock_egress::Secret>,
    ca: &paddock_egress::SandboxCaKey,
) -> anyhow::Result<Network> {
    let link = handle
        .network
        .context("the backend made no network link for the sandbox")?;
    let egress = paddock_egress::Egress::new(config.egress, std::sync::Arc::new(LogAudit))?;
    let listen = paddock_egress::SandboxListen::on_link(&link, &config.ports);
    let mut env = link.env(&config.ports);
    env.extend(secrets.iter().map(|s| s.name().env_var()));
    egress
        .add_sandbox_at(handle.id.clone(), policy, listen, ca)
        .await?;
    egress.set_secrets(&handle.id, secrets)?;
    Ok(Network { egress, env })
}

/// `paddock run` keeps no audit log: the proxy's records go to the log (refusals as warnings, so a
/// user sees why a connection failed).
#[derive(Debug)]
struct LogAudit;

impl paddock_egress::AuditSink for LogAudit {
    fn record(&self, record: paddock_egress::AuditRecord) {
        use paddock_egress::AuditRecord;
        match &record {
            AuditRecord::Connection(c) if !c.allowed => {
                let name = c.name.as_ref().map(|n| n.to_string()).unwrap_or_default();
                let ip = c.ip.map(|i| i.to_string()).unwrap_or_default();
                tracing::warn!(target: "paddock::egress", name, ip, port = c.port, rule = ?c.rule, "connection refused");
            }
            AuditRecord::Dns(d) if !d.allowed => {
                tracing::warn!(target: "paddock::egress", name = d.name, rule = ?d.rule, "DNS question refused");
            }
            AuditRecord::Refused(r) => {
                tracing::warn!(target: "paddock::egress", limit = r.limit.as_str(), count = r.count, "refused at a cap");
            }
            _ => tracing::info!(target: "paddock::egress", record = ?record, "egress"),
        }
    }
}

async fn run_async(
    config: &Config,
    args: RunArgs,
    network: Option<NetworkConfig>,
) -> anyhow::Result<ExitCode> {
    // Checked before anything is made: a refused flag leaves no pool or cgroup behind.
    let host = paddock_runtime::native::host_facts(&config.state_dir, config.pool_size)
        .context("cannot read the host's limits")?;
    let limits = run_limits(&args, &host)?;
    let t = std::time::Instant::now();
    let backend = config.open_backend(true)?;
    tracing::debug!(step = "open backend", us = t.elapsed().as_micros() as u64);
    let t = std::time::Instant::now();
    if let Err(e) = backend.collect_garbage_now() {
        tracing::warn!(error = %e, "garbage collection failed");
    }
    tracing::debug!(step = "gc", us = t.elapsed().as_micros() as u64);
    let mut spec = sandbox_spec(&args, limits);
    let secrets = args
        .secrets
        .iter()
        .map(|s| parse_secret(s, |name| std::env::var(name).ok()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let policy = args.net.policy()?.unwrap_or_default();
    // The network's configuration and its CA, when the sandbox has one.
    let network = match (args.wants_network(), network) {
        (false, _) => None,
        (true, None) => {
            anyhow::bail!("sandbox networks are disabled by the configuration ([egress] enabled = false)")
        }
        (true, Some(config)) => {
            let ca = paddock_egress::SandboxCaKey::generate(&spec.id)?;
            spec.network = Some(paddock_types::NetworkSpec {
                ports: config.ports,
                ca_pem: ca.cert_pem().to_owned(),
                conntrack: config.conntrack,
            });
            Some((config, ca))
        }
    };
    // Signals arriving during creation must still lead to teardown: install handlers first.
    let mut signals = Signals::new()?;
    let handle = backend
        .create_sandbox(&spec)
        .context("failed to create the sandbox")?;
    let served = match network {
        Some((config, ca)) => Some(serve_network(config, &handle, policy, secrets, &ca).await),
        None => None,
    };
    let outcome = match served {
        Some(Err(e)) => Err(e.context("failed to serve the sandbox's network")),
        Some(Ok(net)) => {
            let outcome = drive(&handle, &args, &spec, &net.env, &mut signals).await;
            let _ = net.egress.remove_sandbox(&handle.id);
            outcome
        }
        None => drive(&handle, &args, &spec, &[], &mut signals).await,
    };
    let teardown = backend.destroy_sandbox(handle);
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
    let t = std::time::Instant::now();
    let client = AgentClient::connect(&handle.agent_socket)
        .await
        .context("failed to reach the sandbox agent")?;
    tracing::debug!(step = "connect agent", us = t.elapsed().as_micros() as u64);
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
    let t = std::time::Instant::now();
    let (pid, events) = client
        .spawn(request)
        .await
        .with_context(|| format!("failed to start {:?}", args.command[0]))?;
    tracing::debug!(step = "spawn", us = t.elapsed().as_micros() as u64);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(arg: &str) -> anyhow::Result<paddock_egress::Secret> {
        parse_secret(arg, |name| (name == "GH").then(|| "ghp_x".to_owned()))
    }

    #[test]
    fn secrets_name_hosts_and_optionally_fields() {
        let s = parse("GH:api.test").expect("default");
        assert_eq!(
            s.binding().headers(),
            &[paddock_egress::BoundHeader::authorization()]
        );
        let s = parse("GH:api.test,*.api.test:X-Api-Key,Cookie,?query").expect("fields");
        let fields: Vec<&str> = s.binding().headers().iter().map(|h| h.as_str()).collect();
        assert_eq!(fields, ["cookie", "x-api-key"]);
        assert!(s.binding().query() && s.binding().hosts().len() == 2);
        for bad in [
            "GH",
            "GH:",
            "GH:api.test:Host",
            "GH:api.test:a b",
            "NOPE:api.test",
            "G-H:api.test",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
