//! A classic-BPF interpreter for seccomp filters, and the kernel's load-time checks, so that tests
//! can run compiled programs without installing them.

use seccompiler::sock_filter;

use super::bpf::{JA, JEQ, JGE, JSET, LD_W_ABS, RET};

/// `sizeof(struct seccomp_data)`.
const SECCOMP_DATA_SIZE: u32 = std::mem::size_of::<libc::seccomp_data>() as u32;

/// What one run of a program did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The action returned.
    pub action: u32,
    /// How many instructions ran, the return included.
    pub steps: usize,
    /// Whether the program read a system call argument (or the instruction pointer). The kernel caches
    /// a number as always allowed only if the filter returns `ALLOW` for it without such a read.
    pub read_args: bool,
}

/// Runs `program` over `struct seccomp_data { nr, arch, instruction_pointer: 0, args }` as the kernel
/// does. Panics on anything [`check`] would reject.
pub fn run(program: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> Run {
    let load = |offset: u32| -> u32 {
        match offset {
            0 => nr,
            4 => arch,
            8..16 => 0,
            16..64 => {
                let arg = args[(offset as usize - 16) / 8];
                // Little-endian: the low word first.
                if offset.is_multiple_of(8) {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            _ => panic!("load from offset {offset}"),
        }
    };
    let mut read_args = false;
    let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0usize);
    loop {
        let insn = &program[pc];
        pc += 1;
        steps += 1;
        let k = insn.k;
        let jump = |taken: bool| usize::from(if taken { insn.jt } else { insn.jf });
        match insn.code {
            LD_W_ABS => {
                read_args |= k >= 8;
                acc = load(k);
            }
            JA => pc += k as usize,
            JEQ => pc += jump(acc == k),
            JGE => pc += jump(acc >= k),
            JSET => pc += jump(acc & k != 0),
            RET => {
                return Run {
                    action: k,
                    steps,
                    read_args,
                }
            }
            code => panic!("unexpected BPF opcode {code:#x}"),
        }
    }
}

/// The checks the kernel makes when a filter is loaded (`bpf_check_classic` and
/// `seccomp_check_filter`), restricted to the instructions [`run`] knows: a length from 1 to 4096, the
/// last instruction a return, every jump landing inside the program, and every load aligned and
/// inside `struct seccomp_data`.
pub fn check(program: &[sock_filter]) -> Result<(), String> {
    if program.is_empty() || program.len() > libc::BPF_MAXINSNS as usize {
        return Err(format!("length {}", program.len()));
    }
    if program.last().is_none_or(|insn| insn.code != RET) {
        return Err("the last instruction is not a return".into());
    }
    for (pc, insn) in program.iter().enumerate() {
        let remaining = program.len() - pc - 1;
        let ok = match insn.code {
            LD_W_ABS => insn.k < SECCOMP_DATA_SIZE && insn.k.is_multiple_of(4),
            JA => (insn.k as usize) < remaining,
            JEQ | JGE | JSET => usize::from(insn.jt.max(insn.jf)) < remaining,
            RET => true,
            _ => false,
        };
        if !ok {
            return Err(format!("instruction {pc}: {insn:?}"));
        }
    }
    Ok(())
}
