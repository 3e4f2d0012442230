//! `paddock-agent`: the in-sandbox agent binary (see the library for what it does).

use std::error::Error as _;
use std::process::ExitCode;

use paddock_agent::{install_stderr_log, parse_args, run_agent, USAGE};

fn main() -> ExitCode {
    let config = match parse_args(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(err) => {
            install_stderr_log(tracing::Level::ERROR);
            tracing::error!("{err}; {USAGE}");
            return ExitCode::from(2);
        }
    };
    install_stderr_log(config.log_level);
    match run_agent(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let mut message = err.to_string();
            let mut source = err.source();
            while let Some(cause) = source {
                message.push_str(": ");
                message.push_str(&cause.to_string());
                source = cause.source();
            }
            tracing::error!("{message}");
            ExitCode::FAILURE
        }
    }
}
