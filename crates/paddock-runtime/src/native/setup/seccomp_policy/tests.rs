//! The sandbox policy's meaning (`decide`), its compiled program against `decide` and the program's
//! cost, and the installed filter under ordinary programs.

use std::collections::BTreeSet;
use std::process::Command;

use paddock_sys::seccomp::verify::{self, compile_checked, run, with_arg, Rng, Run, X32};
use paddock_sys::seccomp::{compile, decide, Decision, RuleAction};
use serde::Serialize;

use super::*;

const ENOTTY: u32 = libc::ENOTTY as u32;
const SIGCHLD: u64 = libc::SIGCHLD as u64;
const NEWUSER: u64 = libc::CLONE_NEWUSER as u64;
const NEWNET: u64 = libc::CLONE_NEWNET as u64;
const TCGETS: u64 = libc::TCGETS;
const TIOCSTI: u64 = libc::TIOCSTI;
const TIOCLINUX: u64 = libc::TIOCLINUX;
/// `BTRFS_IOC_SUBVOL_CREATE`: `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)` (4096 bytes).
const BTRFS_IOC_SUBVOL_CREATE: u64 = 0x5000_940e;
/// `BTRFS_IOC_SNAP_CREATE_V2`: `_IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)` (4096 bytes).
const BTRFS_IOC_SNAP_CREATE_V2: u64 = 0x5000_9417;
/// `BTRFS_IOC_TREE_SEARCH`: `_IOWR(0x94, 17, struct btrfs_ioctl_search_args)` (4096 bytes).
const BTRFS_IOC_TREE_SEARCH: u64 = 0xd000_9411;
const NO_ASLR: u64 = libc::ADDR_NO_RANDOMIZE as u64;
const AF_INET6: u64 = libc::AF_INET6 as u64;
const AF_PACKET: u64 = libc::AF_PACKET as u64;

#[test]
fn decides_like_the_brief() {
    let policy = default_policy();
    let thread = (libc::CLONE_VM | libc::CLONE_FS | libc::CLONE_FILES | libc::CLONE_SIGHAND) as u64
        | (libc::CLONE_THREAD | libc::CLONE_SYSVSEM | libc::CLONE_SETTLS) as u64
        | (libc::CLONE_PARENT_SETTID | libc::CLONE_CHILD_CLEARTID) as u64;
    let (allow, eperm) = (Decision::Allow, Decision::Errno(EPERM));
    let (enotty, enosys) = (Decision::Errno(ENOTTY), Decision::Errno(ENOSYS));
    let cases = [
        (libc::SYS_getpid, 0, 0, allow),
        (libc::SYS_unshare, 0, NEWUSER, eperm),
        (libc::SYS_clone, 0, NEWUSER | SIGCHLD, eperm),
        (libc::SYS_clone, 0, NEWNET, eperm),
        (libc::SYS_clone, 0, SIGCHLD, allow),
        (libc::SYS_clone, 0, thread, allow),
        (libc::SYS_clone3, 0, 0, Decision::Errno(ENOSYS)),
        (libc::SYS_ioctl, 1, TIOCSTI, enotty),
        (libc::SYS_ioctl, 1, 0xdead_0000_0000 | TIOCSTI, enotty),
        (libc::SYS_ioctl, 1, TIOCLINUX, enotty),
        (libc::SYS_ioctl, 1, TCGETS, allow),
        (libc::SYS_ioctl, 1, 0xdead_0000_0000 | TCGETS, allow),
        (libc::SYS_ioctl, 1, libc::TIOCGPTPEER, allow),
        (libc::SYS_ioctl, 1, libc::FICLONE, allow),
        (libc::SYS_ioctl, 1, BTRFS_IOC_SUBVOL_CREATE, enotty),
        (libc::SYS_ioctl, 1, BTRFS_IOC_SNAP_CREATE_V2, enotty),
        (libc::SYS_ioctl, 1, BTRFS_IOC_TREE_SEARCH, enotty),
        (libc::SYS_ioctl, 1, 0, enotty),
        (libc::SYS_io_setup, 0, 0, enosys),
        (libc::SYS_io_submit, 0, 0, enosys),
        (libc::SYS_io_uring_setup, 0, 0, eperm),
        (libc::SYS_personality, 0, 0xffff_ffff, allow),
        (libc::SYS_personality, 0, NO_ASLR, eperm),
        (libc::SYS_socket, 0, AF_INET6, allow),
        (libc::SYS_socket, 0, AF_PACKET, Decision::Errno(EAFNOSUPPORT)),
        (999, 0, 0, Decision::Errno(policy.default_errno)),
        (
            X32 | libc::SYS_getpid,
            0,
            0,
            Decision::Errno(policy.default_errno),
        ),
    ];
    for (nr, index, value, want) in cases {
        assert_eq!(
            decide(&policy, nr, with_arg(index, value)),
            want,
            "syscall {nr} arg{index}={value:#x}"
        );
    }
}

#[test]
fn default_policy_refuses_the_dangerous_calls() {
    let policy = default_policy();
    let refused = "io_uring_setup io_uring_enter io_uring_register userfaultfd bpf perf_event_open keyctl \
        add_key request_key kexec_load kexec_file_load init_module finit_module delete_module \
        open_by_handle_at name_to_handle_at mount umount2 pivot_root move_mount open_tree fsopen fsmount \
        fsconfig fspick mount_setattr unshare setns swapon swapoff reboot acct quotactl lookup_dcookie iopl \
        ioperm clock_settime settimeofday adjtimex clock_adjtime syslog nfsservctl";
    for name in refused.split_whitespace() {
        let rule = policy.rules.iter().find(|rule| rule.name == name);
        let rule = rule.unwrap_or_else(|| panic!("no rule for {name}"));
        assert_eq!(decide(&policy, rule.nr, [0; 6]), Decision::Errno(EPERM), "{name}");
    }
}

#[test]
fn default_policy_is_well_formed() {
    fn assert_serialize<T: Serialize>(_: &T) {}
    let policy = default_policy();
    assert_serialize(&policy);
    let mut seen = BTreeSet::new();
    for rule in &policy.rules {
        assert!(seen.insert(rule.nr), "duplicate rule for {}", rule.name);
        assert!(
            !rule.reason.is_empty() && !rule.name.starts_with("SYS_"),
            "{rule:?}"
        );
    }
    assert!(
        policy.rules.len() > 250,
        "an allowlist of what ordinary programs need"
    );
}

#[test]
fn compiled_default_policy_matches_decide() {
    let policy = default_policy();
    let compiled = compile(&policy).expect("compile");
    assert_eq!(compiled.programs().len(), 1, "one program for every action");
    assert!(compiled
        .programs()
        .iter()
        .all(|p| p.len() < verify::MAX_INSTRUCTIONS));
    verify::assert_compiled_matches_decide(&policy);
}

/// The property test of the default policy, over rule-specific and random (number, arguments).
#[test]
fn default_policy_agrees_with_decide_on_random_calls() {
    let policy = default_policy();
    verify::assert_agrees_on_each_rule(&policy);
    verify::assert_agrees_on_random_calls(&policy, &mut Rng(1), 300_000);
}

/// The number of instructions a number without an argument check runs (nearly every call a
/// sandbox makes; the kernel also skips the filter for those it always allows), and whether the
/// kernel can tell that those it allows are always allowed.
#[test]
fn default_policy_paths_are_short_and_cacheable() {
    let policy = default_policy();
    let compiled = compile_checked(&policy);
    let program = &compiled.programs()[0];
    let mut longest = 0;
    let numbers = (0..=1024).chain([X32 - 1, X32, X32 | libc::SYS_getpid, i64::from(u32::MAX)]);
    for nr in numbers {
        let rule = policy.rules.iter().find(|rule| rule.nr == nr);
        let checks_args =
            rule.is_some_and(|rule| !matches!(rule.action, RuleAction::Allow | RuleAction::Errno(_)));
        let Run {
            action,
            steps,
            read_args,
        } = run(program, nr as u32, verify::AUDIT_ARCH_X86_64, [0; 6]);
        if checks_args {
            assert!(read_args, "{nr}");
            continue;
        }
        assert!(!read_args, "syscall {nr} reads an argument");
        longest = longest.max(steps);
        let always_allowed = rule.is_some_and(|rule| rule.action == RuleAction::Allow);
        assert_eq!(action == libc::SECCOMP_RET_ALLOW, always_allowed, "syscall {nr}");
    }
    eprintln!("longest path: {longest} instructions of {}", program.len());
    assert!(longest <= 32, "longest path {longest}");
    assert!(program.len() <= verify::MAX_INSTRUCTIONS);
}

/// The calls that look at an argument (the ioctl allowlist above all, which every terminal,
/// socket and file program calls often) stay short too, and so does the whole program.
#[test]
fn default_policy_argument_paths_are_short() {
    let policy = default_policy();
    let compiled = compile_checked(&policy);
    let program = &compiled.programs()[0];
    let mut longest = (0, 0, 0);
    for rule in &policy.rules {
        let (arg, values) = match &rule.action {
            RuleAction::AllowUnlessArgEquals { arg, values, .. }
            | RuleAction::AllowIfArgEquals { arg, values, .. } => (*arg, values.clone()),
            RuleAction::AllowUnlessArgMasked { arg, mask, .. } => (*arg, vec![*mask, 0]),
            RuleAction::Allow | RuleAction::Errno(_) => continue,
        };
        let probes = values
            .iter()
            .flat_map(|&v| [v, v.wrapping_add(1), v.wrapping_sub(1)])
            .chain([0, u64::from(u32::MAX)]);
        for value in probes {
            let run = run(
                program,
                rule.nr as u32,
                verify::AUDIT_ARCH_X86_64,
                with_arg(usize::from(arg), value),
            );
            longest = longest.max((run.steps, rule.nr, value));
        }
    }
    let (steps, nr, value) = longest;
    eprintln!(
        "longest argument path: {steps} instructions (syscall {nr}, value {value:#x}) of {}",
        program.len()
    );
    assert!(
        steps <= 32,
        "syscall {nr} with {value:#x} runs {steps} instructions"
    );
    assert!(program.len() <= 400, "{} instructions", program.len());
}

/// Set in the environment of the child test process; its value is the test to run there. A seccomp
/// filter is irreversible, so the test installs it in a fresh process: this test binary run again
/// on that one test.
const CHILD_ENV: &str = "PADDOCK_RUNTIME_SECCOMP_CHILD";

/// The default policy installed for real: ordinary programs work under it (fork and exec with
/// glibc's fallback from `clone3` to `clone`, pipes, threads, sockets, a compiler and git), and what
/// it refuses fails as `decide` says. (Refusals of calls that have no safe wrapper are tried with
/// raw system calls by the mechanism's tests in `paddock-sys` and inside real sandboxes by
/// `crates/paddock/tests/isolation.rs`.)
#[test]
fn installed_default_policy_in_child() {
    let name = "native::setup::seccomp_policy::tests::installed_default_policy_in_child";
    if std::env::var(CHILD_ENV).is_ok_and(|v| v == name) {
        child_installed_default_policy();
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, name)
        .output()
        .expect("run child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child test {name} failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    eprint!("{stderr}");
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

fn child_installed_default_policy() {
    paddock_sys::seccomp::install(&default_policy()).expect("install");

    let packet = rustix::net::socket(
        rustix::net::AddressFamily::PACKET,
        rustix::net::SocketType::RAW,
        None,
    );
    assert_eq!(packet.err(), Some(rustix::io::Errno::AFNOSUPPORT));
    let inet6 = rustix::net::socket(
        rustix::net::AddressFamily::INET6,
        rustix::net::SocketType::STREAM,
        None,
    );
    assert!(inet6.is_ok(), "{inet6:?}");

    let script = "echo piped | cat; ls / > /dev/null && echo ok";
    let sh = run_program("/bin/sh", &["-c", script]).expect("sh");
    assert!(sh.contains("piped") && sh.contains("ok"), "{sh}");
    // A new user namespace is refused, as unshare(1) sees it (when it is installed).
    if let Some(out) = run_program("/bin/sh", &["-c", "unshare -U true 2>&1; echo status=$?"]) {
        if !out.contains("not found") {
            assert!(!out.contains("status=0"), "unshare -U ran: {out}");
        }
    }
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
