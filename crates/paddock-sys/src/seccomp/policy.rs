//! The shape of a policy (a list of rules, one reason per entry) and [`decide`], the pure function
//! that says what a policy means. [`compile`](super::compile) must agree with it.
//!
//! Which rules a sandbox gets is not decided here: the default policy is data of the setup that
//! installs it (`paddock-runtime`'s `native/setup/seccomp_policy.rs`).

use serde::Serialize;

/// A system-call policy: what happens to each listed system call, and the errno for the rest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeccompPolicy {
    /// Errno returned for system calls that no rule lists.
    pub default_errno: u32,
    /// At most one rule per system call number.
    pub rules: Vec<SyscallRule>,
}

/// What the policy does with one system call, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SyscallRule {
    /// The system call's name (without `SYS_`).
    pub name: &'static str,
    /// The x86_64 system call number.
    pub nr: i64,
    /// Why the system call is allowed, filtered or refused.
    pub reason: &'static str,
    /// The action.
    pub action: RuleAction,
}

/// The action of one rule. Argument indexes count from 0 and go up to 5.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    /// Always allowed.
    Allow,
    /// Allowed only when `(args[arg] & mask) == 0` over all 64 bits; otherwise fails with `errno`.
    AllowUnlessArgMasked {
        /// Argument index.
        arg: u8,
        /// Bits that must all be clear.
        mask: u64,
        /// Errno when any of them is set.
        errno: u32,
    },
    /// Allowed unless the low 32 bits of `args[arg]` equal one of `values` (compared on their low 32
    /// bits too); then fails with `errno`. For `int`-typed arguments such as an ioctl command, whose
    /// upper bits the kernel ignores.
    AllowUnlessArgEquals {
        /// Argument index.
        arg: u8,
        /// Refused values.
        values: Vec<u64>,
        /// Errno for a refused value.
        errno: u32,
    },
    /// Allowed only if the low 32 bits of `args[arg]` equal one of `values` (compared on their low 32
    /// bits too); otherwise fails with `errno`.
    AllowIfArgEquals {
        /// Argument index.
        arg: u8,
        /// Allowed values.
        values: Vec<u64>,
        /// Errno for any other value.
        errno: u32,
    },
    /// Always fails with this errno.
    Errno(u32),
}

/// The outcome of a system call under a policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The kernel runs the system call.
    Allow,
    /// The system call fails with this errno without running.
    Errno(u32),
}

/// What `policy` does with system call `nr` called with `args`. Pure; [`compile`](super::compile)
/// produces a filter with the same meaning.
pub fn decide(policy: &SeccompPolicy, nr: i64, args: [u64; 6]) -> Decision {
    let Some(rule) = policy.rules.iter().find(|rule| rule.nr == nr) else {
        return Decision::Errno(policy.default_errno);
    };
    // An argument index past 5 names no argument: such a condition never allows.
    let value_of = |index: &u8| args.get(usize::from(*index)).copied();
    let low32 = |value: u64| value & 0xffff_ffff;
    let listed = |values: &[u64], value: u64| values.iter().any(|&v| low32(v) == low32(value));
    let (allowed, errno) = match &rule.action {
        RuleAction::Allow => return Decision::Allow,
        RuleAction::Errno(errno) => return Decision::Errno(*errno),
        RuleAction::AllowUnlessArgMasked { arg, mask, errno } => {
            (value_of(arg).is_some_and(|value| value & mask == 0), errno)
        }
        RuleAction::AllowUnlessArgEquals { arg, values, errno } => {
            (value_of(arg).is_some_and(|value| !listed(values, value)), errno)
        }
        RuleAction::AllowIfArgEquals { arg, values, errno } => {
            (value_of(arg).is_some_and(|value| listed(values, value)), errno)
        }
    };
    if allowed {
        Decision::Allow
    } else {
        Decision::Errno(*errno)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seccomp::samples::*;

    #[test]
    fn decides_each_kind_of_rule() {
        let policy = sample_policy();
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
            (libc::SYS_clone3, 0, 0, enosys),
            // A refused value, also with other high bits: compared on the low 32 bits.
            (libc::SYS_ioctl, 1, TIOCSTI, enotty),
            (libc::SYS_ioctl, 1, 0xdead_0000_0000 | TIOCSTI, enotty),
            (libc::SYS_ioctl, 1, FITHAW, enotty),
            (libc::SYS_ioctl, 1, TCGETS, allow),
            (libc::SYS_ioctl, 1, TIOCLINUX, allow),
            // An allowed value: likewise.
            (libc::SYS_personality, 0, 0xffff_ffff, allow),
            (libc::SYS_personality, 0, 0x1_ffff_ffff, allow),
            (libc::SYS_personality, 0, NO_ASLR, eperm),
            (libc::SYS_socket, 0, AF_INET6, allow),
            (libc::SYS_socket, 0, AF_PACKET, Decision::Errno(EAFNOSUPPORT)),
            (libc::SYS_io_setup, 0, 0, enosys),
            (libc::SYS_io_uring_setup, 0, 0, eperm),
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
    fn a_condition_on_a_missing_argument_never_allows() {
        let rule = |action| SeccompPolicy {
            default_errno: ENOSYS,
            rules: vec![SyscallRule {
                name: "test",
                nr: 1,
                reason: "test",
                action,
            }],
        };
        let masked = rule(RuleAction::AllowUnlessArgMasked {
            arg: 6,
            mask: 0,
            errno: EPERM,
        });
        let unless = rule(RuleAction::AllowUnlessArgEquals {
            arg: 6,
            values: vec![],
            errno: EPERM,
        });
        for policy in [masked, unless] {
            assert_eq!(decide(&policy, 1, [0; 6]), Decision::Errno(EPERM));
        }
    }
}
