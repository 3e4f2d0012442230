//! Values and policies that the tests feed to both [`decide`](super::decide) and the compiled filter.

use super::compile::MAX_ERRNO;
pub(super) use super::policy::{EAFNOSUPPORT, ENOSYS, ENOTTY, EPERM};
use super::{default_policy, RuleAction, SeccompPolicy, SyscallRule};

pub(super) const EINVAL: u32 = libc::EINVAL as u32;
pub(super) const SIGCHLD: u64 = libc::SIGCHLD as u64;
pub(super) const NEWUSER: u64 = libc::CLONE_NEWUSER as u64;
pub(super) const NEWNET: u64 = libc::CLONE_NEWNET as u64;
pub(super) const TCGETS: u64 = libc::TCGETS;
pub(super) const TIOCSTI: u64 = libc::TIOCSTI;
pub(super) const TIOCLINUX: u64 = libc::TIOCLINUX;
/// `BTRFS_IOC_SUBVOL_CREATE`: `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)` (4096 bytes).
pub(super) const BTRFS_IOC_SUBVOL_CREATE: u64 = 0x5000_940e;
/// `BTRFS_IOC_SNAP_CREATE_V2`: `_IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)` (4096 bytes).
pub(super) const BTRFS_IOC_SNAP_CREATE_V2: u64 = 0x5000_9417;
/// `BTRFS_IOC_TREE_SEARCH`: `_IOWR(0x94, 17, struct btrfs_ioctl_search_args)` (4096 bytes).
pub(super) const BTRFS_IOC_TREE_SEARCH: u64 = 0xd000_9411;
pub(super) const NO_ASLR: u64 = libc::ADDR_NO_RANDOMIZE as u64;
pub(super) const AF_INET6: u64 = libc::AF_INET6 as u64;
pub(super) const AF_PACKET: u64 = libc::AF_PACKET as u64;
/// `__X32_SYSCALL_BIT`, as a system call number.
pub(super) const X32: i64 = 0x4000_0000;

/// Arguments that are all 0 but `args[index]`.
pub(super) fn with_arg(index: usize, value: u64) -> [u64; 6] {
    let mut args = [0; 6];
    args[index] = value;
    args
}

/// The number of [`large_policy`]'s rule with a 300-value list (not a system call).
pub(super) const LARGE_LIST_NR: i64 = 600;
/// The errno of [`large_policy`]'s masked rules.
pub(super) const LARGE_MASKED_ERRNO: u32 = 200;

/// The errno [`large_policy`] gives number `nr` from 1000 up to 1599 (unless it is masked).
pub(super) fn large_errno(nr: i64) -> u32 {
    100 + (nr % 7) as u32
}

/// The default policy plus rules on numbers that are not system calls, chosen so that the program is
/// too long for a conditional jump (255 instructions) to reach across it: a rule allowing 300 values
/// of argument 2 (multiples of 3), and 600 numbers with a different errno from each neighbour, every
/// 50th of them instead refusing a mask of argument 3 (a check that is shared only nearby).
pub(super) fn large_policy() -> SeccompPolicy {
    let mut policy = default_policy();
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

/// SplitMix64: a deterministic pseudo-random sequence, so that a failure can be replayed.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(super) fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    pub(super) fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The values a policy's conditions mention (and their single bits), which random arguments
/// should hit often, not by chance alone.
pub(super) fn interesting_values(policy: &SeccompPolicy) -> Vec<u64> {
    let mut values = vec![0, u64::MAX, 0xffff_ffff, 1 << 32];
    for rule in &policy.rules {
        match &rule.action {
            RuleAction::AllowUnlessArgMasked { mask, .. } => {
                values.push(*mask);
                values.extend((0..64).map(|bit| 1 << bit).filter(|bit| mask & bit != 0));
            }
            RuleAction::AllowUnlessArgEquals { values: listed, .. }
            | RuleAction::AllowIfArgEquals { values: listed, .. } => values.extend(listed),
            RuleAction::Allow | RuleAction::Errno(_) => {}
        }
    }
    values
}

/// A random argument: any value, a 32-bit one, a small one, or one of `interesting` as is, with a
/// bit flipped, or with a random high word.
pub(super) fn random_value(rng: &mut Rng, interesting: &[u64]) -> u64 {
    match rng.below(6) {
        0 => rng.next(),
        1 => rng.next() & 0xffff_ffff,
        2 => rng.below(64),
        3 => rng.pick(interesting) ^ (1 << rng.below(64)),
        4 => rng.pick(interesting) & 0xffff_ffff | rng.next() << 32,
        _ => rng.pick(interesting),
    }
}

/// A random system call number: any 32-bit one, an x32 one, a boundary, a small one, or most often
/// a number `policy` lists or its neighbour.
pub(super) fn random_nr(rng: &mut Rng, policy: &SeccompPolicy) -> i64 {
    match rng.below(8) {
        0 => rng.below(1 << 32) as i64,
        1 => X32 + rng.below(600) as i64,
        2 => rng.pick(&[0, X32 - 1, X32, i64::from(u32::MAX)]),
        3 => rng.below(1 << 12) as i64,
        _ if policy.rules.is_empty() => rng.below(600) as i64,
        _ => policy.rules[rng.below(policy.rules.len() as u64) as usize].nr + rng.pick(&[-1, 0, 0, 1]),
    }
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
