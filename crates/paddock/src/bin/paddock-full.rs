//! `paddock-full`: the whole command line, `serve` and the client commands included (see the
//! `paddock` library's documentation). Users run `paddock`, which execs this for what it does not
//! run itself.

use std::process::ExitCode;

fn main() -> ExitCode {
    paddock::main_full()
}
