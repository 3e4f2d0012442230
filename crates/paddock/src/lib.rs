//! The paddock command line (`run`, `gc`, `pool`, the control plane `serve`, its client commands
//! `sandbox` and `audit`, `keys`, ...), as a library for its two executables:
//!
//! - `paddock` (`src/main.rs`, [`main_front`]): every command starts here. It parses only the
//!   commands that act on this host's sandboxes without a server (`cli::LocalCommand`: `run`, `gc`,
//!   `pool destroy`, and the hidden `make-ready` that a `run --keep-ready` starts) and runs them,
//!   unless a run asks for a network; for anything else (another
//!   command, a networked run, help, an error) it execs `paddock-full`, beside it, with the same
//!   arguments, which parses the whole command line and answers. It links only the native backend
//!   and the agent's client:
//!   a `paddock run` starts a small binary, and its process, which supervises the sandbox for as
//!   long as the command runs, does not carry the server's code and relocated data (the 70 MB
//!   static-PIE binary dirtied over 1 MiB of them at every start).
//! - `paddock-full` (`src/bin/paddock-full.rs`, [`main_full`]): every command, including `serve`,
//!   the client commands, and `run` with a network (its egress proxy, `run_network.rs`).
//!
//! What keeps the front small is only that it never reaches the other modules: linking drops what
//! is not reached (`tests/architecture.rs` checks its size). The setup shim is a third executable,
//! `paddock-setup` (`src/bin/paddock-setup.rs`).
//!
//! Errors are rendered here, once, as a single line: `paddock: <message>: <cause>: ...`; an API error
//! reads `paddock: <message> (<code>)`.

mod audit;
mod cli;
mod client;
mod config;
mod keys;
mod mcp_stdio;
mod run;
mod run_lean;
mod run_network;
mod run_ready;
mod serve;
mod serve_config;
mod serve_http;
mod serve_mcp;
mod serve_webhook;
mod stdin;
mod tty;
mod wait;

pub use wait::main_wait;

use std::collections::BTreeMap;
use std::fmt;
use std::process::ExitCode;

use clap::Parser;

use cli::{
    AuditCommand, Cli, Command, ConfigCommand, FrontCli, K8sCommand, LocalCommand, PoolCommand, ServeArgs,
};
use serve_config::ServeConfig;

/// Exit code for errors of paddock itself (bad input, sandbox creation failure), as `docker run` does.
pub const EXIT_PADDOCK_ERROR: u8 = 125;
/// Exit code of the client commands when the server refused or failed the request (or could not be
/// reached).
pub const EXIT_REQUEST_FAILED: u8 = 1;

/// Bad input caught before anything was asked of a server: exits 125 whatever the command.
#[derive(Debug)]
pub struct UsageError(String);

impl UsageError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The exit status for a failed command: 125 for bad input and for paddock's own failures, 1 for a
/// client command whose request failed.
fn exit_status_of(e: &anyhow::Error, client_command: bool) -> u8 {
    if e.chain().any(|c| c.is::<UsageError>()) || !client_command {
        EXIT_PADDOCK_ERROR
    } else {
        EXIT_REQUEST_FAILED
    }
}

/// `paddock`: runs `run` (without a network), `gc` and `pool destroy`; execs `paddock-full` for the
/// rest.
pub fn main_front() -> ExitCode {
    // Only its own commands' parser is built; `paddock-full` answers everything else, help and
    // errors included, from the whole command line's.
    let Ok(cli) = FrontCli::try_parse() else {
        return exec_full();
    };
    if matches!(&cli.command, LocalCommand::Run(args) if args.wants_network()) {
        return exec_full();
    }
    init_tracing(cli.log.as_deref());
    finish(local(&cli.global, cli.command, None), false)
}

/// `paddock-full`: every command.
pub fn main_full() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    // `serve` sets up logging once its configuration (which has a log level) is loaded.
    if !matches!(cli.command, Command::Serve(_)) {
        init_tracing(cli.log.as_deref());
    }
    let client_command = cli.command.is_client();
    finish(dispatch(cli), client_command)
}

/// The command line, or the exit code after clap printed help, the version or one line of error.
fn parse() -> Result<Cli, ExitCode> {
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return Err(ExitCode::SUCCESS);
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return Err(ExitCode::from(EXIT_PADDOCK_ERROR));
            }
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("paddock: {first} (see 'paddock --help')");
            Err(ExitCode::from(EXIT_PADDOCK_ERROR))
        }
    }
}

/// The exit code of a command's result, its error printed as one line.
fn finish(result: anyhow::Result<ExitCode>, client_command: bool) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("paddock: {}", render_chain(&e));
            ExitCode::from(exit_status_of(&e, client_command))
        }
    }
}

/// Replaces this process with `paddock-full` (beside this binary), with the same arguments and
/// environment; returns only when that fails, with one line.
fn exec_full() -> ExitCode {
    use std::os::unix::process::CommandExt;
    let full = match config::beside_this_binary("paddock-full") {
        Ok(path) => path,
        Err(e) => return finish(Err(e), false),
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "paddock".into());
    let e = std::process::Command::new(&full).arg0(arg0).args(args).exec();
    eprintln!("paddock: cannot start {}: {e}", full.display());
    ExitCode::from(EXIT_PADDOCK_ERROR)
}

/// The process environment, read once, for the configuration layers.
fn environment() -> BTreeMap<String, String> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter(|(k, _)| k.starts_with("PADDOCK_"))
        .collect()
}

/// The server configuration, for the commands that use the server's state directory.
fn serve_config(cli: &Cli, args: &ServeArgs) -> anyhow::Result<ServeConfig> {
    ServeConfig::load(&cli.global, cli.log.as_deref(), args, &environment())
}

/// The server configuration with what a sandbox may ask for bounded by this host (its memory, CPUs,
/// pid budget and the pool's size).
fn bounded_serve_config(cli: &Cli, args: &ServeArgs) -> anyhow::Result<ServeConfig> {
    let mut config = serve_config(cli, args)?;
    let host = paddock_runtime::native::host_facts(&config.state_dir, config.pool_size)
        .map_err(|e| anyhow::Error::new(e).context("cannot read the host's limits"))?;
    config.bound_limits(&host)?;
    Ok(config)
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        Command::Serve(args) => {
            let config = bounded_serve_config(&cli, args)?;
            init_tracing(Some(&config.log));
            return serve::serve(&config);
        }
        Command::Mcp(args) if args.local => {
            let config = bounded_serve_config(&cli, &ServeArgs::default())?;
            return mcp_stdio::local(&config, args.keep_sandboxes);
        }
        Command::Mcp(_) => {
            let config = serve_config(&cli, &ServeArgs::default());
            let client = client::ApiClient::from_environment(&client_state_dir(&cli.global, config))?;
            return mcp_stdio::relay(&client);
        }
        Command::Config {
            command: ConfigCommand::Show(args),
        } => {
            let config = bounded_serve_config(&cli, args)?;
            print!("{}", config.to_toml()?);
            return Ok(ExitCode::SUCCESS);
        }
        Command::K8s {
            command: K8sCommand::Manifests(args),
        } => {
            let config = serve_config(&cli, &args.serve)?;
            let options = paddock_kube::ManifestOptions {
                server_account: args.server_account.clone(),
                server_namespace: args.server_namespace.clone(),
                api_server_cidrs: args.api_server_cidrs.clone(),
            };
            let manifests = paddock_kube::Manifests::build(&config.executions.kubernetes, &options);
            if args.json {
                println!("{}", serde_json::to_string_pretty(&manifests.to_json())?);
            } else {
                print!("{}", manifests.to_yaml());
            }
            return Ok(ExitCode::SUCCESS);
        }
        command if command.is_client() => {
            return dispatch_client(cli);
        }
        Command::Local(LocalCommand::Run(args)) if args.wants_network() => {
            // `run`'s egress proxy takes the operator's settings from the server's configuration file.
            let serve = serve_config(&cli, &ServeArgs::default())?;
            let Some(network) = serve.network_config()? else {
                anyhow::bail!(
                    "sandbox networks are disabled by the configuration ([egress] enabled = false)"
                );
            };
            let network = run_network::EgressNetwork::new(network, args)?;
            let network: Box<dyn run::RunNetwork> = Box::new(network);
            let Command::Local(command) = cli.command else {
                unreachable!("matched above")
            };
            return local(&cli.global, command, Some((network, serve.egress.subnet)));
        }
        // The local commands (the client ones returned through their guard above).
        _ => {}
    }
    let Command::Local(command) = cli.command else {
        unreachable!("every other command returned above")
    };
    local(&cli.global, command, None)
}

/// `run`, `gc` and `pool destroy`: what acts on this host's sandboxes without a server. `network`
/// serves a run's network, on links from that subnet; the front has none to give (see the crate's
/// documentation).
fn local(
    global: &cli::GlobalArgs,
    command: LocalCommand,
    network: Option<(Box<dyn run::RunNetwork>, paddock_runtime::NetworkSubnet)>,
) -> anyhow::Result<ExitCode> {
    let mut config = config::Config::resolve(global)?;
    let network = network.map(|(network, subnet)| {
        config.network_subnet = subnet;
        network
    });
    match command {
        LocalCommand::Run(args) => run::run(&config, args, network),
        LocalCommand::Gc => {
            let backend = config.open_backend(false)?;
            let reclaimed = backend.collect_garbage_now()?;
            if reclaimed.is_empty() {
                println!("nothing to reclaim");
            } else {
                for id in reclaimed {
                    println!("reclaimed {id}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        LocalCommand::MakeReady { lock_fd, take, spec } => {
            run_ready::make_ready(&config, &spec, lock_fd, &take)
        }
        LocalCommand::Pool {
            command: PoolCommand::Destroy,
        } => {
            // No sandbox is made ahead from now on (one being made is waited for).
            let makers = paddock_runtime::native::MakerLock::for_destroy(&config.state_dir)?;
            // Reclaim abandoned sandboxes first; opening the backend would create a pool where none is.
            if config.state_dir.join("pool").exists() {
                if let Ok(backend) = config.open_backend(false) {
                    // Before gc, which removes the parent cgroups left empty.
                    if let Some(makers) = &makers {
                        backend.drop_ready(makers);
                    }
                    backend.collect_garbage_now()?;
                }
            }
            paddock_runtime::native::StoragePool::destroy(&config.state_dir)?;
            println!("pool under {} removed", config.state_dir.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The commands that work with a server: through its API (`sandbox`, `audit`) or its database on this
/// host (`keys`, `audit verify`).
fn dispatch_client(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = serve_config(&cli, &ServeArgs::default());
    match cli.command {
        Command::Keys { command } => keys::keys(&config?, command),
        Command::Audit(args) => match args.command {
            Some(AuditCommand::Verify { json }) => audit::verify(&config?.database_path(), json),
            None => audit::list(
                client::ApiClient::from_environment(&client_state_dir(&cli.global, config))?,
                args,
            ),
        },
        Command::Sandbox { command } => client::sandbox(&client_state_dir(&cli.global, config), command),
        Command::Snapshot { command } => client::snapshot(&client_state_dir(&cli.global, config), command),
        Command::Volume { command } => client::volume(&client_state_dir(&cli.global, config), command),
        Command::Template { command } => client::template(&client_state_dir(&cli.global, config), command),
        Command::Secret { command } => client::secret(&client_state_dir(&cli.global, config), command),
        Command::Approvals { command } => client::approvals(&client_state_dir(&cli.global, config), command),
        Command::Execution { command } => client::executions(&client_state_dir(&cli.global, config), command),
        Command::Policy { command } => client::policy(&client_state_dir(&cli.global, config), command),
        _ => unreachable!("only client commands come here"),
    }
}

/// Where a client looks for the admin key: the server's state directory if its configuration loads,
/// the global flag's (or the default) otherwise. A client does not need the configuration to be valid.
fn client_state_dir(global: &cli::GlobalArgs, config: anyhow::Result<ServeConfig>) -> std::path::PathBuf {
    match config {
        Ok(c) => c.state_dir,
        Err(_) => global
            .state_dir
            .clone()
            .unwrap_or_else(|| config::DEFAULT_STATE_DIR.into()),
    }
}

/// `a: b: c` from an error and its sources, skipping sources already contained in their parent's text.
pub fn render_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if out.contains(&s) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&s);
    }
    out
}

fn init_tracing(level: Option<&str>) {
    let filter = tracing_subscriber::EnvFilter::try_new(level.unwrap_or("warn"))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}
