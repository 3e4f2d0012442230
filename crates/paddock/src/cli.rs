//! Command-line syntax.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use paddock_types::{ByteSize, CpuQuota, EnvVar, MountSpec, SandboxPath, UserSpec};

mod client;
mod executions;
mod network;
mod server;

pub use client::{
    ApprovalCommand, ApprovalsLsArgs, AuditArgs, AuditCommand, CodeArgs, CpArgs, CreateArgs, ExecArgs,
    LogsArgs, LsArgs, NetworkCmdArgs, PolicyCommand, PortForwardArgs, SandboxCommand, SecretCommand,
    ShellArgs, SnapshotCommand, StartArgs, TemplateCommand, VolumeCommand,
};
pub use executions::{ExecutionCommand, ProposeArgs};
pub use network::NetworkArgs;
pub use server::{parse_human_duration, ConfigCommand, K8sCommand, KeysCommand, ServeArgs};

/// paddock: a self-hosted execution sandbox for AI agents.
#[derive(Debug, Parser)]
#[command(name = "paddock", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    /// Log filter for paddock's own diagnostics on stderr (e.g. `info`, `paddock=debug`).
    #[arg(long, global = true, env = "PADDOCK_LOG")]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes. Those without a value here take the server configuration file's (for
/// `serve`, `config show`, `keys` and `audit verify`), then the built-in defaults.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// State directory (storage pool, run state, the server's database) [default: /var/lib/paddock].
    #[arg(long, global = true, env = "PADDOCK_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// The in-sandbox agent binary (default: `paddock-agent` next to this binary).
    #[arg(long, global = true, env = "PADDOCK_AGENT")]
    pub agent: Option<PathBuf>,
    /// Parent cgroup (in every hierarchy) that sandboxes are created under [default: paddock].
    #[arg(long, global = true, env = "PADDOCK_CGROUP_PARENT")]
    pub cgroup_parent: Option<String>,
    /// Size of the storage pool image, when the state directory is not on btrfs [default: 64G].
    #[arg(long, global = true, env = "PADDOCK_POOL_SIZE")]
    pub pool_size: Option<ByteSize>,
    /// The server's configuration file (TOML), read by `serve`, `config show`, `keys`, `audit verify`
    /// and, for the admin key, the client commands; `paddock run` does not read it.
    #[arg(long, global = true, env = "PADDOCK_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The `paddock` front's command line (see the crate's documentation): the commands it runs itself,
/// defined once, in [`LocalCommand`], for both. Whatever it does not parse (another command, help,
/// the version, an error) goes to `paddock-full`, which parses [`Cli`] and answers; building only
/// these three commands' parser keeps the front's start short.
#[derive(Debug, Parser)]
#[command(name = "paddock", version)]
pub struct FrontCli {
    #[command(flatten)]
    pub global: GlobalArgs,
    /// As in [`Cli`].
    #[arg(long, global = true, env = "PADDOCK_LOG")]
    pub log: Option<String>,
    #[command(subcommand)]
    pub command: LocalCommand,
}

/// The commands that act on this host's sandboxes without a server.
#[derive(Debug, Subcommand)]
#[expect(clippy::large_enum_variant, reason = "one value per process, parsed once")]
pub enum LocalCommand {
    /// Run a command in a fresh sandbox, stream its output, exit with its exit code, remove the sandbox.
    Run(RunArgs),
    /// Reclaim sandboxes, cgroups and subvolumes left behind by crashed runs.
    Gc,
    /// Manage the storage pool.
    Pool {
        #[command(subcommand)]
        command: PoolCommand,
    },
    /// Makes one sandbox ahead for `paddock run --keep-ready` (started by a run, detached).
    #[command(hide = true)]
    MakeReady {
        /// The maker lock, inherited from the run that started this.
        #[arg(long)]
        lock_fd: i32,
        /// The sandbox the run left to tear down: `<id>:<descriptors kept across the spawn>`.
        #[arg(long)]
        take: String,
        /// The spec of the sandbox to make (JSON): the run's, with an id of its own.
        spec: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum Command {
    #[command(flatten)]
    Local(LocalCommand),
    /// Run the control plane: the HTTP API on --listen (root; one server per state directory).
    Serve(ServeArgs),
    /// Serve MCP (Model Context Protocol) on stdin/stdout, for an agent that starts paddock as its
    /// tool server: relayed to a server's /mcp (PADDOCK_URL, PADDOCK_API_KEY), or with --local an
    /// embedded service on this host (root).
    Mcp(McpArgs),
    /// Kubernetes: the manifests the kubernetes-job executor of approved executions needs.
    K8s {
        #[command(subcommand)]
        command: K8sCommand,
    },
    /// Inspect the server configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Manage API keys, on the server host, directly in the server's database.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Sandboxes of a paddock server (PADDOCK_URL, PADDOCK_API_KEY).
    Sandbox {
        #[command(subcommand)]
        command: SandboxCommand,
    },
    /// Snapshots of sandboxes' files (take one with `paddock sandbox snapshot ID`).
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// Templates sandboxes start from: build one from a registry image.
    Template {
        #[command(subcommand)]
        command: TemplateCommand,
    },
    /// Named volumes: storage that outlives sandboxes (mount with `paddock sandbox create --volume`).
    Volume {
        #[command(subcommand)]
        command: VolumeCommand,
    },
    /// Secrets the egress proxy injects into requests to their hosts (`--secret` on create).
    Secret {
        #[command(subcommand)]
        command: SecretCommand,
    },
    /// The approvals queue: requests an approval policy holds for a person, to list, watch,
    /// approve or reject.
    Approvals {
        #[command(subcommand)]
        command: ApprovalCommand,
    },
    /// Approved executions: commands proposed for a person to approve, run once on the server's
    /// executor after the approval.
    #[command(alias = "executions")]
    Execution {
        #[command(subcommand)]
        command: ExecutionCommand,
    },
    /// Approval policies: which exec and file changes run, wait for a person, or are refused.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Read (through the API) or verify (on the server host) the audit log.
    Audit(AuditArgs),
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Unmount and delete the storage pool (after reclaiming abandoned sandboxes).
    Destroy,
}

/// `paddock mcp` options.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// Run the sandbox service here instead of relaying to a server: one user, this host's state
    /// directory (no `paddock serve` may be running on it); needs root.
    #[arg(long)]
    pub local: bool,
    /// With --local: leave the sandboxes running when the client disconnects (they end at their
    /// timeout, counted again from the next start); by default they are removed.
    #[arg(long, requires = "local")]
    pub keep_sandboxes: bool,
}

impl Command {
    /// Whether the command works through a server (its API, or its database on this host): its
    /// failed requests exit 1 rather than 125.
    pub fn is_client(&self) -> bool {
        matches!(
            self,
            Command::Sandbox { .. }
                | Command::Snapshot { .. }
                | Command::Volume { .. }
                | Command::Template { .. }
                | Command::Secret { .. }
                | Command::Approvals { .. }
                | Command::Execution { .. }
                | Command::Policy { .. }
                | Command::Audit(_)
                | Command::Keys { .. }
        )
    }
}

/// `paddock run` options.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Memory limit (e.g. 512M); the kernel OOM-kills inside the sandbox past it [default: 1G, at most
    /// 3/4 of the host's memory].
    #[arg(long)]
    pub memory: Option<ByteSize>,
    /// CPU quota in CPUs (e.g. 1.5), at most the host's CPUs [default: none; every sandbox gets the
    /// same CPU weight per CPU of quota, so it cannot starve the others].
    #[arg(long)]
    pub cpus: Option<CpuQuota>,
    /// Maximum number of processes and threads [default: 1024, at most a quarter of the host's pid
    /// budget].
    #[arg(long)]
    pub pids: Option<u32>,
    /// Disk limit for everything the sandbox writes (e.g. 1G) [default: 10G, at most the pool's size].
    #[arg(long)]
    pub disk: Option<ByteSize>,
    /// Kill the command (and everything in the sandbox) after this long and exit 124 (e.g. 10s, 500ms, 2m).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Set an environment variable (repeatable); the environment is otherwise PATH, HOME, LANG, TERM.
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<EnvVar>,
    /// Working directory inside the sandbox (default: the user's home).
    #[arg(long, short = 'w')]
    pub workdir: Option<SandboxPath>,
    /// Mount a host path into the sandbox (repeatable): HOST:SANDBOX[:ro].
    #[arg(long = "mount", short = 'v', value_name = "HOST:SANDBOX[:ro]")]
    pub mounts: Vec<MountSpec>,
    /// Use this root file system directory (e.g. made by debootstrap) instead of the host's system directories.
    #[arg(long)]
    pub rootfs: Option<PathBuf>,
    /// User inside the sandbox (`user`, uid 1000, by default; `root` is still unprivileged on the host).
    #[arg(long, short = 'u', default_value = "user")]
    pub user: UserSpec,
    /// Run the command on a pseudo-terminal connected to this terminal.
    #[arg(long, short = 't')]
    pub tty: bool,
    /// Keep a sandbox made ahead for the next run with the same limits and user: this run takes one
    /// if there is one, and a process it starts as it ends makes the next. Only for runs
    /// without --mount, --rootfs or a network. The sandbox waits, idle (about 1 MiB), until a run
    /// takes it; `paddock pool destroy` removes it.
    #[arg(long, env = "PADDOCK_KEEP_READY")]
    pub keep_ready: bool,
    #[command(flatten)]
    pub net: NetworkArgs,
    /// Inject a secret: `NAME:HOST[,HOST...][:HEADER[,HEADER...]]`. Its value is taken from
    /// paddock's own environment variable NAME and sent only in requests to those hosts, in those
    /// header fields (`Authorization` when none are given; `?query` also allows query strings);
    /// inside the sandbox, NAME holds the placeholder `paddock-secret:NAME` (repeatable; implies a
    /// network).
    #[arg(long = "secret", value_name = "NAME:HOSTS[:HEADERS]")]
    pub secrets: Vec<String>,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl RunArgs {
    /// Whether the sandbox gets a network (a network flag or a secret).
    pub fn wants_network(&self) -> bool {
        self.net.any() || !self.secrets.is_empty()
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h` or a plain number of seconds (fractions allowed).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("invalid duration {s:?}: use e.g. 10s, 500ms, 2m or 1.5");
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| err())?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(err()),
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 1e9 {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["", "0", "-1s", "1x", "s", "nan"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        FrontCli::command().debug_assert();
    }

    /// The front parses its commands exactly as `paddock-full` does: the same arguments, global ones
    /// included, and nothing else.
    #[test]
    fn the_front_parses_its_commands_as_the_whole_cli_does() {
        use clap::CommandFactory;
        let (front, full) = (FrontCli::command(), Cli::command());
        let args = |c: &clap::Command| {
            c.get_arguments()
                .map(|a| format!("{:?} {:?} {:?}", a.get_id(), a.get_long(), a.get_short()))
                .collect::<Vec<_>>()
        };
        assert_eq!(args(&front), args(&full));
        let names: Vec<_> = front.get_subcommands().map(|c| c.get_name()).collect();
        assert_eq!(names, ["run", "gc", "pool", "make-ready"]);
        for name in names {
            let (a, b) = (front.find_subcommand(name), full.find_subcommand(name));
            let (a, b) = (
                a.expect("front"),
                b.unwrap_or_else(|| panic!("{name} missing from Cli")),
            );
            assert_eq!(args(a), args(b), "{name}");
        }
        for argv in [
            &[
                "paddock",
                "--state-dir",
                "/s",
                "run",
                "-e",
                "A=1",
                "--memory",
                "1G",
                "--",
                "true",
            ][..],
            &["paddock", "pool", "destroy", "--log", "debug"],
        ] {
            let a = FrontCli::try_parse_from(argv).expect("front parses");
            let b = Cli::try_parse_from(argv).expect("full parses");
            assert_eq!(
                format!("{:?} {:?}", a.global, a.log),
                format!("{:?} {:?}", b.global, b.log)
            );
            match b.command {
                Command::Local(c) => assert_eq!(format!("{:?}", a.command), format!("{c:?}")),
                other => panic!("{other:?}"),
            }
        }
        for other in [
            &["paddock", "sandbox", "ls"][..],
            &["paddock", "--help"],
            &["paddock", "run"],
        ] {
            assert!(FrontCli::try_parse_from(other).is_err(), "{other:?}");
        }
    }
}
