//! `paddock-wait`: what a long `paddock run` becomes while its command runs (see the `paddock`
//! library's `run_lean` and `wait` modules). Started only by `paddock run`, with internal arguments.

use std::process::ExitCode;

fn main() -> ExitCode {
    paddock::main_wait()
}
