//! `paddock`: the front of the command line (see the `paddock` library's documentation). It runs
//! `run` without a network, `gc` and `pool destroy` itself and execs `paddock-full` for the rest.

use std::process::ExitCode;

fn main() -> ExitCode {
    paddock::main_front()
}
