//! Compiling a [`SeccompPolicy`] into one classic-BPF program (see the module docs of
//! [`seccomp`](super) for why it is hand-written).
//!
//! The program, in order:
//!
//! 1. the architecture check: anything but `AUDIT_ARCH_X86_64` kills the process;
//! 2. the x32 check: numbers from `__X32_SYSCALL_BIT` (`0x4000_0000`) up get the default errno;
//! 3. a balanced binary search tree of `JGE` over the system call number. The numbers below `0x4000_0000`
//!    are cut into segments, maximal runs of consecutive numbers that the policy treats alike (a run
//!    of allowed calls, a gap of unlisted ones, a single call with an argument check). Each leaf is
//!    one segment, so a number meets about log2(segments) comparisons and then its action;
//! 4. the action: a return, or for the few rules that look at an argument, a check of that argument
//!    ending in a return: `JSET` for a mask; for a list of values, a chain of `JEQ` when it is short,
//!    else a second binary search of `JGE` over the runs of consecutive values in or out of the list
//!    (the ioctl allowlist's 80-odd requests cost a call about 7 comparisons, not 80).
//!
//! One program can return any action, so unlike a seccompiler filter (one action on a match, one
//! on a mismatch) it needs no stack of filters per errno.

use std::mem::offset_of;

use seccompiler::{BackendError, BpfProgram};

use super::bpf::{Assembler, Label, JEQ, JGE, JSET};
use super::{CompiledSeccomp, RuleAction, SeccompError, SeccompPolicy, SyscallRule};

/// `AUDIT_ARCH_X86_64` (`EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`).
pub(super) const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// `__X32_SYSCALL_BIT`: x32 system calls are numbered from here.
pub(super) const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// The largest errno a system call can return (`MAX_ERRNO`).
pub(super) const MAX_ERRNO: u32 = 4095;
/// The most instructions the kernel accepts in one filter (`BPF_MAXINSNS`).
pub(super) const MAX_INSTRUCTIONS: usize = libc::BPF_MAXINSNS as usize;
/// The largest argument index of a system call.
const MAX_ARG: u8 = 5;

const NR_OFFSET: u32 = offset_of!(libc::seccomp_data, nr) as u32;
const ARCH_OFFSET: u32 = offset_of!(libc::seccomp_data, arch) as u32;
const ARGS_OFFSET: u32 = offset_of!(libc::seccomp_data, args) as u32;

/// Where the low 32 bits of argument `arg` are: `seccomp_data.args` are `u64`, stored little-endian
/// on x86_64, so the low word comes first and the high word 4 bytes later.
fn low_word(arg: u8) -> u32 {
    ARGS_OFFSET + 8 * u32::from(arg)
}

fn high_word(arg: u8) -> u32 {
    low_word(arg) + 4
}

/// The action that fails a system call with `errno`.
fn ret_errno(errno: u32) -> u32 {
    libc::SECCOMP_RET_ERRNO | errno
}

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;

/// What the program does once it knows the system call number; a `u32` is a `SECCOMP_RET_*` action.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// Returns the action.
    Return(u32),
    /// Looks at an argument first.
    Check(ArgCheck),
}

/// A test of one argument, ending in one of two actions.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ArgCheck {
    /// Returns `then` if any bit of `mask` is set in argument `arg` (all 64 bits), `otherwise` if none.
    AnyBitSet {
        arg: u8,
        mask: u64,
        then: u32,
        otherwise: u32,
    },
    /// Returns `then` if the low 32 bits of argument `arg` are one of `values`, `otherwise` if not.
    LowWordIn {
        arg: u8,
        values: Vec<u32>,
        then: u32,
        otherwise: u32,
    },
}

/// Checks `rule` and reduces it to what the program does for its number.
fn outcome(rule: &SyscallRule) -> Result<Outcome, SeccompError> {
    let valid_errno = |errno: u32| {
        if errno > MAX_ERRNO {
            Err(SeccompError::InvalidErrno {
                name: rule.name,
                errno,
            })
        } else {
            Ok(ret_errno(errno))
        }
    };
    // Checked whatever the values or mask, so that no rule naming a missing argument compiles.
    let valid_arg = |arg: u8| {
        if arg > MAX_ARG {
            Err(SeccompError::Rule {
                name: rule.name,
                source: BackendError::InvalidArgumentNumber,
            })
        } else {
            Ok(arg)
        }
    };
    let low_words = |values: &[u64]| {
        let mut words: Vec<u32> = values.iter().map(|&value| value as u32).collect();
        words.sort_unstable();
        words.dedup();
        words
    };
    Ok(match &rule.action {
        RuleAction::Allow => Outcome::Return(ALLOW),
        RuleAction::Errno(errno) => Outcome::Return(valid_errno(*errno)?),
        RuleAction::AllowUnlessArgMasked { arg, mask, errno } => {
            let (arg, refuse) = (valid_arg(*arg)?, valid_errno(*errno)?);
            match *mask {
                0 => Outcome::Return(ALLOW),
                mask => Outcome::Check(ArgCheck::AnyBitSet {
                    arg,
                    mask,
                    then: refuse,
                    otherwise: ALLOW,
                }),
            }
        }
        RuleAction::AllowUnlessArgEquals { arg, values, errno } => {
            let (arg, refuse) = (valid_arg(*arg)?, valid_errno(*errno)?);
            match low_words(values) {
                values if values.is_empty() => Outcome::Return(ALLOW),
                values => Outcome::Check(ArgCheck::LowWordIn {
                    arg,
                    values,
                    then: refuse,
                    otherwise: ALLOW,
                }),
            }
        }
        RuleAction::AllowIfArgEquals { arg, values, errno } => {
            let (arg, refuse) = (valid_arg(*arg)?, valid_errno(*errno)?);
            match low_words(values) {
                values if values.is_empty() => Outcome::Return(refuse),
                values => Outcome::Check(ArgCheck::LowWordIn {
                    arg,
                    values,
                    then: ALLOW,
                    otherwise: refuse,
                }),
            }
        }
    })
}

/// One segment: the numbers from `start` up to the next segment's start (or `X32_SYSCALL_BIT`).
type Segment<'a> = (u32, &'a Outcome);

/// Cuts the numbers below `X32_SYSCALL_BIT` into maximal runs with the same outcome, given the
/// outcome of each listed number in ascending order of number (without repeats).
fn segments<'a>(default: &'a Outcome, listed: impl Iterator<Item = (u32, &'a Outcome)>) -> Vec<Segment<'a>> {
    let mut segments: Vec<Segment<'a>> = Vec::new();
    let mut push = |start: u32, outcome: &'a Outcome| {
        if segments.last().is_none_or(|(_, last)| *last != outcome) {
            segments.push((start, outcome));
        }
    };
    let mut next = 0;
    for (nr, outcome) in listed {
        if nr > next {
            push(next, default);
        }
        push(nr, outcome);
        next = nr + 1;
    }
    if next < X32_SYSCALL_BIT {
        push(next, default);
    }
    segments
}

/// Writes the program back to front (see [`super::bpf`]). An argument check already placed is
/// shared by later segments with the same check while it is in reach.
struct Layout {
    asm: Assembler,
    checks: Vec<(ArgCheck, Label)>,
}

impl Layout {
    /// The search tree over `segments` (not empty), which start in ascending order.
    fn tree(&mut self, segments: &[Segment<'_>]) -> Label {
        match segments {
            [] => unreachable!("segments cover every number below X32_SYSCALL_BIT"),
            [(_, Outcome::Return(action))] => self.asm.ret(*action),
            [(_, Outcome::Check(check))] => self.check(check),
            _ => {
                let (lower, upper) = segments.split_at(segments.len() / 2);
                let upper_tree = self.tree(upper);
                let lower_tree = self.tree(lower);
                self.asm.jump(JGE, upper[0].0, upper_tree, lower_tree)
            }
        }
    }

    fn check(&mut self, check: &ArgCheck) -> Label {
        let placed = self.checks.iter().rev().find(|(placed, _)| placed == check);
        if let Some(&(_, label)) = placed.filter(|(_, label)| self.asm.reaches(*label)) {
            return label;
        }
        let asm = &mut self.asm;
        let label = match *check {
            ArgCheck::AnyBitSet {
                arg,
                mask,
                then,
                otherwise,
            } => {
                // In program order: the low word, then the high word, each tested with JSET.
                let mut next = asm.ret(otherwise);
                for (offset, bits) in [
                    (high_word(arg), (mask >> 32) as u32),
                    (low_word(arg), mask as u32),
                ] {
                    if bits != 0 {
                        let hit = asm.ret(then);
                        let test = asm.jump(JSET, bits, hit, next);
                        next = asm.load(offset, test);
                    }
                }
                next
            }
            ArgCheck::LowWordIn {
                arg,
                ref values,
                then,
                otherwise,
            } if values.len() <= LINEAR_VALUES => {
                // A short chain of JEQ: no longer than the search below for so few values.
                let mut next = asm.ret(otherwise);
                for &value in values.iter().rev() {
                    let hit = asm.ret(then);
                    next = asm.jump(JEQ, value, hit, next);
                }
                asm.load(low_word(arg), next)
            }
            ArgCheck::LowWordIn {
                arg,
                ref values,
                then,
                otherwise,
            } => {
                let runs = value_runs(values, then, otherwise);
                let search = value_tree(asm, &runs);
                asm.load(low_word(arg), search)
            }
        };
        self.checks.push((check.clone(), label));
        label
    }
}

/// Lists of at most this many values are checked one `JEQ` after another; longer ones by a binary
/// search over their runs ([`value_tree`]), so that a long allowlist (the ioctl requests) costs a
/// call about log2(runs) instructions instead of one per value.
const LINEAR_VALUES: usize = 4;

/// Cuts the 32-bit values into maximal runs that are all in `values` (sorted, without repeats) or
/// all out, each with the action for it: `(first value, action)`, in ascending order, the first
/// starting at 0.
fn value_runs(values: &[u32], inside: u32, outside: u32) -> Vec<(u32, u32)> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    let mut push = |start: u32, action: u32| {
        if runs.last().is_none_or(|&(_, last)| last != action) {
            runs.push((start, action));
        }
    };
    let mut next = Some(0u32);
    for &value in values {
        if let Some(start) = next.filter(|&start| value > start) {
            push(start, outside);
        }
        push(value, inside);
        next = value.checked_add(1);
    }
    if let Some(next) = next {
        push(next, outside);
    }
    runs
}

/// A balanced binary search of `JGE` over `runs` (as [`value_runs`] makes them, not empty) on the
/// loaded word, ending in each run's return.
fn value_tree(asm: &mut Assembler, runs: &[(u32, u32)]) -> Label {
    match runs {
        [] => unreachable!("runs cover every 32-bit value"),
        [(_, action)] => asm.ret(*action),
        _ => {
            let (lower, upper) = runs.split_at(runs.len() / 2);
            let upper_tree = value_tree(asm, upper);
            let lower_tree = value_tree(asm, lower);
            asm.jump(JGE, upper[0].0, upper_tree, lower_tree)
        }
    }
}

/// Compiles `policy` into one BPF program for x86_64 (see the module docs for its layout). Allocates:
/// do it before `fork`, then [`apply`](super::apply) in the child.
pub fn compile(policy: &SeccompPolicy) -> Result<CompiledSeccomp, SeccompError> {
    if policy.default_errno > MAX_ERRNO {
        return Err(SeccompError::InvalidErrno {
            name: "default",
            errno: policy.default_errno,
        });
    }
    let mut outcomes = Vec::with_capacity(policy.rules.len());
    let mut order = Vec::with_capacity(policy.rules.len());
    for (index, rule) in policy.rules.iter().enumerate() {
        let nr = u32::try_from(rule.nr).ok().filter(|&nr| nr < X32_SYSCALL_BIT);
        let nr = nr.ok_or(SeccompError::InvalidNumber {
            name: rule.name,
            nr: rule.nr,
        })?;
        outcomes.push(outcome(rule)?);
        order.push((nr, index));
    }
    // By number, then in policy order, so that a duplicate is reported at its second rule.
    order.sort_unstable();
    if let Some(pair) = order.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        let rule = &policy.rules[pair[1].1];
        return Err(SeccompError::DuplicateRule {
            name: rule.name,
            nr: rule.nr,
        });
    }
    let default = ret_errno(policy.default_errno);
    let default_outcome = Outcome::Return(default);
    let mut layout = Layout {
        asm: Assembler::default(),
        checks: Vec::new(),
    };
    let listed = order.iter().map(|&(nr, index)| (nr, &outcomes[index]));
    let tree = layout.tree(&segments(&default_outcome, listed));
    let asm = &mut layout.asm;
    let x32 = asm.ret(default);
    let native = asm.jump(JGE, X32_SYSCALL_BIT, x32, tree);
    let load_nr = asm.load(NR_OFFSET, native);
    let kill = asm.ret(libc::SECCOMP_RET_KILL_PROCESS);
    let arch = asm.jump(JEQ, AUDIT_ARCH_X86_64, load_nr, kill);
    let entry = asm.load(ARCH_OFFSET, arch);
    let program: BpfProgram = layout.asm.finish(entry);
    if program.len() > MAX_INSTRUCTIONS {
        return Err(SeccompError::Compile {
            index: 0,
            source: BackendError::FilterTooLarge(program.len()),
        });
    }
    Ok(CompiledSeccomp {
        programs: vec![program],
    })
}

#[cfg(test)]
mod tests {
    use super::super::samples::*;
    use super::super::verify::{
        assert_agrees_on_each_rule, assert_agrees_on_random_calls, assert_compiled_matches_decide,
        compile_checked,
    };
    use super::*;

    #[test]
    fn compiled_sample_policy_matches_decide() {
        let policy = sample_policy();
        let compiled = compile(&policy).expect("compile");
        assert_eq!(compiled.programs().len(), 1, "one program for every action");
        assert!(compiled.programs().iter().all(|p| p.len() < MAX_INSTRUCTIONS));
        assert_compiled_matches_decide(&policy);
    }

    fn test_policy(default_errno: u32, actions: Vec<RuleAction>) -> SeccompPolicy {
        let rule = |(nr, action)| SyscallRule {
            name: "test",
            nr,
            reason: "test",
            action,
        };
        SeccompPolicy {
            default_errno,
            rules: (1..).zip(actions).map(rule).collect(),
        }
    }

    fn masked(arg: u8, mask: u64, errno: u32) -> RuleAction {
        RuleAction::AllowUnlessArgMasked { arg, mask, errno }
    }

    fn unless(arg: u8, values: Vec<u64>, errno: u32) -> RuleAction {
        RuleAction::AllowUnlessArgEquals { arg, values, errno }
    }

    fn only_if(arg: u8, values: Vec<u64>, errno: u32) -> RuleAction {
        RuleAction::AllowIfArgEquals { arg, values, errno }
    }

    #[test]
    fn compiled_edge_cases_match_decide() {
        let policy = test_policy(
            EPERM,
            vec![
                masked(0, 0, EINVAL),
                masked(2, 1 << 40 | 1, EINVAL),
                masked(3, NEWUSER, EPERM),
                unless(1, vec![], EINVAL),
                unless(1, vec![0x7, TIOCSTI], EPERM),
                unless(4, vec![0x7, 1 << 32 | 0x8], EINVAL),
                only_if(0, vec![], EINVAL),
                only_if(5, vec![0x8, 0xffff_ffff], EINVAL),
                only_if(1, vec![0x7], EPERM),
                RuleAction::Errno(EPERM),
                RuleAction::Errno(ENOSYS),
                RuleAction::Allow,
                // High word only, both words, and every bit.
                masked(1, 1 << 63, EINVAL),
                masked(0, 0x8000_0001_0000_0001, EPERM),
                masked(5, u64::MAX, EINVAL),
                // Values equal on their low 32 bits, and a mask equal to another rule's (shared check).
                only_if(2, vec![1 << 32 | 0x8, 0x8, 2 << 32 | 0x8], EPERM),
                masked(3, NEWUSER, EPERM),
                RuleAction::Errno(0),
            ],
        );
        assert_compiled_matches_decide(&policy);
        // No rules at all: every number gets the default errno.
        assert_compiled_matches_decide(&test_policy(ENOSYS, vec![]));
    }

    #[test]
    fn compile_rejects_bad_policies() {
        let mut duplicate = test_policy(EPERM, vec![RuleAction::Allow, RuleAction::Errno(EPERM)]);
        duplicate.rules[1].nr = 1;
        assert!(matches!(
            compile(&duplicate),
            Err(SeccompError::DuplicateRule { nr: 1, .. })
        ));
        let bad_arg = test_policy(EPERM, vec![masked(6, 1, EPERM)]);
        assert!(matches!(compile(&bad_arg), Err(SeccompError::Rule { .. })));
        // Even where the condition could not matter, since `decide` never allows a missing argument.
        let moot_arg = test_policy(EPERM, vec![masked(6, 0, EPERM)]);
        assert!(matches!(compile(&moot_arg), Err(SeccompError::Rule { .. })));
        let bad_errno = test_policy(70_000, vec![]);
        assert!(matches!(
            compile(&bad_errno),
            Err(SeccompError::InvalidErrno { .. })
        ));
        let bad_rule_errno = test_policy(EPERM, vec![only_if(0, vec![], MAX_ERRNO + 1)]);
        assert!(matches!(
            compile(&bad_rule_errno),
            Err(SeccompError::InvalidErrno { errno: 4096, .. })
        ));
        for nr in [-1, X32, X32 | libc::SYS_getpid, 1 << 32] {
            let mut out_of_range = test_policy(EPERM, vec![RuleAction::Allow]);
            out_of_range.rules[0].nr = nr;
            let result = compile(&out_of_range);
            assert!(
                matches!(result, Err(SeccompError::InvalidNumber { nr: got, .. }) if got == nr),
                "{nr}: {result:?}"
            );
        }
        // Values apart from each other, so that each is a run of its own.
        let too_large = test_policy(EPERM, vec![only_if(0, (0..5000).map(|v| v * 2).collect(), EPERM)]);
        assert!(matches!(
            compile(&too_large),
            Err(SeccompError::Compile {
                index: 0,
                source: BackendError::FilterTooLarge(_)
            })
        ));
    }

    /// The property test of the sample policy, over rule-specific and random (number, arguments).
    #[test]
    fn sample_policy_agrees_with_decide_on_random_calls() {
        let policy = sample_policy();
        assert_agrees_on_each_rule(&policy);
        assert_agrees_on_random_calls(&policy, &mut Rng(1), 300_000);
    }

    #[test]
    fn large_policy_agrees_with_decide() {
        let policy = large_policy();
        let length = compile_checked(&policy).programs()[0].len();
        assert!(
            length > 4 * 255,
            "{length} instructions: long enough to need far jumps"
        );
        assert_agrees_on_each_rule(&policy);
        assert_agrees_on_random_calls(&policy, &mut Rng(2), 300_000);
    }

    /// Random policies: numbers packed close (runs, gaps and neighbours with equal or different
    /// actions) with a few far apart, actions of every kind, sometimes a long list of values.
    #[test]
    fn random_policies_agree_with_decide() {
        let mut rng = Rng(3);
        for _ in 0..400 {
            let policy = random_policy(&mut rng);
            assert_agrees_on_each_rule(&policy);
            assert_agrees_on_random_calls(&policy, &mut rng, 3_000);
        }
    }

    #[test]
    fn value_runs_cover_every_value() {
        const IN: u32 = 1;
        const OUT: u32 = 2;
        assert_eq!(value_runs(&[], IN, OUT), [(0, OUT)]);
        assert_eq!(value_runs(&[0], IN, OUT), [(0, IN), (1, OUT)]);
        assert_eq!(value_runs(&[u32::MAX], IN, OUT), [(0, OUT), (u32::MAX, IN)]);
        assert_eq!(
            value_runs(&[3, 4, 5, 9, u32::MAX - 1, u32::MAX], IN, OUT),
            [
                (0, OUT),
                (3, IN),
                (6, OUT),
                (9, IN),
                (10, OUT),
                (u32::MAX - 1, IN)
            ]
        );
    }
}
