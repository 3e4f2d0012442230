//! Syntax of the HTTP client commands: `paddock sandbox ...`, `paddock snapshot ...`, `paddock volume
//! ...`, `paddock approvals ...`, `paddock policy ...` and `paddock audit ...`.

use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};
use paddock_types::api::VolumeMountRequest;
use paddock_types::{ByteSize, CpuQuota, EnvVar};

use super::server::parse_human_duration;

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox; prints its id.
    Create(CreateArgs),
    /// List sandboxes (running ones by default).
    #[command(alias = "list")]
    Ls(LsArgs),
    /// Show one sandbox.
    Get {
        /// Sandbox id.
        id: String,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Kill sandboxes and remove everything of them.
    #[command(alias = "kill")]
    Rm {
        /// Sandbox ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Make a sandbox expire DURATION from now.
    Timeout {
        /// Sandbox id.
        id: String,
        /// e.g. 10m, 2h.
        #[arg(value_parser = parse_human_duration)]
        duration: Duration,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command in a sandbox; exits with its exit code (128+N for signal N, 124 on --timeout).
    Exec(ExecArgs),
    /// Run a cell of code in a sandbox's code context (a kernel that keeps state between cells):
    /// prints its output and text results; exits 1 if it raised, 124 if it timed out.
    Code(CodeArgs),
    /// An interactive shell in a sandbox, on this terminal.
    Shell(ShellArgs),
    /// Copy a file or directory into or out of a sandbox: `cp SRC ID:/path` or `cp ID:/path DST`.
    Cp(CpArgs),
    /// Print a process's output (kept by the sandbox), optionally following it.
    Logs(LogsArgs),
    /// Take a snapshot of a sandbox's files (not its memory); prints the snapshot id.
    Snapshot {
        /// Sandbox id.
        id: String,
        /// A name for it.
        #[arg(long)]
        name: Option<String>,
        /// Label (repeatable).
        #[arg(long = "label", short = 'l', value_name = "K=V", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fork a sandbox into COUNT copies of its files; prints their ids.
    Fork {
        /// Sandbox id.
        id: String,
        /// How many copies (1-100).
        #[arg(long, short = 'n', default_value_t = 1)]
        count: u32,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Take a checkpoint before a step (undo it with `rollback`, keep it with `commit`).
    Checkpoint {
        /// Sandbox id.
        id: String,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Return a sandbox's files to its newest checkpoint (or `--to SNAPSHOT`); its processes restart.
    Rollback {
        /// Sandbox id.
        id: String,
        /// A snapshot of this sandbox (default: the newest checkpoint, which is consumed).
        #[arg(long = "to")]
        snapshot: Option<String>,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drop the newest checkpoint, keeping the step.
    Commit {
        /// Sandbox id.
        id: String,
    },
    /// Freeze every process of a sandbox (no CPU used, memory kept).
    Pause {
        /// Sandbox id.
        id: String,
    },
    /// Stop a sandbox: its processes end, its files are kept until it is resumed or removed.
    Stop {
        /// Sandbox id.
        id: String,
    },
    /// Show a sandbox's network policy, secrets and recent connections; with `--set`, replace its
    /// policy (and, when `--secret` is given, its secrets) by the flags'.
    Network(NetworkCmdArgs),
    /// Thaw a paused sandbox, or start a stopped one again on its files.
    Resume {
        /// Sandbox id.
        id: String,
    },
    /// Forward a local TCP port to a port of a sandbox: every connection to
    /// `<address>:<local port>` is carried to what listens on the sandbox's port, until Ctrl-C.
    PortForward(PortForwardArgs),
}

/// `paddock sandbox code`.
#[derive(Debug, Args)]
pub struct CodeArgs {
    /// Sandbox id.
    pub id: String,
    /// The code (`-` or absent: read it from stdin, or from `--file`).
    pub code: Option<String>,
    /// Read the code from this file.
    #[arg(long, short = 'f', conflicts_with = "code")]
    pub file: Option<std::path::PathBuf>,
    /// The language's default context (python, javascript, bash).
    #[arg(long, short = 'l', conflicts_with = "context")]
    pub language: Option<String>,
    /// An environment variable of this cell only, restored after it (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<EnvVar>,
    /// A context made with the API (`POST /v1/sandboxes/{id}/contexts`).
    #[arg(long, short = 'c')]
    pub context: Option<String>,
    /// Interrupt the cell after this long (e.g. 30s).
    #[arg(long, value_parser = parse_human_duration)]
    pub timeout: Option<Duration>,
    /// Save images (PNG, JPEG, SVG) the cell displays into this directory, as `result-N.EXT`.
    #[arg(long, value_name = "DIR")]
    pub save_images: Option<std::path::PathBuf>,
    /// Print the API's collected JSON instead.
    #[arg(long)]
    pub json: bool,
}

/// `paddock sandbox port-forward`.
#[derive(Debug, Args)]
pub struct PortForwardArgs {
    /// Sandbox id.
    pub id: String,
    /// `LOCAL:SANDBOX` ports, or one port for both (`0` as the local port: any free one, printed).
    #[arg(value_name = "LOCAL:SANDBOX", value_parser = parse_port_pair)]
    pub ports: (u16, u16),
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: std::net::IpAddr,
}

/// `LOCAL:SANDBOX` or `PORT`.
pub fn parse_port_pair(text: &str) -> Result<(u16, u16), String> {
    let port = |s: &str, zero: bool| -> Result<u16, String> {
        match s.parse::<u16>() {
            Ok(0) if !zero => Err(format!("{s:?}: the sandbox port cannot be 0")),
            Ok(p) => Ok(p),
            Err(_) => Err(format!("{s:?} is not a port (expected LOCAL:SANDBOX or PORT)")),
        }
    };
    match text.split_once(':') {
        Some((local, remote)) => Ok((port(local, true)?, port(remote, false)?)),
        None => port(text, false).map(|p| (p, p)),
    }
}

/// `paddock snapshot ...`.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// List snapshots.
    #[command(alias = "list")]
    Ls {
        /// Only snapshots of this sandbox.
        #[arg(long)]
        sandbox: Option<String>,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one snapshot, with the bytes it holds.
    Get {
        /// Snapshot id.
        id: String,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete snapshots.
    Rm {
        /// Snapshot ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Download a snapshot as a tar archive (to move it to another host with `import`). Setuid and
    /// setgid bits are cleared from every member unless `--keep-setid`.
    Export {
        /// Snapshot id.
        id: String,
        /// Write the archive to this file (default: stdout, which must not be a terminal).
        #[arg(long, short = 'o', value_name = "FILE")]
        output: Option<std::path::PathBuf>,
        /// Keep setuid and setgid bits (files the sandbox's root made are owned by uid 0 in the
        /// archive: unpacked by root with permissions, they would be setuid-root programs).
        #[arg(long)]
        keep_setid: bool,
    },
    /// Create a snapshot from a tar archive made by `export`; prints its id.
    Import {
        /// The archive, or `-` for stdin.
        file: String,
        /// A name to recognise it by.
        #[arg(long)]
        name: Option<String>,
        /// Label (repeatable).
        #[arg(long = "label", short = 'l', value_name = "K=V", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a named volume; prints its id.
    Create {
        /// Its name (unique among your volumes).
        name: String,
        /// The most it may hold (e.g. 1G); writes beyond fail with EDQUOT.
        #[arg(long)]
        size: Option<ByteSize>,
        /// Label (repeatable).
        #[arg(long = "label", short = 'l', value_name = "K=V", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Print the API's JSON instead of the id.
        #[arg(long)]
        json: bool,
    },
    /// List volumes.
    #[command(alias = "list")]
    Ls {
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one volume (by id or name), with its usage and the sandboxes mounting it.
    Get {
        /// Volume id or name.
        volume: String,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete volumes and free their storage (refused while a sandbox mounts one).
    Rm {
        /// Volume ids or names.
        #[arg(required = true)]
        volumes: Vec<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Build a template from a registry image or a recipe (a Dockerfile subset); prints its name.
    /// Sandboxes start from it with `paddock sandbox create --template NAME`.
    Build(Box<TemplateBuildArgs>),
    /// List templates: the server's and yours.
    #[command(alias = "list")]
    Ls {
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one template (by name or id): its source, digest, layers and process defaults.
    Get {
        /// Template name or id.
        template: String,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete templates and free their storage (refused while a sandbox made from one exists).
    Rm {
        /// Template names or ids.
        #[arg(required = true)]
        templates: Vec<String>,
    },
}

/// `paddock template build`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("source").required(true).args(["from", "file"])))]
pub struct TemplateBuildArgs {
    /// Its name (unique among your templates).
    pub name: String,
    /// The image: a registry reference, as docker reads them (`python:3.12-slim`,
    /// `registry.example:5000/team/img@sha256:...`), or a local source, uploaded:
    /// `docker-archive:FILE[:TAG]` (`docker save`), `oci-archive:FILE[:REF]`, `oci:DIR[:REF]` (an
    /// OCI image layout) or `rootfs:DIR|FILE` (a root file system, or a tar of one).
    #[arg(long)]
    pub from: Option<String>,
    /// A recipe file (`FROM`, `RUN`, `COPY`, `ADD`, `ENV`, `WORKDIR`, `USER`, `ARG`, `LABEL`,
    /// `EXPOSE`, `CMD`, `ENTRYPOINT`; `-` reads stdin). Its `RUN` steps run in sandboxes, with the
    /// network the `--allow-*` flags give them; unchanged steps are reused from earlier builds.
    #[arg(long, short = 'f', value_name = "FILE")]
    pub file: Option<std::path::PathBuf>,
    /// The directory `COPY` and `ADD` take their files from (packed and uploaded with the recipe;
    /// symlinks are not followed).
    #[arg(long, value_name = "DIR", requires = "file")]
    pub context: Option<std::path::PathBuf>,
    /// A value for the recipe's `ARG NAME` (repeatable).
    #[arg(long = "build-arg", value_name = "NAME=VALUE", value_parser = parse_label)]
    pub build_args: Vec<(String, String)>,
    #[command(flatten)]
    pub net: super::NetworkArgs,
    #[command(flatten)]
    pub start: StartArgs,
    /// Print the template's JSON instead of its name.
    #[arg(long)]
    pub json: bool,
}

/// The start command of `paddock template build`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("ready").args(["ready_port", "ready_command"])))]
pub struct StartArgs {
    /// Start the image's own command (its Entrypoint and Cmd) when a sandbox boots.
    #[arg(long, conflicts_with = "start_command")]
    pub start: bool,
    /// Start this shell command (`/bin/sh -c`) when a sandbox boots.
    #[arg(long, value_name = "SCRIPT")]
    pub start_command: Option<String>,
    /// Hand a sandbox out once this port inside it accepts a connection.
    #[arg(long, value_name = "PORT")]
    pub ready_port: Option<u16>,
    /// Hand a sandbox out once this shell command (`/bin/sh -c`) exits 0.
    #[arg(long, value_name = "SCRIPT")]
    pub ready_command: Option<String>,
    /// How long a sandbox may take to be ready (seconds).
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub ready_timeout: u64,
}

/// `paddock sandbox create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Template to start from (`GET /v1/templates`) [default: default].
    #[arg(long)]
    pub template: Option<String>,
    /// Memory limit (e.g. 512M).
    #[arg(long)]
    pub memory: Option<ByteSize>,
    /// CPU quota (e.g. 1.5).
    #[arg(long)]
    pub cpus: Option<CpuQuota>,
    /// Process and thread limit.
    #[arg(long)]
    pub pids: Option<u32>,
    /// Disk limit (e.g. 10G).
    #[arg(long)]
    pub disk: Option<ByteSize>,
    /// Environment variable of every process (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<EnvVar>,
    /// Default working directory.
    #[arg(long, short = 'w')]
    pub workdir: Option<String>,
    /// Default user.
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Label (repeatable).
    #[arg(long = "label", short = 'l', value_name = "K=V", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Kill the sandbox after this long (e.g. 10m) [default: the server's].
    #[arg(long, value_parser = parse_human_duration)]
    pub timeout: Option<Duration>,
    /// Start from this snapshot's files instead of the template's (`paddock snapshot ls`).
    #[arg(long)]
    pub snapshot: Option<String>,
    /// What the timeout does: kill (default), pause (processes frozen) or stop (files kept).
    #[arg(long, value_enum)]
    pub on_timeout: Option<OnTimeoutArg>,
    /// Record the file changes of every process in the audit log (a snapshot per process start).
    #[arg(long)]
    pub audit_exec_diff: bool,
    /// Mount a named volume (repeatable): VOLUME:PATH[:ro], VOLUME being its name or id.
    #[arg(long = "volume", value_name = "VOLUME:PATH[:ro]", value_parser = parse_volume_mount)]
    pub volumes: Vec<VolumeMountRequest>,
    #[command(flatten)]
    pub net: super::NetworkArgs,
    /// Inject a stored secret (`paddock secret create`) by name (repeatable; implies a network).
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Serve the sandbox's ports without credentials on the E2B sandbox door
    /// (`<port>-<id>.<domain>`); otherwise that door needs the sandbox's traffic access token.
    #[arg(long)]
    pub public_ports: bool,
    /// Print the API's JSON instead of the id.
    #[arg(long)]
    pub json: bool,
}

/// `paddock sandbox network`.
#[derive(Debug, Args)]
pub struct NetworkCmdArgs {
    /// Sandbox id.
    pub id: String,
    /// Replace the policy by the one the flags give (new connections follow it at once).
    #[arg(long)]
    pub set: bool,
    #[command(flatten)]
    pub net: super::NetworkArgs,
    /// With `--set`: inject these stored secrets from now on (repeatable).
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// Print the API's JSON.
    #[arg(long)]
    pub json: bool,
}

/// `paddock secret ...`.
#[derive(Debug, Subcommand)]
pub enum SecretCommand {
    /// Store a secret; its value is read from standard input (one line, or all of it) or from
    /// paddock's environment variable named by `--from-env`.
    Create {
        /// Its name (A-Z, a-z, 0-9, _).
        name: String,
        /// A host it may be sent to: a name or `*.suffix` (repeatable, at least one).
        #[arg(long = "host", required = true)]
        hosts: Vec<String>,
        /// A request header field the value may be put in (repeatable; default `Authorization`,
        /// replaced by the fields given). A placeholder in any other field is sent unchanged.
        #[arg(long = "header", value_name = "FIELD")]
        headers: Vec<String>,
        /// Also put the value (percent-encoded) into query strings of requests to its hosts.
        #[arg(long)]
        query: bool,
        /// Read the value from this environment variable instead of standard input.
        #[arg(long, value_name = "VAR")]
        from_env: Option<String>,
    },
    /// List your secrets (names and hosts; values are never shown).
    Ls {
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete secrets.
    Rm {
        /// Secret names.
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// `paddock sandbox ls`.
#[derive(Debug, Args)]
pub struct LsArgs {
    /// Only sandboxes in this state (creating, running, stopped, killed, expired, failed), or `all`.
    #[arg(long)]
    pub state: Option<String>,
    /// Only sandboxes with this label (repeatable: all must match).
    #[arg(long = "label", short = 'l', value_name = "K=V", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Print the API's JSON (every page merged into one list).
    #[arg(long)]
    pub json: bool,
}

/// `paddock sandbox exec`.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).args(["shell", "command"])))]
pub struct ExecArgs {
    /// Sandbox id.
    pub id: String,
    /// Environment variable (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<EnvVar>,
    /// Working directory.
    #[arg(long, short = 'w')]
    pub cwd: Option<String>,
    /// User to run as.
    #[arg(long, short = 'u')]
    pub user: Option<String>,
    /// Kill the process tree after this long and exit 124 (e.g. 30s).
    #[arg(long, value_parser = parse_human_duration)]
    pub timeout: Option<Duration>,
    /// Run on a pseudo-terminal (sized like this terminal).
    #[arg(long, short = 't')]
    pub tty: bool,
    /// Forward this process's stdin (over a WebSocket); with --tty, this terminal in raw mode.
    #[arg(long, short = 'i')]
    pub interactive: bool,
    /// Start in the background and print its pid (read its output with `sandbox logs`).
    #[arg(long, short = 'd', conflicts_with_all = ["interactive", "tty"])]
    pub background: bool,
    /// A tag shown in the process list.
    #[arg(long)]
    pub tag: Option<String>,
    /// Print the API's JSON (the exec result) instead of streaming the output.
    #[arg(long, conflicts_with = "interactive")]
    pub json: bool,
    /// A shell command line, run with /bin/sh -c.
    #[arg(long)]
    pub shell: Option<String>,
    /// Run under this approval: the id an `approval_pending` answer named, once approved (`paddock
    /// approvals approve ID`). The command must be the very one approved; it runs once.
    #[arg(long, value_name = "ID")]
    pub approval: Option<String>,
    /// When an approval policy asks a person first: how long to wait for a decision before failing
    /// with `approval_pending` (e.g. 0s, 2m) [default and at most: the server's].
    #[arg(long, value_name = "DURATION", value_parser = parse_wait)]
    pub approval_wait: Option<Duration>,
    /// The program and its arguments.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `paddock approvals ...`.
#[derive(Debug, Subcommand)]
pub enum ApprovalCommand {
    /// List approvals, newest first; `--watch` then prints each change as it happens.
    #[command(alias = "list")]
    Ls(ApprovalsLsArgs),
    /// Show one approval: the exact request, the rule that asked, and where it stands.
    #[command(alias = "get")]
    Show {
        /// Approval id (apr_...).
        id: String,
        /// Print the API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending request: it may run once (needs an approver key other than the one that
    /// asked).
    Approve {
        /// Approval id (apr_...).
        id: String,
        /// A note for the audit log and whoever asked.
        #[arg(long)]
        note: Option<String>,
    },
    /// Reject a pending request: it never runs (needs an approver key).
    Reject {
        /// Approval id (apr_...).
        id: String,
        /// A note for the audit log and whoever asked.
        #[arg(long)]
        note: Option<String>,
    },
}

/// `paddock approvals ls`.
#[derive(Debug, Args)]
pub struct ApprovalsLsArgs {
    /// Only approvals in this state (`--watch` then prints every change: most are one leaving it).
    #[arg(long, value_enum)]
    pub state: Option<ApprovalStateArg>,
    /// Only this sandbox's.
    #[arg(long, value_name = "ID")]
    pub sandbox: Option<String>,
    /// At most this many [default: the server's, 100].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: Option<u32>,
    /// After the list, print each change of the queue as it happens, until interrupted.
    #[arg(long, short = 'w')]
    pub watch: bool,
    /// Print the API's JSON (with `--watch`: the list, then each change, one JSON object a line).
    #[arg(long)]
    pub json: bool,
}

/// `--state` of `paddock approvals ls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApprovalStateArg {
    /// Waiting for a person.
    Pending,
    /// Approved (it may run once).
    Approved,
    /// Rejected.
    Rejected,
    /// Not decided, or not used, in time.
    Expired,
}

impl From<ApprovalStateArg> for paddock_types::api::ApprovalState {
    fn from(a: ApprovalStateArg) -> Self {
        match a {
            ApprovalStateArg::Pending => Self::Pending,
            ApprovalStateArg::Approved => Self::Approved,
            ApprovalStateArg::Rejected => Self::Rejected,
            ApprovalStateArg::Expired => Self::Expired,
        }
    }
}

/// `paddock policy ...`: the tenant's approval policy, or with `--sandbox` one sandbox's.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the policy as JSON (`policy_not_found` if none is set).
    Get {
        /// The sandbox's own policy instead of the tenant's.
        #[arg(long, value_name = "ID")]
        sandbox: Option<String>,
        /// Print the API's JSON (with `sandbox_id` and `updated_at`) instead of the policy alone.
        #[arg(long)]
        json: bool,
    },
    /// Set (or replace) the policy from a JSON file (`-`: stdin), e.g. `{"default": "allow",
    /// "rules": [{"verdict": "ask", "exec": {"program": {"glob": "git"}}}]}` (needs an approver key).
    Set {
        /// The policy's JSON file, or `-` for stdin.
        #[arg(value_name = "FILE")]
        file: std::path::PathBuf,
        /// The sandbox's own policy instead of the tenant's.
        #[arg(long, value_name = "ID")]
        sandbox: Option<String>,
        /// Print the API's JSON (the policy as stored).
        #[arg(long)]
        json: bool,
    },
    /// Delete the policy (needs an approver key).
    #[command(alias = "rm")]
    Delete {
        /// The sandbox's own policy instead of the tenant's.
        #[arg(long, value_name = "ID")]
        sandbox: Option<String>,
    },
}

/// `paddock sandbox shell`.
#[derive(Debug, Args)]
pub struct ShellArgs {
    /// Sandbox id.
    pub id: String,
    /// The command to run instead of the sandbox user's shell (e.g. bash).
    #[arg(long)]
    pub cmd: Option<String>,
    /// Working directory.
    #[arg(long, short = 'w')]
    pub cwd: Option<String>,
    /// User to run as.
    #[arg(long, short = 'u')]
    pub user: Option<String>,
}

/// `paddock sandbox cp`.
#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path, `-` (stdin, files only) or `ID:/path`.
    pub src: String,
    /// Destination: a local path, `-` (stdout, files only) or `ID:/path`.
    pub dst: String,
}

/// `paddock sandbox logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Sandbox id.
    pub id: String,
    /// Process id inside the sandbox (as `exec -d` printed).
    pub pid: u32,
    /// Keep printing until the process exits.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// First stdout byte to print.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub stdout_from: u64,
    /// First stderr byte to print.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub stderr_from: u64,
}

/// `paddock audit`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AuditArgs {
    #[command(subcommand)]
    pub command: Option<AuditCommand>,
    /// Only rows about this sandbox.
    #[arg(long)]
    pub sandbox: Option<String>,
    /// Only this action (`process.exit`), or a family ending in `.` (`process.`).
    #[arg(long)]
    pub action: Option<String>,
    /// Only rows at or after this time (RFC 3339, e.g. 2025-01-31T12:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// At most this many rows.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Print the API's JSON (every page merged into one).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check the audit log's hash chain, on the server host (reads the database directly).
    Verify {
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Parses a wait as `--timeout` does, zero included (`0s`: do not wait).
pub fn parse_wait(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).or_else(|_| parse_human_duration(s))
}

/// `k=v` (the key must not be empty).
/// Parses `VOLUME:PATH[:ro|:rw]` (the path is checked by the server).
pub fn parse_volume_mount(s: &str) -> Result<VolumeMountRequest, String> {
    let err = || format!("invalid volume mount {s:?}: use VOLUME:PATH[:ro]");
    let mut parts = s.split(':');
    let (volume, path) = match (parts.next(), parts.next()) {
        (Some(v), Some(p)) if !v.is_empty() && p.starts_with('/') => (v, p),
        _ => return Err(err()),
    };
    let read_only = match parts.next() {
        None | Some("rw") => false,
        Some("ro") => true,
        Some(_) => return Err(err()),
    };
    if parts.next().is_some() {
        return Err(err());
    }
    Ok(VolumeMountRequest {
        volume: volume.to_owned(),
        path: path.to_owned(),
        read_only,
    })
}

pub fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("invalid label {s:?}: use KEY=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volume_mounts() {
        let m = parse_volume_mount("data:/data:ro").expect("valid");
        assert_eq!(
            (m.volume.as_str(), m.path.as_str(), m.read_only),
            ("data", "/data", true)
        );
        assert!(
            !parse_volume_mount("vol-0011223344556677:/home/user/x")
                .expect("valid")
                .read_only
        );
        for bad in [
            "data",
            "data:",
            ":/data",
            "data:rel",
            "data:/d:rx",
            "data:/d:ro:x",
        ] {
            assert!(parse_volume_mount(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// The command `paddock <args>` parses to.
    fn parse(args: &[&str]) -> Result<crate::cli::Command, clap::Error> {
        use clap::Parser;
        crate::cli::Cli::try_parse_from([&["paddock"][..], args].concat()).map(|c| c.command)
    }

    #[test]
    fn approvals_commands() {
        use crate::cli::Command;
        match parse(&[
            "approvals",
            "ls",
            "--state",
            "pending",
            "--sandbox",
            "sb-1",
            "--limit",
            "5",
            "--watch",
            "--json",
        ]) {
            Ok(Command::Approvals {
                command: ApprovalCommand::Ls(a),
            }) => {
                assert_eq!(
                    (a.state, a.sandbox.as_deref(), a.limit, a.watch, a.json),
                    (Some(ApprovalStateArg::Pending), Some("sb-1"), Some(5), true, true)
                );
            }
            other => panic!("not approvals ls: {other:?}"),
        }
        match parse(&["approvals", "approve", "apr_1", "--note", "fine"]) {
            Ok(Command::Approvals {
                command: ApprovalCommand::Approve { id, note },
            }) => assert_eq!((id.as_str(), note.as_deref()), ("apr_1", Some("fine"))),
            other => panic!("not approvals approve: {other:?}"),
        }
        assert!(matches!(
            parse(&["approvals", "reject", "apr_1"]),
            Ok(Command::Approvals {
                command: ApprovalCommand::Reject { note: None, .. }
            })
        ));
        assert!(matches!(
            parse(&["approvals", "show", "apr_1", "--json"]),
            Ok(Command::Approvals {
                command: ApprovalCommand::Show { json: true, .. }
            })
        ));
        for bad in [
            &["approvals", "ls", "--state", "done"][..],
            &["approvals", "ls", "--limit", "0"],
            &["approvals", "ls", "--limit", "1001"],
            &["approvals", "approve"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn policy_commands() {
        use crate::cli::Command;
        match parse(&["policy", "set", "-", "--sandbox", "sb-1"]) {
            Ok(Command::Policy {
                command: PolicyCommand::Set { file, sandbox, json },
            }) => assert_eq!(
                (file, sandbox.as_deref(), json),
                (std::path::PathBuf::from("-"), Some("sb-1"), false)
            ),
            other => panic!("not policy set: {other:?}"),
        }
        assert!(matches!(
            parse(&["policy", "get"]),
            Ok(Command::Policy {
                command: PolicyCommand::Get {
                    sandbox: None,
                    json: false
                }
            })
        ));
        assert!(matches!(
            parse(&["policy", "delete", "--sandbox", "sb-1"]),
            Ok(Command::Policy {
                command: PolicyCommand::Delete { sandbox: Some(_) }
            })
        ));
        assert!(parse(&["policy", "set"]).is_err(), "set needs a file");
    }

    #[test]
    fn exec_takes_an_approval() {
        use crate::cli::Command;
        let exec = |extra: &[&str]| {
            let args = [
                &["sandbox", "exec", "sb-1"][..],
                extra,
                &["--", "touch", "/tmp/x"],
            ]
            .concat();
            match parse(&args) {
                Ok(Command::Sandbox {
                    command: SandboxCommand::Exec(a),
                }) => (a.approval, a.approval_wait),
                other => panic!("not sandbox exec: {other:?}"),
            }
        };
        assert_eq!(exec(&[]), (None, None));
        assert_eq!(
            exec(&["--approval", "apr_1", "--approval-wait", "0s"]),
            (Some("apr_1".to_owned()), Some(Duration::ZERO))
        );
        assert_eq!(exec(&["--approval-wait", "2m"]).1, Some(Duration::from_secs(120)));
        assert!(parse(&["sandbox", "exec", "sb-1", "--approval-wait", "soon", "--", "true"]).is_err());
    }

    #[test]
    fn waits() {
        assert_eq!(parse_wait("0"), Ok(Duration::ZERO));
        assert_eq!(parse_wait("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_wait("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_wait("1h 30m"), Ok(Duration::from_secs(5400)));
        assert!(parse_wait("-1s").is_err());
    }

    #[test]
    fn labels() {
        assert_eq!(parse_label("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_label("a="), Ok(("a".into(), String::new())));
        assert!(parse_label("=b").is_err());
        assert!(parse_label("ab").is_err());
    }
}

/// `--on-timeout`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum OnTimeoutArg {
    /// Kill the sandbox.
    Kill,
    /// Freeze its processes (memory kept).
    Pause,
    /// End its processes, keep its files.
    Stop,
}

impl From<OnTimeoutArg> for paddock_types::api::OnTimeout {
    fn from(a: OnTimeoutArg) -> Self {
        match a {
            OnTimeoutArg::Kill => Self::Kill,
            OnTimeoutArg::Pause => Self::Pause,
            OnTimeoutArg::Stop => Self::Stop,
        }
    }
}
