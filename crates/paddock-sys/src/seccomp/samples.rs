//! Values and policies that the tests feed to both [`decide`](super::decide) and the compiled filter.
//!
//! The sandbox's real policy is not here: it is data of the setup that installs it
//! (`paddock-runtime`'s `native/setup/seccomp_policy.rs`), tested there with `verify.rs`. The
//! mechanism's tests use [`sample_policy`], shaped like it: rules of every kind on the calls the
//! tests try, and everything else up to number 470 allowed, so that ordinary programs run under it.

use super::compile::MAX_ERRNO;
pub(super) use super::verify::{with_arg, Rng, X32};
use super::{RuleAction, SeccompPolicy, SyscallRule};

pub(super) const EPERM: u32 = libc::EPERM as u32;
pub(super) const ENOSYS: u32 = libc::ENOSYS as u32;
pub(super) const EAFNOSUPPORT: u32 = libc::EAFNOSUPPORT as u32;
pub(super) const ENOTTY: u32 = libc::ENOTTY as u32;
pub(super) const EINVAL: u32 = libc::EINVAL as u32;
pub(super) const SIGCHLD: u64 = libc::SIGCHLD as u64;
pub(super) const NEWUSER: u64 = libc::CLONE_NEWUSER as u64;
pub(super) const NEWNET: u64 = libc::CLONE_NEWNET as u64;
pub(super) const TCGETS: u64 = libc::TCGETS;
pub(super) const TIOCSTI: u64 = libc::TIOCSTI;
pub(super) const TIOCLINUX: u64 = libc::TIOCLINUX;
/// `FITHAW`: `_IOWR('X', 120, int)`, from linux/fs.h.
pub(super) const FITHAW: u64 = 0xc004_5878;
pub(super) const NO_ASLR: u64 = libc::ADDR_NO_RANDOMIZE as u64;
pub(super) const AF_INET6: u64 = libc::AF_INET6 as u64;
pub(super) const AF_PACKET: u64 = libc::AF_PACKET as u64;

/// The highest number [`sample_policy`] allows wholesale.
const SAMPLE_LAST_NR: i64 = 470;

/// A policy shaped like a sandbox's (default `ENOSYS`): `clone` refused new namespaces by mask,
/// `ioctl` refused `TIOCSTI` and `FITHAW` by value, `personality` and `socket` allowed only listed
/// values, `clone3` and kernel AIO `ENOSYS`, `io_uring_setup`, `keyctl` and `unshare` `EPERM`; every
/// other number up to [`SAMPLE_LAST_NR`] allowed.
pub(super) fn sample_policy() -> SeccompPolicy {
    let namespaces = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWCGROUP,
    ]
    .iter()
    .fold(0, |mask, &flag| mask | flag as u64);
    let families = [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK].map(|af| af as u64);
    let special = [
        (
            libc::SYS_clone,
            RuleAction::AllowUnlessArgMasked {
                arg: 0,
                mask: namespaces,
                errno: EPERM,
            },
        ),
        (libc::SYS_clone3, RuleAction::Errno(ENOSYS)),
        (
            libc::SYS_ioctl,
            RuleAction::AllowUnlessArgEquals {
                arg: 1,
                values: vec![TIOCSTI, FITHAW],
                errno: ENOTTY,
            },
        ),
        (
            libc::SYS_personality,
            RuleAction::AllowIfArgEquals {
                arg: 0,
                values: vec![0, 0x0008, 0x2_0000, 0x2_0008, 0xffff_ffff],
                errno: EPERM,
            },
        ),
        (
            libc::SYS_socket,
            RuleAction::AllowIfArgEquals {
                arg: 0,
                values: families.to_vec(),
                errno: EAFNOSUPPORT,
            },
        ),
        (libc::SYS_io_setup, RuleAction::Errno(ENOSYS)),
        (libc::SYS_io_uring_setup, RuleAction::Errno(EPERM)),
        (libc::SYS_keyctl, RuleAction::Errno(EPERM)),
        (libc::SYS_unshare, RuleAction::Errno(EPERM)),
    ];
    let rules = (0..=SAMPLE_LAST_NR)
        .map(|nr| {
            let action = special
                .iter()
                .find(|(special, _)| *special == nr)
                .map_or(RuleAction::Allow, |(_, action)| action.clone());
            SyscallRule {
                name: "sample",
                nr,
                reason: "test",
                action,
            }
        })
        .collect();
    SeccompPolicy {
        default_errno: ENOSYS,
        rules,
    }
}

/// The number of [`large_policy`]'s rule with a 300-value list (not a system call).
pub(super) const LARGE_LIST_NR: i64 = 600;
/// The errno of [`large_policy`]'s masked rules.
pub(super) const LARGE_MASKED_ERRNO: u32 = 200;

/// The errno [`large_policy`] gives number `nr` from 1000 up to 1599 (unless it is masked).
pub(super) fn large_errno(nr: i64) -> u32 {
    100 + (nr % 7) as u32
}

/// The sample policy plus rules on numbers that are not system calls, chosen so that the program is
/// too long for a conditional jump (255 instructions) to reach across it: a rule allowing 300 values
/// of argument 2 (multiples of 3), and 600 numbers with a different errno from each neighbour, every
/// 50th of them instead refusing a mask of argument 3 (a check that is shared only nearby).
pub(super) fn large_policy() -> SeccompPolicy {
    let mut policy = sample_policy();
    let rule = |nr, action| SyscallRule {
        name: "large",
        nr,
        reason: "test",
        action,
    };
    policy.rules.push(rule(
        LARGE_LIST_NR,
        RuleAction::AllowIfArgEquals {
            arg: 2,
            values: (0..300).map(|value| value * 3).collect(),
            errno: EPERM,
        },
    ));
    policy.rules.extend((1000..1600).map(|nr| {
        let action = match nr % 50 {
            0 => RuleAction::AllowUnlessArgMasked {
                arg: 3,
                mask: 1 << 33 | 1,
                errno: LARGE_MASKED_ERRNO,
            },
            _ => RuleAction::Errno(large_errno(nr)),
        };
        rule(nr, action)
    }));
    policy
}

/// A random action of any kind, on any argument, with masks and values from small pools (so that
/// rules repeat each other's checks), one list in 20 of 300 values.
fn random_action(rng: &mut Rng) -> RuleAction {
    let errno = rng.pick(&[0, EPERM, ENOSYS, EINVAL, MAX_ERRNO]);
    let arg = rng.below(6) as u8;
    let masks = [1, 1 << 33, 1 << 33 | 1, NEWUSER, u64::MAX, 0xffff_0000_0000, 0];
    let pool = [0, 7, 8, TIOCSTI, 0xffff_ffff, 1 << 32 | 7, 2 << 32, u64::MAX];
    let values = |rng: &mut Rng| {
        let count = if rng.below(20) == 0 { 300 } else { rng.below(5) };
        (0..count).map(|_| rng.pick(&pool) ^ rng.below(4)).collect()
    };
    match rng.below(8) {
        0 | 1 => RuleAction::Allow,
        2 => RuleAction::Errno(errno),
        3 | 4 => RuleAction::AllowUnlessArgMasked {
            arg,
            mask: rng.pick(&masks),
            errno,
        },
        5 => RuleAction::AllowUnlessArgEquals {
            arg,
            values: values(rng),
            errno,
        },
        _ => RuleAction::AllowIfArgEquals {
            arg,
            values: values(rng),
            errno,
        },
    }
}

/// A random policy: up to 120 rules on numbers packed close (runs, gaps and neighbours with equal
/// or different actions) with a few far apart, actions of every kind, sometimes a long list of values.
pub(super) fn random_policy(rng: &mut Rng) -> SeccompPolicy {
    let count = rng.below(120);
    let mut policy = SeccompPolicy {
        default_errno: rng.pick(&[0, EPERM, ENOSYS, MAX_ERRNO]),
        rules: Vec::new(),
    };
    for _ in 0..count {
        let nr = match rng.below(10) {
            0 => rng.below(X32 as u64) as i64,
            _ => rng.below(160) as i64,
        };
        if policy.rules.iter().all(|rule| rule.nr != nr) {
            let action = random_action(rng);
            policy.rules.push(SyscallRule {
                name: "random",
                nr,
                reason: "test",
                action,
            });
        }
    }
    policy
}
