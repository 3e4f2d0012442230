//! Starting a program with dropped privileges: [`spawn_child`] clones a child that shares the
//! caller's memory until its exec (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does), runs a fixed list
//! of async-signal-safe steps in it (no allocation, no locks: everything the child touches is prepared
//! before the clone), and reports the first failing step through a close-on-exec pipe, so
//! "program not found" is an error of the spawn, not a child that exits with 127.

use std::ffi::{CString, OsStr};
use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, SigmaskHow};
use rustix::fs::{Gid, Uid};

use super::send_signal;

/// How long [`spawn_child`] waits for the child to reach `execve` before killing it.
const EXEC_REPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The user and groups a child runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// Real, effective and saved user id.
    pub uid: u32,
    /// Real, effective and saved group id.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

/// Everything a child needs, converted up front so that the child itself never allocates.
#[derive(Debug)]
pub struct ChildSpec {
    programs: Vec<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    cwds: Vec<CString>,
    uid: Uid,
    gid: Gid,
    groups: Vec<Gid>,
}

impl ChildSpec {
    /// Describes a child: `programs` are tried in order with `execve` (the caller's `PATH` search:
    /// a candidate that does not exist is skipped, like `execvp` does), `argv` and `env` (`KEY=VALUE`
    /// strings) are passed as they are, `cwds` are tried in order with `chdir` after the credentials
    /// change (so a home directory the user cannot enter falls back to the next one). Fails with
    /// `InvalidInput` if a string contains a NUL byte or `programs` is empty.
    pub fn new<P, A, E, C>(
        programs: &[P],
        argv: &[A],
        env: &[E],
        cwds: &[C],
        creds: &Credentials,
    ) -> io::Result<Self>
    where
        P: AsRef<OsStr>,
        A: AsRef<OsStr>,
        E: AsRef<OsStr>,
        C: AsRef<OsStr>,
    {
        fn convert<S: AsRef<OsStr>>(items: &[S]) -> io::Result<Vec<CString>> {
            items
                .iter()
                .map(|s| {
                    CString::new(s.as_ref().as_bytes()).map_err(|_| {
                        io::Error::new(io::ErrorKind::InvalidInput, "string contains a NUL byte")
                    })
                })
                .collect()
        }
        let programs = convert(programs)?;
        if programs.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no program to execute",
            ));
        }
        Ok(Self {
            programs,
            argv: convert(argv)?,
            env: convert(env)?,
            cwds: convert(cwds)?,
            uid: Uid::from_raw(creds.uid),
            gid: Gid::from_raw(creds.gid),
            groups: creds.groups.iter().map(|g| Gid::from_raw(*g)).collect(),
        })
    }
}

/// The descriptors a child gets as 0, 1 and 2, and optionally its controlling terminal.
#[derive(Debug, Clone, Copy)]
pub struct ChildStdio<'a> {
    /// Becomes descriptor 0.
    pub stdin: BorrowedFd<'a>,
    /// Becomes descriptor 1.
    pub stdout: BorrowedFd<'a>,
    /// Becomes descriptor 2.
    pub stderr: BorrowedFd<'a>,
    /// A PTY slave to make the controlling terminal of the child's new session.
    pub terminal: Option<BorrowedFd<'a>>,
}

/// The step of [`spawn_child`] that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnStage {
    /// Creating the report pipe or forking.
    Fork,
    /// `setsid` in the child.
    Setsid,
    /// `TIOCSCTTY` on the terminal.
    ControllingTerminal,
    /// Installing descriptors 0-2 or marking the rest close-on-exec.
    Stdio,
    /// Emptying the capability bounding set (needs `CAP_SETPCAP`, so it runs before the uid change).
    DropBoundingSet,
    /// `setgroups`.
    SetGroups,
    /// `setresgid`.
    SetGid,
    /// `setresuid`.
    SetUid,
    /// Clearing the remaining capability sets (`caps::drop_all_capabilities`), after the uid change.
    DropCapabilities,
    /// Changing to the working directory.
    Chdir,
    /// `execve` of every candidate program.
    Exec,
    /// Waiting for the child's report (it did not reach `execve` in time, or the report was cut).
    Report,
}

impl SpawnStage {
    const ALL: [SpawnStage; 12] = [
        Self::Fork,
        Self::Setsid,
        Self::ControllingTerminal,
        Self::Stdio,
        Self::DropBoundingSet,
        Self::SetGroups,
        Self::SetGid,
        Self::SetUid,
        Self::DropCapabilities,
        Self::Chdir,
        Self::Exec,
        Self::Report,
    ];

    fn code(self) -> u32 {
        Self::ALL.iter().position(|s| *s == self).unwrap_or(0) as u32
    }

    fn from_code(code: u32) -> Self {
        Self::ALL.get(code as usize).copied().unwrap_or(Self::Report)
    }
}

impl fmt::Display for SpawnStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Fork => "fork",
            Self::Setsid => "setsid",
            Self::ControllingTerminal => "set the controlling terminal",
            Self::Stdio => "set up stdin/stdout/stderr",
            Self::DropBoundingSet => "drop the capability bounding set",
            Self::SetGroups => "setgroups",
            Self::SetGid => "setresgid",
            Self::SetUid => "setresuid",
            Self::DropCapabilities => "drop all capabilities after the uid change",
            Self::Chdir => "change to the working directory",
            Self::Exec => "execute the program",
            Self::Report => "receive the child's exec report",
        })
    }
}

/// Why [`spawn_child`] failed: the step and the system error.
#[derive(Debug, thiserror::Error)]
#[error("failed to {stage} while starting a child process")]
pub struct SpawnError {
    /// The failing step.
    pub stage: SpawnStage,
    /// The error of that step.
    #[source]
    pub source: io::Error,
}

impl SpawnError {
    fn new(stage: SpawnStage, source: impl Into<io::Error>) -> Self {
        Self {
            stage,
            source: source.into(),
        }
    }
}

/// Starts a child and returns its pid once it has successfully called `execve`.
///
/// In the child, in this order: the signals the caller ignores back to their default (caught ones are
/// reset by `execve` itself); `setsid`; `TIOCSCTTY` on
/// `stdio.terminal` if given; descriptors 0-2 installed and every other descriptor marked
/// close-on-exec (`close_range`), so nothing of the agent (its listening socket included) leaks;
/// the caller's bounding set dropped while still privileged; `setgroups`, `setresgid`, `setresuid`; every
/// remaining capability cleared; `chdir`; signal mask emptied; `execve` of each candidate. The first
/// failure is written to a close-on-exec pipe and the child exits 127 without running anything.
///
/// The child is reaped by the caller's reaper ([`reap_one`](super::reap_one)) in every case,
/// including failure.
pub fn spawn_child(spec: &ChildSpec, stdio: ChildStdio<'_>) -> Result<u32, SpawnError> {
    let argv = null_terminated(&spec.argv);
    let envp = null_terminated(&spec.env);
    let (report_read, report_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SpawnError::new(SpawnStage::Fork, e))?;
    let inherited = inherited_state().map_err(|e| SpawnError::new(SpawnStage::DropBoundingSet, e))?;
    let args = ChildArgs {
        spec,
        argv: &argv,
        envp: &envp,
        stdio,
        report: report_write.as_fd(),
        inherited,
    };
    // The child runs on a stack of its own while it shares this address space (`CLONE_VM`) until
    // its exec: no page tables are copied and nothing here is copied on write afterwards, which is
    // most of what a fork of a process costs. Allocated before the clone, freed after the parent
    // resumes (`CLONE_VFORK` suspends it until the child has exec'd or exited).
    let mut stack = vec![0u8; CHILD_STACK_SIZE];

    // Block every signal across the clone so the child never runs one of the parent's handlers (on
    // shared memory) before it has reset them; the parent restores its mask right after.
    let mut saved = SigSet::empty();
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), Some(&mut saved))
        .map_err(|e| SpawnError::new(SpawnStage::Fork, e))?;
    // SAFETY: the stack pointer is the 16-byte-aligned top of `stack`, a live allocation that outlives
    // the child's use of it (CLONE_VFORK: this thread resumes only after the child exec'd or exited,
    // and `stack` is dropped after that). `child_main` receives a pointer to `args`, alive on this
    // frame for the same reason. The child only performs raw system calls on memory prepared above
    // and never allocates, takes locks or returns (it ends in execve or _exit), so sharing this
    // address space is sound, like posix_spawn's own clone; its copy of the signal handlers cannot
    // run because every signal is blocked until it has reset them.
    let pid = unsafe {
        let top = stack.as_mut_ptr().add(CHILD_STACK_SIZE);
        let top = top.sub(top as usize % 16);
        libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            std::ptr::from_ref(&args).cast_mut().cast(),
        )
    };
    let clone_error = (pid < 0).then(io::Error::last_os_error);
    // Restoring the old mask of this thread cannot fail with a valid `how`.
    let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&saved), None);
    drop(stack);
    if let Some(err) = clone_error {
        return Err(SpawnError::new(SpawnStage::Fork, err));
    }
    drop(report_write);
    let pid = pid as u32;
    match read_report(&report_read) {
        Ok(None) => Ok(pid),
        Ok(Some((stage, errno))) => Err(SpawnError::new(stage, io::Error::from_raw_os_error(errno))),
        Err(err) => {
            // The child is stuck before exec (or the report is garbage): make sure it never runs.
            let _ = send_signal(pid, libc::SIGKILL);
            Err(SpawnError::new(SpawnStage::Report, err))
        }
    }
}

/// The child's stack: the steps of `run_child` need a few KiB.
const CHILD_STACK_SIZE: usize = 64 * 1024;

/// What the caller's process passes on that the child must undo: the signals it ignores (an exec
/// keeps them ignored) and its bounding set. Read once: a process that spawns children this way is
/// not expected to change either afterwards (the agent never does), and reading them costs a hundred
/// system calls.
#[derive(Debug, Clone, Copy)]
struct Inherited {
    ignored_signals: u64,
    bounding_set: u64,
}

/// Reads what [`spawn_child`] reads once per process (the ignored signals and the bounding set,
/// about a hundred system calls), so the first spawn does not pay for it. Idempotent.
pub fn prepare_spawns() -> io::Result<()> {
    inherited_state().map(|_| ())
}

fn inherited_state() -> io::Result<Inherited> {
    static STATE: std::sync::OnceLock<Inherited> = std::sync::OnceLock::new();
    if let Some(state) = STATE.get() {
        return Ok(*state);
    }
    let state = Inherited {
        ignored_signals: crate::exec::ignored_signals(),
        bounding_set: crate::caps::bounding_set()?,
    };
    Ok(*STATE.get_or_init(|| state))
}

/// Everything the child needs, prepared by the parent.
struct ChildArgs<'a> {
    spec: &'a ChildSpec,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    stdio: ChildStdio<'a>,
    report: BorrowedFd<'a>,
    inherited: Inherited,
}

extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the pointer to the `ChildArgs` that `spawn_child` passed to clone; it stays
    // alive and unmodified until this child has exec'd or exited (CLONE_VFORK).
    let args = unsafe { &*arg.cast::<ChildArgs<'_>>() };
    run_child(args)
}

/// Pointers to the strings followed by a null pointer, as `execve` wants them.
fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Waits (with a deadline) for the child's report: end of file means it exec'd; 8 bytes are a
/// failing stage and errno.
fn read_report(fd: &OwnedFd) -> io::Result<Option<(SpawnStage, i32)>> {
    let deadline = Instant::now() + EXEC_REPORT_TIMEOUT;
    let mut buf = [0u8; 8];
    let mut filled = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "child did not reach execve in time",
            ));
        }
        let timeout = nix::poll::PollTimeout::try_from(left).unwrap_or(nix::poll::PollTimeout::MAX);
        let mut fds = [nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, timeout) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(err) => return Err(err.into()),
        }
        match rustix::io::read(fd, &mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(None),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "truncated exec report",
                ))
            }
            Ok(n) => {
                filled += n;
                if filled == buf.len() {
                    let stage = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
                    let errno = i32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]);
                    return Ok(Some((SpawnStage::from_code(stage), errno)));
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    }
}

/// The child side of [`spawn_child`]. Only async-signal-safe system calls; never returns.
fn run_child(args: &ChildArgs<'_>) -> ! {
    let ChildArgs {
        spec,
        argv,
        envp,
        stdio,
        report,
        inherited,
    } = *args;
    let fail = |stage: SpawnStage, errno: i32| -> ! {
        let mut msg = [0u8; 8];
        msg[..4].copy_from_slice(&stage.code().to_le_bytes());
        msg[4..].copy_from_slice(&errno.to_le_bytes());
        let _ = rustix::io::write(report, &msg);
        // SAFETY: _exit ends the process at once without running atexit handlers or flushing stdio
        // buffers that belong to the parent's address space.
        unsafe { libc::_exit(127) }
    };
    let errno_of = |e: io::Error| e.raw_os_error().unwrap_or(libc::EIO);

    crate::exec::reset_signals(inherited.ignored_signals);
    if let Err(e) = rustix::process::setsid() {
        fail(SpawnStage::Setsid, e.raw_os_error());
    }
    if let Some(terminal) = stdio.terminal {
        if let Err(e) = crate::pty::set_controlling_terminal(terminal) {
            fail(SpawnStage::ControllingTerminal, errno_of(e));
        }
    }
    if let Err(errno) = install_stdio(&stdio) {
        fail(SpawnStage::Stdio, errno);
    }
    if let Err(e) = crate::caps::drop_bounding_set(inherited.bounding_set) {
        fail(SpawnStage::DropBoundingSet, errno_of(e));
    }
    if let Err(e) = rustix::thread::set_thread_groups(&spec.groups) {
        fail(SpawnStage::SetGroups, e.raw_os_error());
    }
    if let Err(e) = rustix::thread::set_thread_res_gid(spec.gid, spec.gid, spec.gid) {
        fail(SpawnStage::SetGid, e.raw_os_error());
    }
    if let Err(e) = rustix::thread::set_thread_res_uid(spec.uid, spec.uid, spec.uid) {
        fail(SpawnStage::SetUid, e.raw_os_error());
    }
    if let Err(e) = crate::caps::clear_capability_sets() {
        fail(SpawnStage::DropCapabilities, errno_of(e));
    }
    let mut chdir_errno = 0;
    for cwd in &spec.cwds {
        match rustix::process::chdir(cwd.as_c_str()) {
            Ok(()) => {
                chdir_errno = 0;
                break;
            }
            Err(e) if chdir_errno == 0 => chdir_errno = e.raw_os_error(),
            Err(_) => {}
        }
    }
    if chdir_errno != 0 {
        fail(SpawnStage::Chdir, chdir_errno);
    }
    // Exec keeps the signal mask; the program starts with nothing blocked.
    let _ = crate::exec::unblock_all_signals();
    let mut exec_errno = libc::ENOENT;
    let mut saw_eacces = false;
    for program in &spec.programs {
        // SAFETY: `program` is a NUL-terminated string, `argv` and `envp` are null-terminated arrays
        // of pointers into CStrings of `spec`, all alive for the duration of the call.
        unsafe { libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        exec_errno = io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO);
        match exec_errno {
            // Like execvp: keep searching past candidates that do not exist or are not permitted.
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            libc::EACCES => saw_eacces = true,
            _ => break,
        }
    }
    if saw_eacces && exec_errno == libc::ENOENT {
        exec_errno = libc::EACCES;
    }
    fail(SpawnStage::Exec, exec_errno)
}

/// Moves the three stdio descriptors to 0, 1, 2 (via temporary high copies, so a source that is
/// itself 0-2 cannot be clobbered) and marks every descriptor from 3 up close-on-exec.
fn install_stdio(stdio: &ChildStdio<'_>) -> Result<(), i32> {
    let sources = [stdio.stdin, stdio.stdout, stdio.stderr];
    let mut copies: [Option<OwnedFd>; 3] = [None, None, None];
    for (copy, source) in copies.iter_mut().zip(sources) {
        *copy = Some(rustix::io::fcntl_dupfd_cloexec(source, 3).map_err(|e| e.raw_os_error())?);
    }
    for (target, copy) in copies.iter().enumerate() {
        let Some(copy) = copy else { continue };
        // SAFETY: dup2 only changes the descriptor table; `copy` is open, and replacing whatever 0-2
        // held is the purpose (the child owns nothing there that Rust code still uses).
        if unsafe { libc::dup2(copy.as_raw_fd(), target as libc::c_int) } < 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
        }
    }
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC closes nothing; it only sets the close-on-exec flag
    // on descriptors 3 and up.
    let r = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::wait_nohang;
    use super::*;
    use crate::reap::{ChildExit, Reaped};

    fn wait_for(pid: u32) -> Reaped {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // Waits for this pid only: other tests of this binary have children of their own.
            if let Some(r) = wait_nohang(pid as libc::pid_t).expect("wait4") {
                return r;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("child {pid} did not exit in time");
    }

    fn own_credentials() -> Credentials {
        Credentials {
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            groups: vec![rustix::process::getgid().as_raw()],
        }
    }

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// Stdin, stdout and stderr all on `null` (an open `/dev/null`), and no terminal.
    fn null_stdio(null: &std::fs::File) -> ChildStdio<'_> {
        ChildStdio {
            stdin: null.as_fd(),
            stdout: null.as_fd(),
            stderr: null.as_fd(),
            terminal: None,
        }
    }

    #[test]
    fn exec_failure_is_reported_not_exited() {
        if !is_root() {
            eprintln!("SKIPPED: spawn_child drops capabilities and switches ids (run as root)");
            return;
        }
        let null = std::fs::File::open("/dev/null").expect("/dev/null");
        let stdio = null_stdio(&null);
        let spec = ChildSpec::new(
            &["/nonexistent/prog"],
            &["prog"],
            &[] as &[&str],
            &["/"],
            &own_credentials(),
        )
        .expect("spec");
        let err = spawn_child(&spec, stdio).expect_err("must fail");
        assert_eq!(err.stage, SpawnStage::Exec);
        assert_eq!(err.source.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn runs_program_with_exit_code_and_usage() {
        if !is_root() {
            eprintln!("SKIPPED: spawn_child drops capabilities and switches ids (run as root)");
            return;
        }
        let null = std::fs::File::open("/dev/null").expect("/dev/null");
        let stdio = null_stdio(&null);
        let spec = ChildSpec::new(
            &["/nonexistent/sh", "/bin/sh"],
            &["sh", "-c", "exit 7"],
            &["PATH=/bin"],
            &["/nonexistent", "/"],
            &own_credentials(),
        )
        .expect("spec");
        let pid = spawn_child(&spec, stdio).expect("spawn");
        let reaped = wait_for(pid);
        assert_eq!(reaped.exit, ChildExit::Code(7));
    }

    #[test]
    fn stage_codes_round_trip() {
        for stage in SpawnStage::ALL {
            assert_eq!(SpawnStage::from_code(stage.code()), stage);
        }
    }
}
