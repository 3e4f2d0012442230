//! The `paddock` binary: the command line, and the hidden `__setup` entry point of the setup shim.
//!
//! Errors are rendered here, once, as a single line: `paddock: <message>: <cause>: ...`.

mod cli;
mod config;
mod run;
mod tty;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command, PoolCommand};

/// Exit code for errors of paddock itself (bad input, sandbox creation failure), as `docker run` does.
pub const EXIT_PADDOCK_ERROR: u8 = 125;

fn main() -> ExitCode {
    // The setup shim must stay single-threaded and must not initialize anything else first.
    if std::env::args_os().nth(1).is_some_and(|a| a == "__setup") {
        let code = paddock_runtime::native::setup::run_setup_shim();
        return ExitCode::from(code as u8);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(EXIT_PADDOCK_ERROR);
            }
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("paddock: {first} (see 'paddock --help')");
            return ExitCode::from(EXIT_PADDOCK_ERROR);
        }
    };
    init_tracing(cli.log.as_deref());
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("paddock: {}", render_chain(&e));
            ExitCode::from(EXIT_PADDOCK_ERROR)
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = config::Config::resolve(&cli.global)?;
    match cli.command {
        Command::Run(args) => run::run(&config, args),
        Command::Gc => {
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
        Command::Pool {
            command: PoolCommand::Destroy,
        } => {
            // Reclaim abandoned sandboxes first; opening the backend would create a pool where none is.
            if config.state_dir.join("pool").exists() {
                if let Ok(backend) = config.open_backend(false) {
                    backend.collect_garbage_now()?;
                }
            }
            paddock_runtime::native::StoragePool::destroy(&config.state_dir)?;
            println!("pool under {} removed", config.state_dir.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `a: b: c` from an error and its sources, skipping sources already contained in their parent's text.
fn render_chain(e: &anyhow::Error) -> String {
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
        .with_writer(std::io::stderr)
        .try_init();
}
