//! Pseudo-terminals: allocating a pair, sizing it, making it a controlling terminal, and raw mode for
//! the host-side terminal of `paddock run --tty`.
//!
//! Everything goes through rustix's safe wrappers; this module has no `unsafe` of its own.
//!
//! What this module does not do: pump bytes between the master and a client, or handle `SIGWINCH`
//! (the agent and the CLI do).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::pty::OpenptFlags;
use rustix::termios::{OptionalActions, Termios, Winsize};

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WinSize {
    /// Number of rows (lines).
    pub rows: u16,
    /// Number of columns.
    pub cols: u16,
}

/// Allocates a pseudo-terminal pair and returns `(master, slave)`, both close-on-exec.
///
/// Opens `/dev/ptmx` (`O_RDWR | O_NOCTTY | O_CLOEXEC`), then `grantpt` and `unlockpt`, then opens the
/// slave with `TIOCGPTPEER` (Linux 4.13+), which goes through the master's own devpts instance instead
/// of a path, so it cannot be raced or resolved in another mount namespace. Neither end becomes the
/// caller's controlling terminal. When `size` is given, the new terminal gets that window size.
pub fn open_pty(size: Option<WinSize>) -> io::Result<(OwnedFd, OwnedFd)> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let slave = rustix::pty::ioctl_tiocgptpeer(&master, flags)?;
    if let Some(size) = size {
        set_window_size(master.as_fd(), size)?;
    }
    Ok((master, slave))
}

/// Sets the window size of the terminal behind `fd` (`TIOCSWINSZ`); the kernel sends `SIGWINCH` to
/// the terminal's foreground process group. Either end of a pty may be used.
pub fn set_window_size(fd: BorrowedFd<'_>, size: WinSize) -> io::Result<()> {
    let winsize = Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    Ok(rustix::termios::tcsetwinsize(fd, winsize)?)
}

/// Reads the window size of the terminal behind `fd` (`TIOCGWINSZ`).
pub fn window_size(fd: BorrowedFd<'_>) -> io::Result<WinSize> {
    let winsize = rustix::termios::tcgetwinsize(fd)?;
    Ok(WinSize {
        rows: winsize.ws_row,
        cols: winsize.ws_col,
    })
}

/// Makes the terminal `fd` the controlling terminal of the calling process (`ioctl(TIOCSCTTY, 0)`).
///
/// The caller must be a session leader without a controlling terminal, i.e. have called `setsid()`
/// first; the usual place is a `pre_exec` closure after `fork`, followed by `dup2` of the slave onto
/// stdin/stdout/stderr. A single system call, no allocation: async-signal-safe.
pub fn set_controlling_terminal(fd: BorrowedFd<'_>) -> io::Result<()> {
    Ok(rustix::process::ioctl_tiocsctty(fd)?)
}

/// Whether `fd` refers to a terminal (`isatty`).
pub fn is_terminal(fd: BorrowedFd<'_>) -> bool {
    rustix::termios::isatty(fd)
}

/// Puts a terminal into raw mode and restores its previous settings when dropped.
///
/// Raw mode is `cfmakeraw`'s: no line editing, no echo, no signal characters, no output processing,
/// 8-bit characters, reads return after one byte. The guard holds a duplicate of the descriptor, so
/// it does not borrow the caller's.
#[derive(Debug)]
pub struct RawModeGuard {
    fd: OwnedFd,
    saved: Termios,
}

impl RawModeGuard {
    /// Saves the settings of the terminal `fd` (`tcgetattr`) and switches it to raw mode
    /// (`tcsetattr(TCSANOW)`). Fails with `ENOTTY` if `fd` is not a terminal.
    pub fn enable(fd: BorrowedFd<'_>) -> io::Result<RawModeGuard> {
        let fd = fd.try_clone_to_owned()?;
        let saved = rustix::termios::tcgetattr(&fd)?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&fd, OptionalActions::Now, &raw)?;
        Ok(RawModeGuard { fd, saved })
    }
}

impl Drop for RawModeGuard {
    fn drop(&mut self) {
        // Nothing useful to do on failure: the terminal may already be gone (hung up).
        let _ = rustix::termios::tcsetattr(&self.fd, OptionalActions::Now, &self.saved);
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    use rustix::termios::LocalModes;

    use super::*;

    /// Reads from the master until `needle` shows up (or the slave side is closed).
    fn read_until(master: &OwnedFd, needle: &str) -> String {
        let mut file = std::fs::File::from(master.try_clone().expect("dup master"));
        let mut seen = Vec::new();
        let mut buf = [0u8; 256];
        while !String::from_utf8_lossy(&seen).contains(needle) {
            match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
                // EIO: every slave descriptor is closed.
                Err(err) if err.raw_os_error() == Some(libc::EIO) => break,
                Err(err) => panic!("read master: {err}"),
            }
        }
        String::from_utf8_lossy(&seen).into_owned()
    }

    #[test]
    fn window_size_round_trips() {
        let (master, slave) = open_pty(Some(WinSize { rows: 40, cols: 120 })).expect("open pty");
        assert_eq!(
            window_size(slave.as_fd()).expect("size"),
            WinSize { rows: 40, cols: 120 }
        );
        set_window_size(master.as_fd(), WinSize { rows: 50, cols: 132 }).expect("resize");
        assert_eq!(
            window_size(slave.as_fd()).expect("size"),
            WinSize { rows: 50, cols: 132 }
        );
        assert_eq!(
            window_size(master.as_fd()).expect("size"),
            WinSize { rows: 50, cols: 132 }
        );
    }

    #[test]
    fn slave_output_reaches_master() {
        let (master, slave) = open_pty(None).expect("open pty");
        assert!(is_terminal(master.as_fd()) && is_terminal(slave.as_fd()));
        let mut slave = std::fs::File::from(slave);
        slave.write_all(b"hello\n").expect("write slave");
        // The line discipline's default ONLCR turns \n into \r\n.
        assert!(read_until(&master, "hello\r\n").contains("hello\r\n"));
    }

    #[test]
    fn pipes_are_not_terminals() {
        let (read, _write) = rustix::pipe::pipe().expect("pipe");
        assert!(!is_terminal(read.as_fd()));
        let err = RawModeGuard::enable(read.as_fd()).expect_err("a pipe has no termios");
        assert_eq!(err.raw_os_error(), Some(libc::ENOTTY));
    }

    #[test]
    fn raw_mode_is_restored_on_drop() {
        let (_master, slave) = open_pty(None).expect("open pty");
        let cooked = rustix::termios::tcgetattr(&slave).expect("tcgetattr");
        assert!(cooked.local_modes.contains(LocalModes::ICANON | LocalModes::ECHO));
        {
            let _raw = RawModeGuard::enable(slave.as_fd()).expect("raw mode");
            let raw = rustix::termios::tcgetattr(&slave).expect("tcgetattr");
            assert!(!raw
                .local_modes
                .intersects(LocalModes::ICANON | LocalModes::ECHO | LocalModes::ISIG));
        }
        let restored = rustix::termios::tcgetattr(&slave).expect("tcgetattr");
        assert_eq!(restored.local_modes, cooked.local_modes);
        assert_eq!(restored.output_modes, cooked.output_modes);
    }

    #[test]
    fn child_gets_the_pty_as_controlling_terminal() {
        let (master, slave) = open_pty(Some(WinSize { rows: 24, cols: 80 })).expect("open pty");
        let mut cmd = Command::new("/bin/sh");
        // /dev/tty opens only for a process with a controlling terminal; stty reads it back.
        cmd.args(["-c", "echo ctty-ok > /dev/tty && stty size < /dev/tty"])
            .stdin(Stdio::from(slave.try_clone().expect("dup slave")))
            .stdout(Stdio::from(slave.try_clone().expect("dup slave")))
            .stderr(Stdio::from(slave.try_clone().expect("dup slave")));
        let slave_for_child = slave.try_clone().expect("dup slave");
        // SAFETY: the closure runs in the forked child before exec and only makes two system calls
        // (setsid, ioctl TIOCSCTTY) on a descriptor opened before the fork; it allocates nothing and
        // takes no locks, so it is async-signal-safe as pre_exec requires.
        unsafe {
            cmd.pre_exec(move || {
                rustix::process::setsid()?;
                set_controlling_terminal(slave_for_child.as_fd())
            });
        }
        let mut child = cmd.spawn().expect("spawn sh");
        drop(slave);
        drop(cmd);
        let output = read_until(&master, "24 80");
        let status = child.wait().expect("wait sh");
        assert!(status.success(), "{status}: {output}");
        assert!(
            output.contains("ctty-ok") && output.contains("24 80"),
            "{output:?}"
        );
    }
}
