//! The command line: `paddock run` as a tool, the client against a scripted server, the client
//! against a real `paddock serve`, and the approvals queue and approved executions driven from the
//! client.

mod approvals;
mod client;
mod executions;
mod lean;
mod ready;
mod run;
mod serve;
mod spares;

use std::process::{Command, Output, Stdio};

use crate::support::harness::Harness;
use crate::support::{assert_code, paddock_bin, stdout};

/// `paddock` as a client of the in-process service `h` with `key` (no state directory).
fn harness_client(h: &Harness, key: &str) -> Command {
    let mut c = Command::new(paddock_bin());
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("PADDOCK_URL", &h.base)
        .env("PADDOCK_API_KEY", key)
        .env("PADDOCK_STATE_DIR", "/nonexistent/paddock-state")
        .stdin(Stdio::null());
    c
}

/// [`harness_client`] run to its end with `args`.
fn harness_run(h: &Harness, key: &str, args: &[&str]) -> Output {
    harness_client(h, key).args(args).output().expect("paddock runs")
}

/// The stdout of a command that must have succeeded.
#[track_caller]
fn ok(o: &Output) -> String {
    assert_code(o, 0);
    stdout(o)
}
