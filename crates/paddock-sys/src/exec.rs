//! The last steps of the setup shim: arranging file descriptors and exec'ing by file descriptor.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// Duplicates `fd` onto descriptor number `target` (`dup2(2)`); the copy is not close-on-exec.
pub fn install_fd(fd: BorrowedFd<'_>, target: RawFd) -> io::Result<()> {
    if fd.as_raw_fd() == target {
        // dup2 onto itself would keep FD_CLOEXEC; clear it explicitly.
        let flags = rustix::io::fcntl_getfd(fd)?;
        return Ok(rustix::io::fcntl_setfd(fd, flags - rustix::io::FdFlags::CLOEXEC)?);
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

/// Replaces the process image with the executable open at `fd` (`execveat(fd, "", AT_EMPTY_PATH)`),
/// so the binary need not be visible inside the sandbox's root. Returns only on failure.
pub fn exec_fd(fd: BorrowedFd<'_>, argv: &[&str], env: &[&str]) -> io::Error {
    let to_c = |v: &[&str]| -> Result<Vec<CString>, io::Error> {
        v.iter()
            .map(|s| {
                CString::new(*s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in argument"))
            })
            .collect()
    };
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
