//! Freezing a sandbox: every one of its processes stopped at once, through the cgroup2 freezer.
//!
//! Writing `1` to `cgroup.freeze` asks the kernel to stop every process of the cgroup at its next
//! return to user space; `cgroup.events` says `frozen 1` once all have stopped. Frozen processes use
//! no CPU, keep their memory, and can still be killed. The freezer is part of every cgroup2 directory,
//! controller or not: the sandbox's own cgroup on pure v2, its controller-less one on a hybrid v1 host
//! (`/sys/fs/cgroup/unified`). A v1 host without a cgroup2 mount has no such cgroup, and freezing is
//! unsupported there (the v1 `freezer` hierarchy is not used: sandboxes do not join it).
//!
//! The freeze state lives in the kernel, not in paddock: a sandbox paused by one process is seen
//! paused by the next (adoption after a restart).

use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{io_err, write_file, SandboxCgroup};
use crate::RuntimeError;

impl SandboxCgroup {
    /// The cgroup2 directory whose freezer holds every process of the sandbox.
    fn freezer(&self) -> Result<&Path, RuntimeError> {
        self.unified.as_deref().ok_or_else(|| {
            RuntimeError::Unsupported(
                "freezing a sandbox needs a cgroup2 hierarchy (pure v2, or v1 with cgroup2 mounted at \
                 /sys/fs/cgroup/unified); this host has cgroup v1 only"
                    .into(),
            )
        })
    }

    /// Whether the sandbox is asked to be frozen (`cgroup.freeze` is 1): paused, or in the middle of a
    /// snapshot.
    pub fn frozen(&self) -> Result<bool, RuntimeError> {
        let path = self.freezer()?.join("cgroup.freeze");
        let text = fs::read_to_string(&path).map_err(io_err(&path, "read"))?;
        Ok(text.trim() == "1")
    }

    /// Freezes every process of the sandbox and waits (up to `deadline`) until all of them have
    /// stopped. On failure the sandbox is left thawed.
    pub fn freeze(&self, deadline: Duration) -> Result<(), RuntimeError> {
        let dir = self.freezer()?;
        write_file(&dir.join("cgroup.freeze"), "1")?;
        let events = dir.join("cgroup.events");
        let start = Instant::now();
        let mut pause = Duration::from_micros(20);
        loop {
            let text = match fs::read_to_string(&events) {
                Ok(text) => text,
                Err(e) => {
                    let _ = self.thaw();
                    return Err(io_err(&events, "read")(e));
                }
            };
            if events_say_frozen(&text) {
                return Ok(());
            }
            if start.elapsed() > deadline {
                let _ = self.thaw();
                return Err(io_err(&events, "wait for frozen in")(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the sandbox's processes did not all stop within {deadline:?}"),
                )));
            }
            // Freezing takes tens of microseconds unless a process is busy in the kernel.
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Lets the sandbox's processes run again. Thawing a sandbox that is not frozen does nothing.
    pub fn thaw(&self) -> Result<(), RuntimeError> {
        write_file(&self.freezer()?.join("cgroup.freeze"), "0")
    }
}

/// Whether a `cgroup.events` file says every process has stopped (`frozen 1`).
fn events_say_frozen(events: &str) -> bool {
    events.lines().any(|l| l.split_whitespace().eq(["frozen", "1"]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_line() {
        assert!(events_say_frozen("populated 1\nfrozen 1\n"));
        assert!(!events_say_frozen("populated 1\nfrozen 0\n"));
        assert!(!events_say_frozen("populated 0\n"));
        assert!(!events_say_frozen("unfrozen 1\n"));
    }
}
