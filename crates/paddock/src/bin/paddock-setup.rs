//! `paddock-setup`: the setup shim's own executable, a fresh single-threaded process per sandbox
//! (see `paddock_runtime::native::setup`).
//!
//! It is a separate, small binary rather than a hidden entry point of `paddock` because every sandbox
//! creation execs it: a static-PIE binary relocates itself at every exec, and the 70 MB `paddock`
//! binary (the server, its API, its clients) carries some 65,000 relocations whose copy-on-write
//! pages cost more than the rest of the shim's work. This one links only what the shim reaches.
//!
//! It does nothing but read one spec from stdin; it takes no arguments and no environment.

use std::process::ExitCode;

fn main() -> ExitCode {
    let code = paddock_runtime::native::setup::run_setup_shim();
    ExitCode::from(code as u8)
}
