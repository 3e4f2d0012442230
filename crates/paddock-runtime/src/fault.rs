//! Named crash points, for the crash-consistency tests.
//!
//! `point("rollback.volume_retired")` kills this process with `SIGKILL` (exactly what `kill -9`
//! does: no destructor, no flush, locks released by the kernel) when the environment variable
//! `PADDOCK_FAULT` names that point. `PADDOCK_FAULT=name@N` waits for the point's N-th passage
//! (1-based). Before dying it writes one line to standard error, `paddock: fault point NAME reached`,
//! so a test can tell the point was really reached rather than the process dying of something else.
//!
//! Only debug builds have crash points: in a release build `point` is an empty function and the
//! variable is never read. The test suite runs debug builds.
//!
//! This module does not inject errors (a failing step is tested where it fails); it only stops the
//! process, as a crash or an operator's `kill -9` would.

/// The environment variable naming the armed point.
pub const FAULT_ENV: &str = "PADDOCK_FAULT";

/// A crash point named `name` (see the module docs).
#[inline]
pub fn point(name: &str) {
    #[cfg(debug_assertions)]
    armed::reach(name);
    #[cfg(not(debug_assertions))]
    let _ = name;
}

#[cfg(debug_assertions)]
mod armed {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    /// The armed point and the passage to die at, read once.
    fn armed() -> Option<&'static (String, u64)> {
        static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let value = std::env::var(super::FAULT_ENV).ok()?;
                Some(match value.rsplit_once('@') {
                    Some((name, n)) => (name.to_owned(), n.parse().ok().filter(|n| *n > 0)?),
                    None => (value, 1),
                })
            })
            .as_ref()
    }

    pub(super) fn reach(name: &str) {
        static PASSAGES: AtomicU64 = AtomicU64::new(0);
        let Some((armed, at)) = armed() else { return };
        if armed != name || PASSAGES.fetch_add(1, Ordering::SeqCst) + 1 != *at {
            return;
        }
        let _ = writeln!(std::io::stderr(), "paddock: fault point {name} reached");
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught: the process is gone before this line.
        std::process::abort();
    }
}
