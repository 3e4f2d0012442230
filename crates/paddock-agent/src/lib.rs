//! The in-sandbox agent: PID 1 of every sandbox. It serves `paddock-protocol` on a unix socket;
//! the host connects, says hello, and drives processes (spawn with pipes or a PTY, stdin, signals,
//! process-tree kills, timeouts, output replay with backpressure) and files (confined to the
//! sandbox root with `openat2(RESOLVE_IN_ROOT)`) and directory watches (inotify, confined the same
//! way).
//!
//! It runs on one thread (a tokio current-thread runtime) and reaps every child itself with
//! `wait4(-1)`, so it does not use `tokio::process`. It depends on nothing but the protocol and
//! `paddock-sys`: it is the code that lives next to untrusted workloads.
//!
//! What it does not do: set up the sandbox (mounts, seccomp, Landlock, namespaces are done by the
//! setup shim before it execs the agent) or enforce resource limits (cgroups, on the host side).

mod agent;
pub mod cli;
mod connection;
mod dispatch;
mod error_code;
mod files;
mod kernel;
mod lookup_user;
mod outbound;
mod process;
mod run;
mod stderr_log;
mod watch;

pub use cli::{parse_args, AgentConfig, CliError, Listen, USAGE};
pub use run::{run_agent, AgentRunError};
pub use stderr_log::install_stderr_log;
