//! Keeping a sandbox across an `exec` of its owner: a `paddock run` that has run for a while replaces
//! its own program with a small waiter, which replaces itself with `paddock` again to tear the
//! sandbox down (crates/paddock `run_lean.rs`). The process stays the same, so the init stays its
//! child (or, for a sandbox made ahead and claimed, stays someone else's, reached through its pidfd
//! only); what must survive the execs is the run directory's lock and the init's pidfd.
//!
//! [`NativeBackend::keep_across_exec`] clears their close-on-exec flags and names them in a
//! [`KeptAcrossExec`]; [`NativeBackend::take_back`] rebuilds the handle from one, after checking that
//! each descriptor is what it claims to be. This module does not exec, and it hands over nothing
//! else: a handle taken back has no prepared copy and no network.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::str::FromStr;
use std::sync::Mutex;

use paddock_types::SandboxId;

use super::lock::StateLock;
use super::sandbox::{BootSpec, InitRecord, NativeSandbox};
use super::NativeBackend;
use crate::{AnyHandle, RuntimeError, SandboxHandle};

/// The descriptors and pid that carry a sandbox across an exec, as text
/// (`lock=9,pidfd=11,init=42,child=1`, `pidfd=-` when there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeptAcrossExec {
    lock: RawFd,
    pidfd: Option<RawFd>,
    init_pid: i32,
    /// The init is this process's child; otherwise (a sandbox made ahead and claimed) it is watched
    /// and killed through its pidfd only, never by its pid.
    child: bool,
}

impl fmt::Display for KeptAcrossExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock={},pidfd=", self.lock)?;
        match self.pidfd {
            Some(fd) => write!(f, "{fd}")?,
            None => f.write_str("-")?,
        }
        write!(f, ",init={},child={}", self.init_pid, u8::from(self.child))
    }
}

/// Text that is not a [`KeptAcrossExec`].
#[derive(Debug, thiserror::Error)]
#[error("not a kept sandbox: {0:?}")]
pub struct BadKept(String);

impl FromStr for KeptAcrossExec {
    type Err = BadKept;

    fn from_str(s: &str) -> Result<Self, BadKept> {
        let bad = || BadKept(s.chars().take(80).collect());
        let mut fields = s.split(',');
        let mut field = |name: &str| -> Result<&str, BadKept> {
            fields
                .next()
                .and_then(|f| f.strip_prefix(name))
                .and_then(|f| f.strip_prefix('='))
                .ok_or_else(bad)
        };
        let number = |v: &str| v.parse::<i32>().ok().filter(|n| *n > 0).ok_or_else(bad);
        let lock = number(field("lock")?)?;
        let pidfd = match field("pidfd")? {
            "-" => None,
            v => Some(number(v)?),
        };
        let init_pid = number(field("init")?)?;
        let child = match field("child")? {
            "1" => true,
            "0" => false,
            _ => return Err(bad()),
        };
        if fields.next().is_some() {
            return Err(bad());
        }
        Ok(Self {
            lock,
            pidfd,
            init_pid,
            child,
        })
    }
}

fn mismatch(what: &str) -> RuntimeError {
    RuntimeError::Unsupported(format!("cannot take the sandbox back: {what}"))
}

impl NativeBackend {
    /// Lets `handle`'s lock and pidfd survive this process's next `exec`, and names them. Only for a
    /// sandbox whose init is this process's child or has a pidfd (one made ahead and claimed).
    pub fn keep_across_exec(&self, handle: &SandboxHandle) -> Result<KeptAcrossExec, RuntimeError> {
        let sb = handle.native()?;
        if !sb.child && sb.pidfd.is_none() {
            return Err(mismatch("its init is not this process's child and has no pidfd"));
        }
        let keep = |fd: std::os::fd::BorrowedFd<'_>| {
            paddock_sys::exec::keep_across_exec(fd).map_err(|source| RuntimeError::State {
                what: "keep a descriptor across exec",
                path: sb.run_dir.clone(),
                source,
            })
        };
        keep(sb._lock.as_fd())?;
        if let Some(fd) = &sb.pidfd {
            keep(fd.as_fd())?;
        }
        Ok(KeptAcrossExec {
            lock: sb._lock.as_fd().as_raw_fd(),
            pidfd: sb.pidfd.as_ref().map(|fd| fd.as_raw_fd()),
            init_pid: sb.init_pid,
            child: sb.child,
        })
    }

    /// Ends the sandbox's processes (SIGKILL to its init, through its pidfd) without waiting, and
    /// keeps its lock and pidfd across a spawn, for the process spawned to finish its teardown with
    /// [`Self::take_back`] (`paddock run --keep-ready` leaves it to the maker it starts). The record
    /// says the init is not that process's child, so it is reached through the pidfd only.
    pub fn end_for_another_process(&self, handle: &SandboxHandle) -> Result<KeptAcrossExec, RuntimeError> {
        let sb = handle.native()?;
        if sb.pidfd.is_none() {
            return Err(mismatch("its init has no pidfd"));
        }
        super::sandbox::kill_init(sb);
        let kept = self.keep_across_exec(handle)?;
        Ok(KeptAcrossExec { child: false, ..kept })
    }

    /// The handle of sandbox `id`, kept across an exec by [`Self::keep_across_exec`]: its lock must be
    /// the lock file of `id`'s run directory and held through the inherited descriptor, and its init
    /// the one `<run>/init.pid` records. A pidfd that names another process is closed and not used
    /// (refused, for an init that is not this process's child).
    pub fn take_back(&self, id: &SandboxId, kept: &KeptAcrossExec) -> Result<SandboxHandle, RuntimeError> {
        let run_dir = self.run_dir(id.as_str());
        let take = |fd: RawFd| {
            paddock_sys::exec::take_inherited_fd(fd).map_err(|source| RuntimeError::State {
                what: "inherited descriptor",
                path: run_dir.clone(),
                source,
            })
        };
        let lock = StateLock::inherited(take(kept.lock)?, &run_dir.join("lock"))?;
        let pidfd = kept.pidfd.map(take).transpose()?;
        match InitRecord::read(&run_dir) {
            Some(record) if record.pid == kept.init_pid => {}
            _ => return Err(mismatch("its init is not the one its run directory records")),
        }
        let pidfd = match pidfd {
            Some(fd) if pidfd_names(&fd, kept.init_pid) => Some(fd),
            // Someone else's child, exited and reaped: its pidfd is still the only safe way to it.
            Some(fd) if !kept.child && pidfd_names(&fd, -1) => Some(fd),
            _ if kept.child => None,
            _ => {
                return Err(mismatch(
                    "the pidfd of an init that is not this process's child is not its",
                ))
            }
        };
        Ok(SandboxHandle {
            id: id.clone(),
            agent_socket: run_dir.join("agent.sock"),
            network: None,
            inner: AnyHandle::Native(NativeSandbox {
                cgroup: self.cgroups.sandbox(id.as_str()),
                init_pid: kept.init_pid,
                pidfd,
                // As the keeper recorded: the same process keeps its child; another has none.
                child: kept.child,
                reaped: false,
                boot: BootSpec::read(&run_dir),
                freezer: Mutex::new(()),
                next: Mutex::new(None),
                run_dir,
                _lock: lock,
            }),
        })
    }
}

/// Whether pidfd `fd` refers to process `pid` (its `Pid:` line in `/proc/self/fdinfo`; -1 once the
/// process has exited and been reaped, which is not `pid` either).
fn pidfd_names(fd: &OwnedFd, pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("Pid:"))
                .and_then(|v| v.trim().parse::<i32>().ok())
        })
        == Some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_descriptors_read_back_as_written_and_nothing_else_parses() {
        for kept in [
            KeptAcrossExec {
                lock: 9,
                pidfd: Some(11),
                init_pid: 4242,
                child: true,
            },
            KeptAcrossExec {
                lock: 3,
                pidfd: None,
                init_pid: 1,
                child: true,
            },
            KeptAcrossExec {
                lock: 3,
                pidfd: Some(5),
                init_pid: 77,
                child: false,
            },
        ] {
            assert_eq!(kept.to_string().parse::<KeptAcrossExec>().expect("test"), kept);
        }
        assert_eq!(
            KeptAcrossExec {
                lock: 9,
                pidfd: Some(11),
                init_pid: 4242,
                child: true,
            }
            .to_string(),
            "lock=9,pidfd=11,init=4242,child=1"
        );
        for bad in [
            "",
            "lock=9",
            "lock=9,pidfd=11",
            "lock=9,pidfd=11,init=42",
            "lock=9,pidfd=11,init=42,child=2",
            "lock=9,pidfd=11,init=42,child=1,extra=1",
            "pidfd=11,lock=9,init=42",
            "lock=-1,pidfd=11,init=42",
            "lock=0,pidfd=11,init=42",
            "lock=9,pidfd=x,init=42",
            "lock=9,pidfd=11,init=0",
            "lock =9,pidfd=11,init=42",
        ] {
            assert!(bad.parse::<KeptAcrossExec>().is_err(), "{bad:?} parsed");
        }
    }
}
