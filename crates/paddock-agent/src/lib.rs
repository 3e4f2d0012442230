//! The in-sandbox agent: PID 1 of every sandbox. It serves `paddock-protocol` on a unix socket;
//! the host connects, says hello, and drives processes (spawn with pipes or a PTY, stdin, signals,
//! process-tree kills, timeouts, output replay with backpressure) and files (confined to the
//! sandbox root with `openat2(RESOLVE_IN_ROOT)`) and directory watches (inotify, confined the same
//! way). It is also the Jupyter client of the code kernels it starts inside the sandbox (`kernel/`:
//! ZeroMQ on the sandbox's loopback, cells one at a time per kernel, their output relayed as bounded
//! cell events).
//!
//! It runs on one thread (a tokio current-thread runtime) and reaps every child itself with
//! `wait4(-1)`, so it does not use `tokio::process`. Of paddock's crates it depends on the protocol
//! and `paddock-sys` alone (plus the Jupyter and ZeroMQ client crates for kernels): it is the code
//! that lives next to untrusted workloads.
//!
//! What it does not do: set up the sandbox (mounts, seccomp, Landlock, namespaces are done by the
//! setup shim before it execs the agent), enforce resource limits (cgroups, on the host side), or
//! restart a dead kernel (the host shuts it down and starts it again).

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
