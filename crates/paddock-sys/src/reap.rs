//! The agent's children: reaping every child (re-parented orphans included) with `wait4(-1)`,
//! sending signals, adopting the descriptor the agent inherits so that it never leaks into a child,
//! and starting a program with dropped privileges ([`spawn_child`]).
//!
//! The agent is PID 1 of its sandbox (or a child subreaper in tests), so it must reap everything; it
//! therefore cannot use a process library with a reaper of its own (tokio's would race this one).
//!
//! What this module does not do: look users up, search `PATH` (the caller passes the candidate
//! paths), or keep track of which pids belong to whom.

mod spawn_child;

use std::io;
use std::os::fd::OwnedFd;

pub use spawn_child::{
    prepare_spawns, spawn_child, ChildSpec, ChildStdio, Credentials, SpawnError, SpawnStage,
};

/// Marks the calling process a child subreaper (`prctl(PR_SET_CHILD_SUBREAPER, 1)`): orphaned
/// descendants are re-parented to it instead of to init, so it can reap and track them. Used when
/// the agent is not PID 1 (tests).
pub fn become_child_subreaper() -> io::Result<()> {
    Ok(rustix::process::set_child_subreaper(Some(
        rustix::process::getpid(),
    ))?)
}

/// Adopts a descriptor inherited from the parent process (the listening socket the setup shim passes
/// as `--listen-fd N`): returns a duplicate (`fcntl(F_DUPFD_CLOEXEC)`) that the caller owns outright,
/// and marks the inherited number close-on-exec so it never reaches a child. The inherited number
/// stays open (one descriptor), since this function cannot know whether something else owns it.
pub fn adopt_inherited_fd(fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: fcntl only takes integers; an fd number that is not open fails with EBADF. The new
    // descriptor it returns was created by this call, so nothing else in the process owns it.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `copy` is a freshly created, open descriptor that no other owner knows about.
    let copy = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(copy) };
    // SAFETY: setting FD_CLOEXEC on the inherited number changes a flag only; it closes nothing.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(copy)
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    /// It called `exit` with this code.
    Code(i32),
    /// This signal killed it.
    Signal(i32),
}

/// One reaped child with its resource usage (from `wait4`'s `struct rusage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// Its pid.
    pub pid: u32,
    /// How it ended.
    pub exit: ChildExit,
    /// User plus system CPU time, microseconds.
    pub cpu_time_us: u64,
    /// Peak resident set size, KiB.
    pub max_rss_kib: u64,
}

/// Reaps one terminated child, any child (`wait4(-1, WNOHANG | __WALL)`). Returns `None` when no
/// child has terminated (or there are no children at all).
pub fn reap_one() -> io::Result<Option<Reaped>> {
    wait_nohang(-1)
}

/// `wait4(pid, WNOHANG | __WALL)` with the status and usage decoded.
pub(crate) fn wait_nohang(pid: libc::pid_t) -> io::Result<Option<Reaped>> {
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero `rusage` is a valid value of this plain C struct of integers.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: `status` and `usage` are live, writable locals of exactly the types wait4 fills in;
        // WNOHANG makes the call return at once.
        let reaped = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG | libc::__WALL, &mut usage) };
        if reaped > 0 {
            let exit = if libc::WIFSIGNALED(status) {
                ChildExit::Signal(libc::WTERMSIG(status))
            } else {
                ChildExit::Code(libc::WEXITSTATUS(status))
            };
            let micros = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1_000_000 + t.tv_usec.max(0) as u64;
            return Ok(Some(Reaped {
                pid: reaped as u32,
                exit,
                cpu_time_us: micros(usage.ru_utime) + micros(usage.ru_stime),
                max_rss_kib: usage.ru_maxrss.max(0) as u64,
            }));
        }
        if reaped == 0 {
            return Ok(None);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ECHILD) => return Ok(None),
            Some(libc::EINTR) => continue,
            _ => return Err(err),
        }
    }
}

/// Sends signal number `signal` to process `pid` (`kill(2)`). Any number the kernel accepts works,
/// real-time signals included; 0 only checks that the process exists.
pub fn send_signal(pid: u32, signal: i32) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: kill only takes integers; a positive pid addresses exactly one process (never a group
    // or "every process"), which the check above guarantees.
    if unsafe { libc::kill(pid, signal) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sends `signal` to every process the caller may signal except itself (`kill(-1, signal)`).
///
/// Refuses (`EPERM`) unless the caller is PID 1, where "every process" means every process of its
/// PID namespace, i.e. of the sandbox; anywhere else it would hit unrelated processes.
pub fn signal_whole_namespace(signal: i32) -> io::Result<()> {
    if rustix::process::getpid().as_raw_nonzero().get() != 1 {
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    // SAFETY: kill only takes integers; the caller is PID 1 (checked above), so -1 addresses only the
    // processes of its own PID namespace.
    if unsafe { libc::kill(-1, signal) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn signalling_requires_a_real_pid() {
        assert!(send_signal(0, 0).is_err());
        assert!(send_signal(u32::MAX, 0).is_err());
        assert!(send_signal(std::process::id(), 0).is_ok());
        if rustix::process::getpid().as_raw_nonzero().get() != 1 {
            assert!(signal_whole_namespace(0).is_err());
        }
    }

    #[test]
    fn adopting_an_fd_duplicates_it() {
        let file = std::fs::File::open("/dev/null").expect("/dev/null");
        let copy = adopt_inherited_fd(file.as_raw_fd()).expect("adopt");
        assert_ne!(copy.as_raw_fd(), file.as_raw_fd());
        assert!(adopt_inherited_fd(-1).is_err());
    }

    #[test]
    fn nothing_to_reap_is_not_an_error() {
        // A pid that is not our child: ECHILD becomes "nothing to reap".
        assert_eq!(wait_nohang(1).expect("wait4"), None);
    }
}
