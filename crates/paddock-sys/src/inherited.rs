//! Process attributes a program inherits from whoever started it, through `fork` and `exec` alike,
//! that a sandbox must not take from its creator: how it is scheduled (policy, nice value, I/O
//! priority) and its execution domain (`personality`, which can turn address-space randomization
//! off). An operator who starts `paddock serve` under `chrt -f`, `nice -n -10`, `ionice -c 1` or
//! `setarch -R` must not hand every sandbox a real-time policy, a raised priority or a predictable
//! address space.
//!
//! Signals and descriptors are `exec.rs`'s; resource limits are set by the sandbox's setup itself.
//! This module does not decide when to reset (the setup shim does, as host root, before it clones
//! the sandbox's init).

use std::io;

/// `IOPRIO_WHO_PROCESS` (`linux/ioprio.h`): `ioprio_set`'s `which` for one process.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;
/// `IOPRIO_CLASS_NONE` with level 0: no I/O priority of its own (the kernel derives one from the nice
/// value), what a process has unless someone set one.
const IOPRIO_DEFAULT: libc::c_int = 0;
/// `PER_LINUX` (`linux/personality.h`): the plain Linux execution domain, no flags.
const PER_LINUX: libc::c_ulong = 0;
/// `personality(2)`'s query argument: returns the current persona, changes nothing.
const PERSONALITY_QUERY: libc::c_ulong = 0xffff_ffff;

/// Gives the calling process the scheduling of a process nobody tuned: policy `SCHED_OTHER`, nice 0
/// and no I/O priority of its own.
///
/// Leaving `SCHED_IDLE` or bringing a positive nice value back to 0 raises the priority, which needs
/// `CAP_SYS_NICE` (the host's root has it before it enters a user namespace). Without it, those two
/// steps keep the lower priority rather than fail: a sandbox below the default is given nothing.
/// Whatever would keep a raised priority (a real-time policy, a negative nice value) is always
/// reset, or the call fails.
pub fn reset_scheduling() -> io::Result<()> {
    let denied = |e: &io::Error| matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES));
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads the sched_param it is given (a valid local) and changes only the
    // calling process's (pid 0) scheduling policy.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) } < 0 {
        let e = io::Error::last_os_error();
        if !(denied(&e) && scheduling_policy()? == libc::SCHED_IDLE) {
            return Err(e);
        }
    }
    if let Err(e) = rustix::process::setpriority_process(None, 0) {
        let e = io::Error::from(e);
        if !(denied(&e) && rustix::process::getpriority_process(None)? > 0) {
            return Err(e);
        }
    }
    // SAFETY: ioprio_set takes three integers and changes only the I/O priority of the calling process
    // (who = 0 with IOPRIO_WHO_PROCESS).
    if unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_DEFAULT) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets the calling process's execution domain to plain Linux (`PER_LINUX`, no flags): address-space
/// randomization on (`ADDR_NO_RANDOMIZE` cleared), readable mappings not executable by default
/// (`READ_IMPLIES_EXEC` cleared), and the other compatibility flags off.
pub fn reset_personality() -> io::Result<()> {
    // SAFETY: personality takes an integer and changes only the calling process's persona.
    if unsafe { libc::personality(PER_LINUX) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling process's execution domain and flags (`personality(0xffffffff)`).
pub fn personality() -> io::Result<u32> {
    // SAFETY: the query argument changes nothing; personality returns the current persona.
    let p = unsafe { libc::personality(PERSONALITY_QUERY) };
    if p < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p as u32)
}

/// The calling process's scheduling policy (`sched_getscheduler(0)`).
pub fn scheduling_policy() -> io::Result<i32> {
    // SAFETY: sched_getscheduler takes a pid (0: the caller) and returns its policy.
    let p = unsafe { libc::sched_getscheduler(0) };
    if p < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p)
}

/// The calling process's I/O priority as `ioprio_get` returns it (class << 13 | level).
pub fn io_priority() -> io::Result<i32> {
    // SAFETY: ioprio_get takes two integers and only reads the calling process's I/O priority.
    let p = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0) };
    if p < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(p as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::child_test::{in_child, run_in_child};

    const CHILD_ENV: &str = "PADDOCK_SYS_INHERITED_CHILD";
    /// `ADDR_NO_RANDOMIZE` (`linux/personality.h`).
    const ADDR_NO_RANDOMIZE: libc::c_ulong = 0x0040000;
    /// `READ_IMPLIES_EXEC`.
    const READ_IMPLIES_EXEC: libc::c_ulong = 0x0400000;
    /// `IOPRIO_CLASS_IDLE << 13`.
    const IOPRIO_IDLE: libc::c_int = 3 << 13;

    /// Gives this (child test) process `policy`, nice `nice` and the idle I/O class: all lower than
    /// the defaults, so no privilege is needed.
    fn lower_scheduling(policy: libc::c_int, nice: i32) {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: as in reset_scheduling, on this (child test) process only.
        assert_eq!(unsafe { libc::sched_setscheduler(0, policy, &param) }, 0);
        rustix::process::setpriority_process(None, nice).expect("nice");
        // SAFETY: as in reset_scheduling.
        assert_eq!(
            unsafe { libc::syscall(libc::SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_IDLE) },
            0
        );
    }

    #[test]
    fn a_tuned_process_is_reset_to_an_untuned_one() {
        let name = "inherited::tests::a_tuned_process_is_reset_to_an_untuned_one";
        if !in_child(CHILD_ENV, name) {
            run_in_child(CHILD_ENV, name);
            return;
        }
        // Tuned as an operator's shell might start a server.
        lower_scheduling(libc::SCHED_BATCH, 7);
        // SAFETY: as in reset_personality.
        assert!(unsafe { libc::personality(ADDR_NO_RANDOMIZE | READ_IMPLIES_EXEC) } >= 0);
        assert_eq!(scheduling_policy().expect("policy"), libc::SCHED_BATCH);
        assert_eq!(rustix::process::getpriority_process(None).expect("nice"), 7);
        assert_eq!(io_priority().expect("ioprio"), IOPRIO_IDLE);
        assert_eq!(
            personality().expect("personality") as libc::c_ulong,
            ADDR_NO_RANDOMIZE | READ_IMPLIES_EXEC
        );

        reset_scheduling().expect("reset scheduling");
        reset_personality().expect("reset personality");
        assert_eq!(scheduling_policy().expect("policy"), libc::SCHED_OTHER);
        assert_eq!(rustix::process::getpriority_process(None).expect("nice"), 0);
        assert_eq!(io_priority().expect("ioprio"), 0);
        assert_eq!(personality().expect("personality"), 0);
    }

    #[test]
    fn without_cap_sys_nice_a_lower_priority_is_kept_rather_than_refused() {
        let name = "inherited::tests::without_cap_sys_nice_a_lower_priority_is_kept_rather_than_refused";
        if !in_child(CHILD_ENV, name) {
            run_in_child(CHILD_ENV, name);
            return;
        }
        use rustix::thread::{capabilities, set_capabilities, CapabilitySet};
        let mut sets = capabilities(None).expect("capabilities");
        sets.effective.remove(CapabilitySet::SYS_NICE);
        sets.permitted.remove(CapabilitySet::SYS_NICE);
        set_capabilities(None, sets).expect("drop CAP_SYS_NICE");
        // Lowering needs no privilege.
        lower_scheduling(libc::SCHED_IDLE, 9);
        // Raising is refused here: the case the reset must get through.
        assert!(rustix::process::setpriority_process(None, 0).is_err());

        reset_scheduling().expect("a lower priority kept, not an error");
        assert_eq!(scheduling_policy().expect("policy"), libc::SCHED_IDLE);
        assert_eq!(rustix::process::getpriority_process(None).expect("nice"), 9);
        assert_eq!(
            io_priority().expect("ioprio"),
            0,
            "the I/O class is reset all the same"
        );
    }
}
