//! A classic-BPF assembler for seccomp filters that writes a program back to front.
//!
//! Each piece of code is placed before the code it continues to, so when a jump is written its targets
//! already have fixed places and its offsets are known: no labels to patch, no second pass. A
//! conditional jump reaches at most 255 instructions ahead (its offsets are `u8`); when a target is
//! farther, [`Assembler::jump`] first places a stand-in next to the jump: a copy of the target if it is a
//! return (a single instruction), an unconditional `JA` (32-bit offset) otherwise. Returns of the same
//! value are shared while they are in reach, which keeps a program to one return per action and
//! neighbourhood.
//!
//! Only the instructions the kernel's seccomp checker accepts are written, and only those its
//! constant-action emulation (`seccomp_is_const_allow`, which builds the per-filter cache of always
//! allowed system calls) understands: `LD W ABS`, `JA`, `JEQ`/`JGE`/`JSET` with a constant, `RET` a
//! constant.

use std::collections::BTreeMap;

use seccompiler::sock_filter;

/// `BPF_LD | BPF_W | BPF_ABS`: load a 32-bit word of `struct seccomp_data`.
pub(super) const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
/// `BPF_JMP | BPF_JA`: jump forward by `k`.
pub(super) const JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
/// `BPF_JMP | BPF_JEQ | BPF_K`: jump if the accumulator equals `k`.
pub(super) const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
/// `BPF_JMP | BPF_JGE | BPF_K`: jump if the accumulator is at least `k` (unsigned).
pub(super) const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
/// `BPF_JMP | BPF_JSET | BPF_K`: jump if the accumulator has any bit of `k` set.
pub(super) const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
/// `BPF_RET | BPF_K`: end the filter with the action `k`.
pub(super) const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// The farthest a conditional jump reaches.
const MAX_OFFSET: usize = u8::MAX as usize;

/// The place of an instruction, counted from the end of the program (0 is the last instruction).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Label(usize);

/// A program under construction, written back to front.
#[derive(Debug, Default)]
pub(super) struct Assembler {
    /// The instructions placed so far, last instruction first.
    reversed: Vec<sock_filter>,
    /// Where a return of each action was last placed.
    returns: BTreeMap<u32, Label>,
}

impl Assembler {
    /// The offset a jump placed next needs to land on `target`.
    fn distance(&self, target: Label) -> usize {
        self.reversed.len() - 1 - target.0
    }

    /// Whether a conditional jump placed next can land on `target`.
    pub(super) fn reaches(&self, target: Label) -> bool {
        self.distance(target) <= MAX_OFFSET
    }

    fn place(&mut self, code: u16, k: u32, jt: u8, jf: u8) -> Label {
        self.reversed.push(sock_filter { code, jt, jf, k });
        Label(self.reversed.len() - 1)
    }

    /// An unconditional jump to `target`, placed next.
    fn place_ja(&mut self, target: Label) -> Label {
        let offset = u32::try_from(self.distance(target)).expect("a program shorter than 2^32 instructions");
        self.place(JA, offset, 0, 0)
    }

    /// Ends the filter with `action` (a `SECCOMP_RET_*` value); reuses an earlier return in reach.
    pub(super) fn ret(&mut self, action: u32) -> Label {
        match self.returns.get(&action) {
            Some(&label) if self.reaches(label) => label,
            _ => {
                let label = self.place(RET, action, 0, 0);
                self.returns.insert(action, label);
                label
            }
        }
    }

    /// `target`, or a stand-in for it next to the instruction placed next if `target` is out of reach.
    fn within_reach(&mut self, target: Label) -> Label {
        if self.reaches(target) {
            return target;
        }
        let insn = &self.reversed[target.0];
        if insn.code == RET {
            let action = insn.k;
            self.ret(action)
        } else {
            self.place_ja(target)
        }
    }

    /// A conditional jump (`code` is [`JEQ`], [`JGE`] or [`JSET`] against `k`): to `then` if the
    /// condition holds, to `otherwise` if not.
    pub(super) fn jump(&mut self, code: u16, k: u32, then: Label, otherwise: Label) -> Label {
        let then = self.within_reach(then);
        let otherwise = self.within_reach(otherwise);
        // A stand-in placed for `otherwise` moved `then` one instruction away; if that put it out of
        // reach, its own stand-in goes next, and `otherwise`'s is then one instruction away.
        let then = self.within_reach(then);
        let offset =
            |target| u8::try_from(self.distance(target)).expect("within_reach keeps targets in reach");
        let (jt, jf) = (offset(then), offset(otherwise));
        self.place(code, k, jt, jf)
    }

    /// Loads the 32-bit word at `offset` of `struct seccomp_data`, then continues at `next`.
    pub(super) fn load(&mut self, offset: u32, next: Label) -> Label {
        if self.distance(next) != 0 {
            self.place_ja(next);
        }
        self.place(LD_W_ABS, offset, 0, 0)
    }

    /// The program, starting at `entry`.
    pub(super) fn finish(mut self, entry: Label) -> Vec<sock_filter> {
        if self.distance(entry) != 0 {
            self.place_ja(entry);
        }
        self.reversed.reverse();
        self.reversed
    }
}

#[cfg(test)]
mod tests {
    use super::super::interpret::{check, run};
    use super::*;

    /// Places `count` instructions that fall through.
    fn filler(asm: &mut Assembler, count: u32) {
        for k in 0..count {
            asm.place(JEQ, k, 0, 0);
        }
    }

    #[test]
    fn places_code_before_its_continuation() {
        let mut asm = Assembler::default();
        let allow = asm.ret(1);
        let deny = asm.ret(2);
        let test = asm.jump(JEQ, 7, allow, deny);
        let entry = asm.load(0, test);
        let insn = |code, k, jt, jf| sock_filter { code, jt, jf, k };
        let program = [
            insn(LD_W_ABS, 0, 0, 0),
            insn(JEQ, 7, 1, 0),
            insn(RET, 2, 0, 0),
            insn(RET, 1, 0, 0),
        ];
        assert_eq!(asm.finish(entry), program);
    }

    #[test]
    fn far_targets_get_stand_ins() {
        let mut asm = Assembler::default();
        let far_return = asm.ret(1);
        let far_code = asm.load(16, far_return);
        filler(&mut asm, 300);
        assert!(!asm.reaches(far_return) && !asm.reaches(far_code));
        let test = asm.jump(JEQ, 7, far_return, far_code);
        // A copy of the return, then a JA to the load, then the jump.
        let program = asm.finish(test);
        let insn = |code, k, jt, jf| sock_filter { code, jt, jf, k };
        assert_eq!(
            program[..3],
            [insn(JEQ, 7, 1, 0), insn(JA, 301, 0, 0), insn(RET, 1, 0, 0)]
        );
        assert_eq!(program[303..], [insn(LD_W_ABS, 16, 0, 0), insn(RET, 1, 0, 0)]);
    }

    /// `then` is just in reach until the stand-in for `otherwise` is placed, which pushes it out.
    #[test]
    fn a_stand_in_can_push_the_other_target_out_of_reach() {
        let mut asm = Assembler::default();
        let far_return = asm.ret(1);
        let far_code = asm.load(16, far_return);
        filler(&mut asm, 300);
        let near_return = asm.ret(2);
        filler(&mut asm, 255);
        assert!(asm.reaches(near_return) && !asm.reaches(far_code));
        let test = asm.jump(JEQ, 0, near_return, far_code);
        let program = asm.finish(test);
        let insn = |code, k, jt, jf| sock_filter { code, jt, jf, k };
        assert_eq!(
            program[..3],
            [insn(JEQ, 0, 0, 1), insn(RET, 2, 0, 0), insn(JA, 556, 0, 0)]
        );
        check(&program).expect("valid program");
        assert_eq!(run(&program, 0, 0, [0; 6]).action, 2);
    }
}
