//! Test support: checks that a compiled filter means what [`decide`] says, by running it in the
//! BPF interpreter (`interpret.rs`) after the kernel's load-time checks, without installing it.
//!
//! The mechanism's own tests use it on sample and random policies; the real sandbox policy lives
//! with the setup that installs it (`paddock-runtime`'s `native/setup/seccomp_policy.rs`) and its
//! tests use it on that policy, through the `test-support` feature of this crate. Everything here
//! panics on a disagreement, as a test assertion does; nothing here is built without that feature
//! or outside tests.

use super::compile::AUDIT_ARCH_X86_64 as ARCH;
use super::{compile, decide, CompiledSeccomp, Decision, RuleAction, SeccompPolicy};

pub use super::interpret::{check, run, Run};

/// `AUDIT_ARCH_X86_64`, the architecture a compiled filter allows.
pub const AUDIT_ARCH_X86_64: u32 = ARCH;
/// The most instructions the kernel accepts in one filter (`BPF_MAXINSNS`).
pub const MAX_INSTRUCTIONS: usize = super::compile::MAX_INSTRUCTIONS;
/// `__X32_SYSCALL_BIT`, as a system call number.
pub const X32: i64 = super::compile::X32_SYSCALL_BIT as i64;

/// Runs a stack of filters as the kernel does: newest first, the strictest action wins, and on a
/// tie the newest filter's result is kept.
pub fn compiled_decision(compiled: &CompiledSeccomp, nr: i64, args: [u64; 6]) -> Decision {
    let action = |ret: u32| (ret & 0xffff_0000) as i32;
    let mut result = libc::SECCOMP_RET_ALLOW;
    for program in compiled.programs().iter().rev() {
        let ret = run(program, nr as u32, AUDIT_ARCH_X86_64, args).action;
        if action(ret) < action(result) {
            result = ret;
        }
    }
    match result & 0xffff_0000 {
        libc::SECCOMP_RET_ALLOW => Decision::Allow,
        libc::SECCOMP_RET_ERRNO => Decision::Errno(result & 0xffff),
        other => panic!("unexpected seccomp action {other:#x}"),
    }
}

/// Compiles `policy`, checks the program as the kernel would, and checks that another architecture
/// (here 32-bit x86) is killed outright.
pub fn compile_checked(policy: &SeccompPolicy) -> CompiledSeccomp {
    let compiled = compile(policy).expect("compile");
    assert_eq!(compiled.programs().len(), 1, "one program");
    for program in compiled.programs() {
        check(program).unwrap_or_else(|error| panic!("the kernel would reject the program: {error}"));
        let i386 = run(program, 39, 0x4000_0003, [0; 6]);
        assert_eq!(i386.action, libc::SECCOMP_RET_KILL_PROCESS);
        assert!(!i386.read_args);
    }
    compiled
}

/// Arguments that are all 0 but `args[index]`.
pub fn with_arg(index: usize, value: u64) -> [u64; 6] {
    let mut args = [0; 6];
    args[index] = value;
    args
}

/// Checks `policy`'s program against `decide` for every number from 0 to 500 (and two x32 ones),
/// with each of a set of argument values that the conditions of a sandbox's policy look at (clone
/// flags, ioctl requests, personalities, address families, bits of either word) in each argument.
pub fn assert_compiled_matches_decide(policy: &SeccompPolicy) {
    let compiled = compile_checked(policy);
    let values = [
        libc::SIGCHLD as u64,
        libc::CLONE_NEWUSER as u64,
        (libc::CLONE_NEWUSER | libc::SIGCHLD) as u64,
        libc::CLONE_NEWNET as u64,
        1 << 40,
        libc::TIOCSTI,
        1 << 32 | libc::TIOCSTI,
        libc::TCGETS,
        libc::TIOCLINUX,
        0x8,
        0x2_0008,
        0xffff_ffff,
        0x1_ffff_ffff,
        libc::ADDR_NO_RANDOMIZE as u64,
        libc::AF_INET6 as u64,
        libc::AF_PACKET as u64,
        0x7,
        0,
        u64::MAX,
    ];
    let all_args: Vec<_> = (0..6).flat_map(|i| values.map(|v| with_arg(i, v))).collect();
    for nr in (0..=500).chain([X32 | libc::SYS_getpid, X32 | libc::SYS_ioctl]) {
        for &args in &all_args {
            let (got, want) = (compiled_decision(&compiled, nr, args), decide(policy, nr, args));
            assert_eq!(got, want, "syscall {nr} args {args:x?}");
        }
    }
}

/// Checks `policy`'s program against `decide` for each rule's number and its neighbours, on every
/// value the rule's condition mentions, each bit of its mask, and those values with either word
/// changed, in the rule's argument (or every argument).
pub fn assert_agrees_on_each_rule(policy: &SeccompPolicy) {
    let compiled = compile_checked(policy);
    for rule in &policy.rules {
        let (arg, mut values) = match &rule.action {
            RuleAction::AllowUnlessArgMasked { arg, mask, .. } => {
                let bits = (0..64).map(|bit| 1 << bit).filter(|bit| mask & bit != 0);
                (*arg, bits.chain([*mask, !mask]).collect())
            }
            RuleAction::AllowUnlessArgEquals { arg, values, .. }
            | RuleAction::AllowIfArgEquals { arg, values, .. } => (*arg, values.clone()),
            RuleAction::Allow | RuleAction::Errno(_) => (0, Vec::new()),
        };
        values.extend([0, u64::MAX]);
        let variants = values.iter().flat_map(|&v| {
            [
                v,
                v ^ 1,
                v.wrapping_add(1),
                v.wrapping_sub(1),
                v ^ 1 << 32,
                v | 0xffff_ffff << 32,
            ]
        });
        for value in variants {
            for args in [with_arg(usize::from(arg), value), [value; 6]] {
                for nr in [rule.nr - 1, rule.nr, rule.nr + 1] {
                    let (got, want) = (compiled_decision(&compiled, nr, args), decide(policy, nr, args));
                    assert_eq!(got, want, "syscall {nr} args {args:x?}");
                }
            }
        }
    }
}

/// Checks `policy`'s program against `decide` on `calls` random system calls (numbers and
/// arguments drawn with [`Rng`], mostly near what the policy lists).
pub fn assert_agrees_on_random_calls(policy: &SeccompPolicy, rng: &mut Rng, calls: usize) {
    let compiled = compile_checked(policy);
    let interesting = interesting_values(policy);
    for _ in 0..calls {
        let nr = random_nr(rng, policy);
        let args = [(); 6].map(|()| random_value(rng, &interesting));
        let (got, want) = (compiled_decision(&compiled, nr, args), decide(policy, nr, args));
        assert_eq!(got, want, "syscall {nr} args {args:x?} (rng state {:#x})", rng.0);
    }
}

/// SplitMix64: a deterministic pseudo-random sequence, so that a failure can be replayed.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value below `bound`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// The values a policy's conditions mention (and their single bits), which random arguments
/// should hit often, not by chance alone.
fn interesting_values(policy: &SeccompPolicy) -> Vec<u64> {
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
fn random_value(rng: &mut Rng, interesting: &[u64]) -> u64 {
    match rng.below(6) {
        0 => rng.next_u64(),
        1 => rng.next_u64() & 0xffff_ffff,
        2 => rng.below(64),
        3 => rng.pick(interesting) ^ (1 << rng.below(64)),
        4 => rng.pick(interesting) & 0xffff_ffff | rng.next_u64() << 32,
        _ => rng.pick(interesting),
    }
}

/// A random system call number: any 32-bit one, an x32 one, a boundary, a small one, or most often
/// a number `policy` lists or its neighbour.
fn random_nr(rng: &mut Rng, policy: &SeccompPolicy) -> i64 {
    match rng.below(8) {
        0 => rng.below(1 << 32) as i64,
        1 => X32 + rng.below(600) as i64,
        2 => rng.pick(&[0, X32 - 1, X32, i64::from(u32::MAX)]),
        3 => rng.below(1 << 12) as i64,
        _ if policy.rules.is_empty() => rng.below(600) as i64,
        _ => policy.rules[rng.below(policy.rules.len() as u64) as usize].nr + rng.pick(&[-1, 0, 0, 1]),
    }
}
