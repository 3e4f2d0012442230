//! The host side of `paddock run --tty`: raw mode on this terminal, restored on every exit path.

use std::os::fd::AsFd;

use anyhow::Context;
use paddock_protocol::PtySize;
use paddock_sys::pty::{self, RawModeGuard};

/// This process's terminal in raw mode for the duration of a `--tty` run.
pub struct TerminalSession {
    _raw: Option<RawModeGuard>,
}

impl TerminalSession {
    /// Puts stdin's terminal (if stdin is one) in raw mode.
    pub fn start() -> anyhow::Result<Self> {
        let stdin = std::io::stdin();
        let raw = if pty::is_terminal(stdin.as_fd()) {
            Some(RawModeGuard::enable(stdin.as_fd()).context("failed to put the terminal in raw mode")?)
        } else {
            None
        };
        Ok(Self { _raw: raw })
    }

    /// The current size of this terminal (80x24 when stdin is not a terminal).
    pub fn size(&self) -> PtySize {
        match pty::window_size(std::io::stdin().as_fd()) {
            Ok(w) if w.rows > 0 && w.cols > 0 => PtySize {
                rows: w.rows,
                cols: w.cols,
            },
            _ => PtySize { rows: 24, cols: 80 },
        }
    }
}
