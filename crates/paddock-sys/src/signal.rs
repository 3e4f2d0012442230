//! Blocking signals and reading them from a descriptor (`signalfd(2)`), for a process that hands
//! itself over across an `exec` without a window in which a signal takes its default action.
//!
//! A blocked signal stays pending across `execve`, and the mask is inherited by the next program, so
//! a program that blocks a signal before an exec and reads it from a `signalfd` after loses none.
//! This module does not install handlers.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

fn set_of(signals: &[i32]) -> io::Result<SigSet> {
    let mut set = SigSet::empty();
    for &s in signals {
        set.add(Signal::try_from(s).map_err(io::Error::from)?);
    }
    Ok(set)
}

/// Blocks `signals` for the calling thread (`pthread_sigmask(SIG_BLOCK)`): they stay pending until
/// unblocked or read from a [`SignalReader`].
pub fn block(signals: &[i32]) -> io::Result<()> {
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set_of(signals)?), None)?;
    Ok(())
}

/// Unblocks `signals` for the calling thread (`pthread_sigmask(SIG_UNBLOCK)`).
pub fn unblock(signals: &[i32]) -> io::Result<()> {
    pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set_of(signals)?), None)?;
    Ok(())
}

/// Whether `signal` is blocked for the calling thread.
pub fn is_blocked(signal: i32) -> io::Result<bool> {
    let mut old = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, None, Some(&mut old))?;
    Ok(old.contains(Signal::try_from(signal).map_err(io::Error::from)?))
}

/// A `signalfd(2)` for some signals, which must be blocked ([`block`]) to be read from it rather
/// than acted on. Non-blocking and close-on-exec.
#[derive(Debug)]
pub struct SignalReader(SignalFd);

impl SignalReader {
    /// `signalfd(-1, signals, SFD_NONBLOCK | SFD_CLOEXEC)`.
    pub fn new(signals: &[i32]) -> io::Result<Self> {
        let fd = SignalFd::with_flags(&set_of(signals)?, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(Self(fd))
    }

    /// The next pending signal's number, `None` when none is pending.
    pub fn pending(&mut self) -> io::Result<Option<i32>> {
        Ok(self.0.read_signal()?.map(|info| info.ssi_signo as i32))
    }
}

impl AsFd for SignalReader {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blocked signal raised at this thread is read from the descriptor, once, and never acted on
    /// (SIGUSR1's default action would end the test process).
    #[test]
    fn a_blocked_signal_is_read_and_not_acted_on() {
        // The test harness runs each test on its own thread; the mask is this thread's.
        block(&[libc::SIGUSR1]).expect("test");
        assert!(is_blocked(libc::SIGUSR1).expect("test"));
        let mut reader = SignalReader::new(&[libc::SIGUSR1]).expect("test");
        assert_eq!(reader.pending().expect("test"), None);
        // SAFETY: raise(3) sends a signal to the calling thread; it is blocked, so no handler runs.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR1) }, 0);
        assert_eq!(reader.pending().expect("test"), Some(libc::SIGUSR1));
        assert_eq!(reader.pending().expect("test"), None);
        unblock(&[libc::SIGUSR1]).expect("test");
        assert!(!is_blocked(libc::SIGUSR1).expect("test"));
    }
}
