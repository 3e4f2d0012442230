//! Seccomp: the mechanism that turns a system-call policy into one classic-BPF program and installs
//! it, and the pure decision function that says what a policy means.
//!
//! A [`SeccompPolicy`] is data: a rule per system call number (allow, refuse with an errno, or allow
//! depending on one argument, by mask or by a list of values), one reason each, and a default errno.
//! [`decide`] is what a policy means; [`compile`] must agree with it, and unit tests run the compiled
//! BPF through an interpreter, for every system call number and for random policies and arguments,
//! to check that (`verify.rs`, also offered to other crates' tests with the `test-support` feature).
//!
//! Which rules a sandbox gets is policy, and lives with the setup that installs it:
//! `paddock-runtime`'s `native/setup/seccomp_policy.rs` (the allowlist) and its `ioctls.rs` (the
//! `ioctl` request allowlist). The tests here use sample policies of their own (`samples.rs`).
//!
//! # Why the BPF is written by hand
//!
//! Installing the filter is on the critical path of every sandbox start (a budget of about 5 ms), and
//! its cost is in the kernel at attach time, not in running it: `seccomp_cache_prepare` emulates the
//! filter for every system call number to find those it always allows, and the kernel converts the
//! classic BPF to eBPF and JITs it. seccompiler lays rules out as a linear chain and can return only
//! one action on a match, so the default policy became three stacked filters of 1,944 instructions in
//! all (1,576 + 337 + 31), where emulating one number walked hundreds of instructions: `apply` took
//! about 830 µs and `compile` about 140 µs (release build, fresh process, on the development VM).
//!
//! [`compile`] instead writes one program that returns every action itself and finds a number's
//! action by binary search over runs of numbers treated alike (the layout is described in
//! `compile.rs`). The sandbox's default policy is now 200 instructions (102 before the ioctl
//! allowlist, whose values get a binary search of their own); a call whose rule looks at no argument
//! reaches its return within 12 instructions, one that looks at an argument within 19 (its tests keep
//! both under 32).
//! Before the ioctl allowlist, `apply` took about 48 µs (release build, fresh process, on the
//! development VM), close to the 25 to 50 µs that attaching even an 8-instruction filter costs
//! there, and `compile` about 28 µs (8 µs when warm). The longer program costs attach time: on a
//! loaded 2-core host (debug build, fresh process, median of 40) `apply` took 139-160 µs with the
//! allowlist against 94-108 µs without it.
//!
//! What this module does not do: the filter is for x86_64 (the only architecture paddock builds
//! for); a process of another architecture (e.g. 32-bit x86 binaries) is killed by the architecture
//! check, and x32 system calls get the default errno.

mod bpf;
mod compile;
#[cfg(any(test, feature = "test-support"))]
mod interpret;
mod policy;
#[cfg(test)]
mod samples;
#[cfg(any(test, feature = "test-support"))]
pub mod verify;

use seccompiler::{BackendError, BpfProgram};

pub use compile::compile;
pub use policy::{decide, Decision, RuleAction, SeccompPolicy, SyscallRule};

/// Why a policy could not be compiled or installed.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// Two rules name the same system call number.
    #[error("duplicate seccomp rule for system call {name} ({nr})")]
    DuplicateRule {
        /// The second rule's name.
        name: &'static str,
        /// The number.
        nr: i64,
    },
    /// A rule's number is not an x86_64 system call number (from 0 up to, not including, the x32
    /// bit `0x4000_0000`), so the filter could not tell it apart as the policy means.
    #[error("system call number {nr} of the seccomp rule for {name} is out of range")]
    InvalidNumber {
        /// The rule's name.
        name: &'static str,
        /// The number.
        nr: i64,
    },
    /// An errno above 4095 cannot be returned by a filter.
    #[error("errno {errno} of the seccomp rule for {name} is out of range")]
    InvalidErrno {
        /// The rule's name (or "default").
        name: &'static str,
        /// The errno.
        errno: u32,
    },
    /// A rule's condition names no argument (an index above 5).
    #[error("invalid seccomp rule for system call {name}")]
    Rule {
        /// The rule's name.
        name: &'static str,
        /// What is wrong, in seccompiler's terms (`InvalidArgumentNumber`).
        #[source]
        source: BackendError,
    },
    /// The policy needs more instructions than the kernel accepts in a filter (4096).
    #[error("failed to compile seccomp filter {index}")]
    Compile {
        /// Index of the filter in the compiled set (always 0: there is one).
        index: usize,
        /// What is wrong, in seccompiler's terms (`FilterTooLarge`).
        #[source]
        source: BackendError,
    },
    /// `prctl(PR_SET_NO_NEW_PRIVS)` or `seccomp(SECCOMP_SET_MODE_FILTER)` failed.
    #[error("failed to install seccomp filter {index}")]
    Install {
        /// Index of the filter in the compiled set.
        index: usize,
        /// seccompiler's error, wrapping the system call's.
        #[source]
        source: seccompiler::Error,
    },
}

/// A policy compiled to BPF, ready to [`apply`] (for example after `fork`, where compiling is not
/// allowed because it allocates).
///
/// [`compile`] produces a single program, which returns every action of the policy itself. The type
/// keeps a list so that callers written for a stack of filters need no change.
#[derive(Debug, Clone)]
pub struct CompiledSeccomp {
    programs: Vec<BpfProgram>,
}

impl CompiledSeccomp {
    /// The BPF programs in installation order (one).
    pub fn programs(&self) -> &[BpfProgram] {
        &self.programs
    }
}

/// Installs an already-compiled filter on the calling thread (seccompiler's `apply_filter` sets
/// `no_new_privs` first, as the kernel requires without `CAP_SYS_ADMIN`, then calls
/// `seccomp(SECCOMP_SET_MODE_FILTER)`). Irreversible; inherited by every process and thread created
/// afterwards. Allocates nothing: usable in a `pre_exec` closure after `fork`.
pub fn apply(compiled: &CompiledSeccomp) -> Result<(), SeccompError> {
    for (index, program) in compiled.programs.iter().enumerate() {
        seccompiler::apply_filter(program).map_err(|source| SeccompError::Install { index, source })?;
    }
    Ok(())
}

/// Compiles `policy` and installs it on the calling thread ([`compile`] then [`apply`]).
pub fn install(policy: &SeccompPolicy) -> Result<(), SeccompError> {
    apply(&compile(policy)?)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::samples::*;
    use super::*;
    use crate::child_test::{in_child, run_in_child};

    /// Set in the environment of a child test process; its value is the test to run there. Seccomp
    /// filters are irreversible, so those tests run in a fresh process (see [`crate::child_test`]).
    const CHILD_ENV: &str = "PADDOCK_SYS_SECCOMP_CHILD";

    #[test]
    fn installed_policy_in_child() {
        let name = "seccomp::tests::installed_policy_in_child";
        if in_child(CHILD_ENV, name) {
            child_installed_policy();
        } else {
            run_in_child(CHILD_ENV, name);
        }
    }

    #[test]
    fn installed_large_policy_in_child() {
        let name = "seccomp::tests::installed_large_policy_in_child";
        if in_child(CHILD_ENV, name) {
            child_installed_large_policy();
        } else {
            run_in_child(CHILD_ENV, name);
        }
    }

    /// Makes a raw system call and returns its errno, read right away (`None` on success).
    ///
    /// # Safety
    ///
    /// Each argument must be an integer, null, or the address of live memory of the type the system
    /// call expects there.
    unsafe fn raw_errno(nr: i64, args: [i64; 5]) -> Option<u32> {
        // SAFETY: the caller vouches for the arguments.
        let result = unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4]) };
        (result == -1).then(|| std::io::Error::last_os_error().raw_os_error().unwrap_or_default() as u32)
    }

    /// Runs `program` with `args` under the filter; `None` when it is not installed.
    fn run_program(program: &str, args: &[&str]) -> Option<String> {
        let out = Command::new(program).args(args).output().ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{program} {args:?} failed under the filter: {}\n{text}",
            out.status
        );
        Some(text)
    }

    /// The body of `installed_policy_in_child`, run in its child process: the sample policy, installed,
    /// does what `decide` says for raw system calls of each kind of rule, and ordinary programs run
    /// under it (the sandbox's own policy is tried so in `paddock-runtime`).
    fn child_installed_policy() {
        assert!(
            std::env::var_os(CHILD_ENV).is_some(),
            "run through installed_policy_in_child"
        );
        install(&sample_policy()).expect("install");

        assert!(rustix::process::getpid().as_raw_nonzero().get() > 0);
        let unshared = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER);
        assert_eq!(unshared, Err(nix::errno::Errno::EPERM));
        let devnull = std::fs::File::open("/dev/null").expect("open /dev/null");
        let fd = i64::from(std::os::fd::AsRawFd::as_raw_fd(&devnull));
        let byte = b'x';
        let byte_ptr = std::ptr::from_ref(&byte) as i64;
        let clone_flags = i64::from(libc::CLONE_NEWUSER | libc::CLONE_FS | libc::SIGCHLD);
        let (tiocsti, tcgets, fithaw) = (TIOCSTI as i64, TCGETS as i64, FITHAW as i64);
        // `_IO(0x00, 2)`, from linux/fs.h.
        const FIGETBSZ: i64 = 2;
        const EFAULT: u32 = libc::EFAULT as u32;
        let (af_packet, sock_raw) = (AF_PACKET as i64, i64::from(libc::SOCK_RAW));
        // Each call's expected errno under the filter. Had the filter let it through, the kernel would
        // have refused it without acting (noted per call), so a broken filter changes nothing here.
        let calls = [
            (libc::SYS_io_uring_setup, [1, 0, 0, 0, 0], EPERM), // params NULL: EFAULT
            (libc::SYS_clone3, [0; 5], ENOSYS),                 // size 0: EINVAL
            (libc::SYS_clone, [clone_flags, 0, 0, 0, 0], EPERM), // NEWUSER with FS: EINVAL
            (libc::SYS_ioctl, [fd, tiocsti, byte_ptr, 0, 0], ENOTTY), // /dev/null: ENOTTY too
            (libc::SYS_ioctl, [fd, fithaw, 0, 0, 0], ENOTTY), // thaw a file system that is not frozen: EINVAL (EPERM unprivileged)
            (libc::SYS_ioctl, [fd, tcgets, 0, 0, 0], ENOTTY), // allowed: the kernel answers
            (libc::SYS_ioctl, [fd, FIGETBSZ, 0, 0, 0], EFAULT), // allowed: the kernel answers
            (libc::SYS_io_setup, [1, 0, 0, 0, 0], ENOSYS),    // ctxp NULL: EFAULT
            (libc::SYS_keyctl, [0; 5], EPERM),                // KEYCTL_GET_KEYRING_ID(0): EINVAL
            (libc::SYS_socket, [af_packet, sock_raw, 0, 0, 0], EAFNOSUPPORT), // would open a socket
            (libc::SYS_personality, [NO_ASLR as i64, 0, 0, 0, 0], EPERM), // would change it
            (999, [0; 5], ENOSYS),
            (X32 | libc::SYS_getpid, [0; 5], ENOSYS), // x32 getpid: harmless
        ];
        for (nr, args, want) in calls {
            // SAFETY: the arguments are integers, null, or the address of `byte`, which is live, as
            // each call expects (see the table above).
            let got = unsafe { raw_errno(nr, args) };
            assert_eq!(got, Some(want), "syscall {nr}");
        }

        // Ordinary programs still work under the inherited filter: fork/exec (glibc falls back from
        // clone3 to clone), pipes, threads, sockets, a compiler and git.
        let script = "echo piped | cat; ls / > /dev/null && echo ok";
        let sh = run_program("/bin/sh", &["-c", script]).expect("sh");
        assert!(sh.contains("piped") && sh.contains("ok"), "{sh}");
        let build = "cd \"$(mktemp -d)\" && git init -q && echo 'int main(void){return 0;}' > a.c \
            && gcc a.c -o a && ./a && git add a.c && echo build-ok; rm -rf \"$PWD\"";
        let (has_gcc, has_git) = (
            run_program("gcc", &["--version"]),
            run_program("git", &["--version"]),
        );
        if has_gcc.is_some() && has_git.is_some() {
            let out = run_program("/bin/sh", &["-c", build]).expect("sh");
            assert!(out.contains("build-ok"), "{out}");
        } else {
            eprintln!("SKIPPED part: gcc or git not installed");
        }
        let python = "import threading, subprocess, socket, tempfile, os\n\
            t = threading.Thread(target=lambda: None); t.start(); t.join()\n\
            a, b = socket.socketpair(); a.sendall(b'x'); assert b.recv(1) == b'x'\n\
            socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()\n\
            with tempfile.TemporaryDirectory() as d: open(os.path.join(d, 'f'), 'w').write('x')\n\
            print(subprocess.run(['echo', 'python-ok'], capture_output=True, text=True).stdout.strip())";
        match run_program("python3", &["-c", python]) {
            Some(out) => assert!(out.contains("python-ok"), "{out}"),
            None => eprintln!("SKIPPED part: python3 not installed"),
        }
        let node = "require('child_process').execSync('true'); require('fs').readdirSync('/'); \
            new Promise(r => setTimeout(r, 1)).then(() => console.log('node-ok'))";
        match run_program("node", &["-e", node]) {
            Some(out) => assert!(out.contains("node-ok"), "{out}"),
            None => eprintln!("SKIPPED part: node not installed"),
        }
    }

    /// [`large_policy`] needs stand-ins for far jumps and shares returns and checks only nearby; the
    /// kernel must accept that program and run it as the interpreter does. The body of
    /// `installed_large_policy_in_child`, run in its child process.
    fn child_installed_large_policy() {
        assert!(
            std::env::var_os(CHILD_ENV).is_some(),
            "run through installed_large_policy_in_child"
        );
        let policy = large_policy();
        let compiled = compile(&policy).expect("compile");
        assert!(
            compiled.programs()[0].len() > 1000,
            "large enough to need far jumps"
        );
        apply(&compiled).expect("install");

        assert!(rustix::process::getpid().as_raw_nonzero().get() > 0);
        // None of these numbers is a system call, so when the filter allows one the kernel says ENOSYS.
        let (listed, unlisted) = (3 * 77, 3 * 77 + 1);
        let calls = [
            (LARGE_LIST_NR, [0, 0, listed, 0, 0], ENOSYS),
            (LARGE_LIST_NR, [0, 0, 1 << 32 | listed, 0, 0], ENOSYS),
            (LARGE_LIST_NR, [0, 0, unlisted, 0, 0], EPERM),
            (LARGE_LIST_NR, [0, 0, 3 * 300, 0, 0], EPERM),
            (1050, [0, 0, 0, 1 << 33, 0], LARGE_MASKED_ERRNO),
            (1050, [0, 0, 0, 1, 0], LARGE_MASKED_ERRNO),
            (1050, [0, 0, 0, 2, 0], ENOSYS),
            (1003, [0; 5], large_errno(1003)),
            (1599, [0; 5], large_errno(1599)),
            (1600, [0; 5], ENOSYS),
            (libc::SYS_unshare, [0; 5], EPERM),
        ];
        for (nr, args, want) in calls {
            // SAFETY: none of these numbers takes a pointer (nor does unshare), so integers are fine.
            let got = unsafe { raw_errno(nr, args) };
            assert_eq!(got, Some(want), "syscall {nr} args {args:x?}");
        }
        let sh = run_program("/bin/sh", &["-c", "echo large-ok"]).expect("sh");
        assert!(sh.contains("large-ok"), "{sh}");
    }
}
