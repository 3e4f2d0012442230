//! Process attributes that bound privilege: capabilities, `no_new_privs` and dumpability.
//!
//! Every function here is one or a few `prctl`/`capget`/`capset` calls through rustix's safe wrappers,
//! with no allocation, no locks and no reading of files, so all of them may be called in a `pre_exec`
//! closure between `fork` and `exec`, where only async-signal-safe operations are allowed.
//!
//! What this module does not do: decide which capabilities a sandbox keeps (that is policy, in the
//! caller) or change user ids.

use std::io;

use rustix::thread::{CapabilitySet, CapabilitySets};

/// The highest capability number this code will ever try; the kernel's own last capability
/// (`/proc/sys/kernel/cap_last_cap`, 40 on Linux 6.18) is found by probing below this, since
/// `/proc` may not be mounted where these functions run.
const CAP_PROBE_LIMIT: u32 = 63;

/// Sets `no_new_privs` on the calling thread (`prctl(PR_SET_NO_NEW_PRIVS, 1)`): from now on `execve`
/// can never grant privileges (setuid bits and file capabilities are ignored). Irreversible and
/// inherited by children. Async-signal-safe.
pub fn set_no_new_privs() -> io::Result<()> {
    Ok(rustix::thread::set_no_new_privs(true)?)
}

/// Sets or clears the calling process's dumpable flag (`prctl(PR_SET_DUMPABLE)`). A non-dumpable
/// process produces no core dump and cannot be ptrace-attached or have its `/proc/<pid>` files opened
/// by same-uid processes. Note that `execve` resets the flag. Async-signal-safe.
pub fn set_dumpable(on: bool) -> io::Result<()> {
    let behavior = if on {
        rustix::process::DumpableBehavior::Dumpable
    } else {
        rustix::process::DumpableBehavior::NotDumpable
    };
    Ok(rustix::process::set_dumpable_behavior(behavior)?)
}

/// Drops every capability of the calling thread, irreversibly:
///
/// 1. clears the ambient set (`PR_CAP_AMBIENT_CLEAR_ALL`);
/// 2. removes every capability the kernel knows from the bounding set (`PR_CAPBSET_DROP`), so no
///    later `execve` of a file with capabilities can regain them; the kernel's last capability is
///    found by probing `PR_CAPBSET_READ` (it answers `EINVAL` past the end), not by reading `/proc`;
/// 3. empties the effective, permitted and inheritable sets (`capset`).
///
/// Needs `CAP_SETPCAP` (in the current user namespace) for step 2, which is why it runs before step 3.
/// Does not allocate and takes no locks: safe to call in a `pre_exec` closure after `fork`.
pub fn drop_all_capabilities() -> io::Result<()> {
    drop_bounding_except(&[])?;
    clear_capability_sets()
}

/// Steps 1 and 3 of [`drop_all_capabilities`]: empties the ambient, effective, permitted and
/// inheritable sets, leaving the bounding set alone (for a caller that already dropped it).
/// Async-signal-safe.
pub fn clear_capability_sets() -> io::Result<()> {
    rustix::thread::clear_ambient_capability_set()?;
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    Ok(rustix::thread::set_capabilities(None, none)?)
}

/// Removes from the calling thread's bounding set every capability whose number is not in `keep`
/// (numbers as in `linux/capability.h`: `CAP_CHOWN` = 0, `CAP_NET_BIND_SERVICE` = 10, ...). Capabilities already absent are skipped, so this
/// only needs `CAP_SETPCAP` when something is actually dropped. The effective, permitted, inheritable
/// and ambient sets are left alone. Does not allocate: safe to call in a `pre_exec` closure.
pub fn drop_bounding_except(keep: &[u32]) -> io::Result<()> {
    for cap in 0..=CAP_PROBE_LIMIT {
        let set = CapabilitySet::from_bits_retain(1 << cap);
        match rustix::thread::capability_is_in_bounding_set(set) {
            Ok(true) if !keep.contains(&cap) => rustix::thread::remove_capability_from_bounding_set(set)?,
            Ok(_) => {}
            // Past the kernel's last capability.
            Err(rustix::io::Errno::INVAL) => break,
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

/// The capabilities in the calling thread's bounding set, as a bit mask.
pub fn bounding_set() -> io::Result<u64> {
    let mut mask = 0u64;
    for cap in 0..=CAP_PROBE_LIMIT {
        let set = CapabilitySet::from_bits_retain(1 << cap);
        match rustix::thread::capability_is_in_bounding_set(set) {
            Ok(true) => mask |= 1 << cap,
            Ok(false) => {}
            Err(rustix::io::Errno::INVAL) => break,
            Err(err) => return Err(err.into()),
        }
    }
    Ok(mask)
}

/// Drops the capabilities of `mask` (from [`bounding_set`]) from the bounding set: one system call
/// per capability present instead of one per capability the kernel knows. Async-signal-safe.
pub fn drop_bounding_set(mask: u64) -> io::Result<()> {
    for cap in 0..=CAP_PROBE_LIMIT {
        if mask & (1 << cap) != 0 {
            rustix::thread::remove_capability_from_bounding_set(CapabilitySet::from_bits_retain(1 << cap))?;
        }
    }
    Ok(())
}

/// The calling thread's effective capability set as a bit mask (bit `n` is capability `n`), from
/// `capget`.
pub fn current_effective_caps() -> io::Result<u64> {
    Ok(rustix::thread::capabilities(None)?.effective.bits())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::child_test::{in_child, run_in_child};

    /// Set in the environment of a child test process; its value is the test to run there. Dropping
    /// capabilities is irreversible and would otherwise affect the other tests, so those tests run in a
    /// fresh process (see [`crate::child_test`]).
    const CHILD_ENV: &str = "PADDOCK_SYS_CAPS_CHILD";

    fn bounding_probe(cap: u32) -> rustix::io::Result<bool> {
        rustix::thread::capability_is_in_bounding_set(CapabilitySet::from_bits_retain(1 << cap))
    }

    /// The capability numbers the kernel knows, found the way `drop_bounding_except` finds them.
    fn known_caps() -> u32 {
        (0..=CAP_PROBE_LIMIT)
            .take_while(|&cap| bounding_probe(cap).is_ok())
            .count() as u32
    }

    fn bounding_set() -> Vec<u32> {
        (0..known_caps())
            .filter(|&cap| bounding_probe(cap).expect("PR_CAPBSET_READ"))
            .collect()
    }

    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn drop_all_capabilities_in_child() {
        if !is_root() {
            eprintln!("SKIPPED: dropping capabilities needs a process that has some (run as root)");
            return;
        }
        let name = "caps::tests::drop_all_capabilities_in_child";
        if in_child(CHILD_ENV, name) {
            child_drop_all();
        } else {
            run_in_child(CHILD_ENV, name);
        }
    }

    /// The body of `drop_all_capabilities_in_child`, run in its child process.
    fn child_drop_all() {
        assert!(
            in_child(CHILD_ENV, "caps::tests::drop_all_capabilities_in_child"),
            "run through drop_all_capabilities_in_child"
        );
        assert_ne!(
            current_effective_caps().expect("capget"),
            0,
            "root starts with capabilities"
        );
        let last_cap: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .expect("cap_last_cap")
            .trim()
            .parse()
            .expect("number");
        assert_eq!(
            known_caps(),
            last_cap + 1,
            "probing finds the kernel's last capability"
        );
        assert!(!bounding_set().is_empty(), "something to drop to start with");

        drop_all_capabilities().expect("drop all");
        assert_eq!(current_effective_caps().expect("capget"), 0);
        let sets = rustix::thread::capabilities(None).expect("capget");
        assert!(sets.permitted.is_empty() && sets.inheritable.is_empty());
        assert!(
            bounding_set().is_empty(),
            "bounding set not empty: {:?}",
            bounding_set()
        );
        // Root without CAP_SYS_ADMIN: a privileged operation now fails.
        assert_eq!(
            rustix::system::sethostname(b"x").err(),
            Some(rustix::io::Errno::PERM)
        );
        // Idempotent.
        drop_all_capabilities().expect("drop all again");
    }

    #[test]
    fn drop_bounding_except_in_child() {
        if !is_root() {
            eprintln!("SKIPPED: dropping bounding capabilities needs CAP_SETPCAP (run as root)");
            return;
        }
        let name = "caps::tests::drop_bounding_except_in_child";
        if in_child(CHILD_ENV, name) {
            child_drop_bounding_except();
        } else {
            run_in_child(CHILD_ENV, name);
        }
    }

    /// The body of `drop_bounding_except_in_child`, run in its child process.
    fn child_drop_bounding_except() {
        assert!(
            in_child(CHILD_ENV, "caps::tests::drop_bounding_except_in_child"),
            "run through drop_bounding_except_in_child"
        );
        let before = current_effective_caps().expect("capget");
        // Numbers from linux/capability.h (the libc crate does not define them).
        const CAP_CHOWN: u32 = 0;
        const CAP_NET_BIND_SERVICE: u32 = 10;
        let keep = [CAP_NET_BIND_SERVICE, CAP_CHOWN];
        drop_bounding_except(&keep).expect("drop bounding");
        assert_eq!(bounding_set(), vec![CAP_CHOWN, CAP_NET_BIND_SERVICE]);
        assert_eq!(
            current_effective_caps().expect("capget"),
            before,
            "effective set untouched"
        );
    }

    #[test]
    fn no_new_privs_and_dumpable_in_child() {
        let name = "caps::tests::no_new_privs_and_dumpable_in_child";
        if in_child(CHILD_ENV, name) {
            child_no_new_privs_and_dumpable();
        } else {
            run_in_child(CHILD_ENV, name);
        }
    }

    /// The body of `no_new_privs_and_dumpable_in_child`, run in its child process.
    fn child_no_new_privs_and_dumpable() {
        assert!(
            in_child(CHILD_ENV, "caps::tests::no_new_privs_and_dumpable_in_child"),
            "run through its parent test"
        );
        set_no_new_privs().expect("set no_new_privs");
        assert!(rustix::thread::no_new_privs().expect("get no_new_privs"));
        set_dumpable(false).expect("not dumpable");
        assert_eq!(
            rustix::process::dumpable_behavior().expect("get dumpable"),
            rustix::process::DumpableBehavior::NotDumpable
        );
        set_dumpable(true).expect("dumpable");
        assert_eq!(
            rustix::process::dumpable_behavior().expect("get dumpable"),
            rustix::process::DumpableBehavior::Dumpable
        );
    }
}
