//! The last steps before an exec: arranging file descriptors, resetting the signal state a program
//! would otherwise inherit, and exec'ing by file descriptor.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;

/// Duplicates `fd` onto descriptor number `target` (`dup2(2)`); the copy is not close-on-exec.
pub fn install_fd(fd: BorrowedFd<'_>, target: RawFd) -> io::Result<()> {
    if fd.as_raw_fd() == target {
        // dup2 onto itself would keep FD_CLOEXEC; clear it explicitly.
        return keep_across_exec(fd);
    }
    // SAFETY: dup2 only manipulates the descriptor table; `fd` is a valid open descriptor borrowed for
    // the call, and replacing whatever `target` held is the documented intent of this function.
    if unsafe { libc::dup2(fd.as_raw_fd(), target) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Marks every descriptor numbered `first` or above close-on-exec (`close_range(2)` with
/// `CLOSE_RANGE_CLOEXEC`), so nothing but the listed descriptors reaches the next program.
pub fn cloexec_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets a flag on descriptors; it closes nothing,
    // so no owned descriptor of this process is invalidated.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Resets every catchable signal to its default action. `execve` resets caught signals but keeps
/// ignored ones, such as the `SIGPIPE` the Rust runtime ignores (or a `SIGCHLD`/`SIGHUP` a server may
/// ignore), which would otherwise stay ignored in the program. Meant for right before an exec: it uses
/// the raw `rt_sigaction` system call, because the C library refuses to touch the two signals it
/// reserves (32 and 33), which an ignoring parent passes on just the same. Async-signal-safe, so it
/// may run between `fork` and `exec`.
pub fn reset_signal_dispositions() {
    let uncatchable = (1u64 << (libc::SIGKILL - 1)) | (1u64 << (libc::SIGSTOP - 1));
    reset_signals(!uncatchable);
}

/// The catchable signals the calling process ignores, as a bit mask (bit `n - 1` = signal `n`). Only
/// these survive an `execve` (caught signals are reset by it), so only these need resetting before
/// one. Uses the raw `rt_sigaction` system call for the same reason as
/// [`reset_signal_dispositions`].
pub fn ignored_signals() -> u64 {
    let mut mask = 0u64;
    for signal in 1..=64 {
        if signal == libc::SIGKILL || signal == libc::SIGSTOP {
            continue;
        }
        let mut old = [0u64; 4];
        // SAFETY: the kernel writes one `struct sigaction` (32 bytes) into the live buffer `old` and
        // changes nothing (new action NULL).
        let r = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                std::ptr::null::<u64>(),
                old.as_mut_ptr(),
                8usize,
            )
        };
        // The handler is the first word; SIG_IGN is 1.
        if r == 0 && old[0] == libc::SIG_IGN as u64 {
            mask |= 1 << (signal - 1);
        }
    }
    mask
}

/// Resets the signals in `mask` (from [`ignored_signals`]) to their default action.
/// Async-signal-safe.
pub fn reset_signals(mask: u64) {
    let default_action = [0u64; 4];
    for signal in 1..=64 {
        if mask & (1 << (signal - 1)) == 0 {
            continue;
        }
        // SAFETY: the kernel reads one `struct sigaction` (32 bytes, the size of `default_action`)
        // from a live buffer and writes nothing (old action NULL); SIG_DFL installs no handler code.
        // The last argument is the kernel's sigset size (8 bytes for 64 signals). The kernel's
        // `struct sigaction` on x86_64 and aarch64 is handler, flags, restorer, mask: all zero is
        // SIG_DFL with no flags and an empty mask.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                signal,
                default_action.as_ptr(),
                std::ptr::null_mut::<u64>(),
                8usize,
            )
        };
    }
}

/// Unblocks every signal of the calling thread (`exec` keeps the signal mask, so a program would
/// start with whatever its parent blocked). Async-signal-safe.
pub fn unblock_all_signals() -> io::Result<()> {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow};
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
    Ok(())
}

/// Replaces the process image with the executable open at `fd` (`execveat(fd, "", AT_EMPTY_PATH)`),
/// so the binary need not be visible inside the sandbox's root. Returns only on failure.
pub fn exec_fd<A: AsRef<OsStr>, E: AsRef<OsStr>>(fd: BorrowedFd<'_>, argv: &[A], env: &[E]) -> io::Error {
    fn to_c<S: AsRef<OsStr>>(v: &[S]) -> Result<Vec<CString>, io::Error> {
        v.iter()
            .map(|s| {
                CString::new(s.as_ref().as_bytes())
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in argument"))
            })
            .collect()
    }
    let (argv, env) = match (to_c(argv), to_c(env)) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let mut argv_p: Vec<*const libc::c_char> = argv.iter().map(|s| s.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut env_p: Vec<*const libc::c_char> = env.iter().map(|s| s.as_ptr()).collect();
    env_p.push(std::ptr::null());
    // SAFETY: `argv_p` and `env_p` are NULL-terminated arrays of pointers into CStrings that outlive
    // the call; the empty path with AT_EMPTY_PATH makes the kernel execute the file `fd` refers to.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd.as_raw_fd(),
            c"".as_ptr(),
            argv_p.as_ptr(),
            env_p.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
    io::Error::last_os_error()
}

/// Takes ownership of descriptor `fd`, inherited across an `exec` from the program that started this
/// one (which named it, say, in an argument), after checking it is open (`fcntl(F_GETFD)`); it becomes
/// close-on-exec. Only for a number no other part of this process owns: the standard streams are
/// refused. Meant for start-up, once per number.
pub fn take_inherited_fd(fd: RawFd) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    if fd <= 2 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a standard stream is not inheritable here",
        ));
    }
    // SAFETY: F_GETFD only reads the descriptor's flags; an invalid number yields EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is open (checked above) and, by this function's contract, owned by nothing else in
    // this process: it came from the previous program across exec and is taken once.
    let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
    Ok(owned)
}

/// Makes `fd` survive an `exec` (clears `FD_CLOEXEC`).
pub fn keep_across_exec(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = rustix::io::fcntl_getfd(fd)?;
    Ok(rustix::io::fcntl_setfd(fd, flags - rustix::io::FdFlags::CLOEXEC)?)
}

#[cfg(test)]
mod tests {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};

    use super::*;
    use crate::child_test::{in_child, run_in_child};

    const CHILD_ENV: &str = "PADDOCK_SYS_EXEC_CHILD";

    /// A signal-set field (`SigIgn:`, `SigBlk:`) of this thread's `/proc` status.
    fn status_mask(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .expect("field present")
            .trim();
        u64::from_str_radix(hex, 16).expect("hex mask")
    }

    fn bit(signal: i32) -> u64 {
        1 << (signal - 1)
    }

    #[test]
    fn signal_state_is_reset_in_child() {
        let name = "exec::tests::signal_state_is_reset_in_child";
        if !in_child(CHILD_ENV, name) {
            run_in_child(CHILD_ENV, name);
            return;
        }
        // SAFETY: SIG_IGN installs no handler code; this is a test process of its own.
        unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
        let mut blocked = SigSet::empty();
        blocked.add(Signal::SIGTERM);
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None).expect("block");
        // The Rust runtime ignores SIGPIPE.
        assert_ne!(status_mask("SigIgn:") & bit(libc::SIGPIPE), 0);
        assert_ne!(status_mask("SigIgn:") & bit(libc::SIGHUP), 0);
        assert_ne!(status_mask("SigBlk:") & bit(libc::SIGTERM), 0);

        reset_signal_dispositions();
        unblock_all_signals().expect("unblock");

        assert_eq!(status_mask("SigIgn:"), 0, "no signal stays ignored");
        assert_eq!(status_mask("SigBlk:"), 0, "no signal stays blocked");
    }
}
