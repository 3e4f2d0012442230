//! Taking over sandboxes an earlier process created (a `paddock serve` restart), and reclaiming one
//! sandbox by id.
//!
//! A sandbox created with `die_with_parent: false` outlives its creator. What proves it is still the
//! same sandbox: its run directory's lock is free (its owner is gone), `<run>/init.pid` names a
//! process that is alive, started at the recorded time (so a reused pid is never mistaken for it) and
//! sits in the sandbox's cgroup, and its agent answers a handshake. The adopter then holds the lock
//! and a pidfd of the init; the init is not its child, so teardown watches the pidfd instead of
//! waiting for it.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use paddock_types::SandboxId;

use super::lifecycle::{state_err, wait_exit, BootSpec, NativeSandbox};
use super::lock::StateLock;
use super::NativeBackend;
use crate::agent_client;
use crate::{Adoption, AnyHandle, RuntimeError, SandboxHandle};

/// How long adoption waits for the agent's handshake before declaring the sandbox dead.
const ADOPT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// `<run>/init.pid`: the init's host pid and start time (clock ticks after boot, field 22 of
/// `/proc/<pid>/stat`), as `"<pid> <start time>\n"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct InitRecord {
    pid: i32,
    start_time: u64,
}

impl InitRecord {
    const FILE: &'static str = "init.pid";

    /// The record of the live (or not yet reaped) process `pid`.
    pub(super) fn of(pid: i32) -> Result<Self, RuntimeError> {
        let start_time = process_start_time(pid).map_err(|e| {
            RuntimeError::Setup(format!(
                "cannot read the start time of the sandbox init {pid}: {e}"
            ))
        })?;
        Ok(Self { pid, start_time })
    }

    /// Writes the record into `run_dir`, atomically (a temporary file renamed into place).
    pub(super) fn write(&self, run_dir: &Path) -> Result<(), RuntimeError> {
        let staging = run_dir.join(format!(".{}.new", Self::FILE));
        let path = run_dir.join(Self::FILE);
        fs::write(&staging, format!("{} {}\n", self.pid, self.start_time))
            .map_err(state_err("write", &staging))?;
        fs::rename(&staging, &path).map_err(state_err("rename", &staging))
    }

    fn read(run_dir: &Path) -> Option<Self> {
        Self::parse(&fs::read_to_string(run_dir.join(Self::FILE)).ok()?)
    }

    /// Kills the init recorded in `run_dir` if that very process (same pid and start time) still
    /// runs, which ends its PID namespace; for an init that shares its cgroups with another sandbox's
    /// (one prepared for a rollback) and so cannot be killed through them.
    pub(super) fn kill_recorded(run_dir: &Path) {
        let Some(record) = Self::read(run_dir) else { return };
        if process_start_time(record.pid).ok() == Some(record.start_time) {
            if let Some(pid) = rustix::process::Pid::from_raw(record.pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }

    fn parse(text: &str) -> Option<Self> {
        let mut fields = text.split_whitespace();
        let pid = fields.next()?.parse().ok().filter(|p| *p > 0)?;
        let start_time = fields.next()?.parse().ok()?;
        fields.next().is_none().then_some(Self { pid, start_time })
    }
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat`. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn process_start_time(pid: i32) -> io::Result<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_start_time(&stat).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))
}

fn parse_start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts at field 3 (state), so field 22 is the 20th.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Who owns a sandbox's run directory.
enum Ownership {
    /// Nobody did: this process holds the lock now.
    Taken(StateLock),
    /// A live process holds the lock.
    Busy,
    /// There is no run directory; `leftovers` when cgroups or a subvolume of the id remain anyway.
    NoRunDir { leftovers: bool },
}

impl NativeBackend {
    /// Tries to take sandbox `id`'s lock. Leftovers are looked for before the run directory, which a
    /// sandbox being created gets before its cgroups and subvolume: a sandbox being born is never
    /// mistaken for leftovers.
    fn take_ownership(&self, id: &str) -> Result<Ownership, RuntimeError> {
        let leftovers = self.cgroups.sandbox(id).exists() || self.pool.volume_path(id).exists();
        let run_dir = self.run_dir(id);
        match StateLock::try_acquire(&run_dir.join("lock")) {
            Ok(Some(lock)) => Ok(Ownership::Taken(lock)),
            Ok(None) => Ok(Ownership::Busy),
            Err(_) if !run_dir.exists() => Ok(Ownership::NoRunDir { leftovers }),
            Err(e) => Err(e),
        }
    }

    /// [`SandboxBackend::adopt_sandbox`](crate::SandboxBackend::adopt_sandbox).
    pub(super) fn adopt(&self, id: &SandboxId) -> Result<Adoption, RuntimeError> {
        let lock = match self.take_ownership(id.as_str())? {
            Ownership::Taken(lock) => lock,
            Ownership::Busy => return Ok(Adoption::Busy),
            Ownership::NoRunDir { leftovers: false } => return Ok(Adoption::Missing),
            Ownership::NoRunDir { leftovers: true } => {
                tracing::info!(sandbox_id = %id, "reclaiming the leftovers of a sandbox without a run directory");
                self.reclaim(id.as_str())?;
                return Ok(Adoption::Dead);
            }
        };
        let run_dir = self.run_dir(id.as_str());
        let cgroup = self.cgroups.sandbox(id.as_str());
        let why_dead = match self.live_init(&run_dir, &cgroup) {
            Err(why) => why,
            Ok((record, pidfd)) => {
                let socket = run_dir.join("agent.sock");
                // A paused sandbox's agent cannot answer: thawed for the handshake, frozen again after.
                let paused = cgroup.frozen().unwrap_or(false);
                if paused {
                    cgroup.thaw()?;
                }
                let answer = agent_client::probe(&socket, ADOPT_CONNECT_TIMEOUT);
                if paused {
                    if let Err(e) = cgroup.freeze(ADOPT_CONNECT_TIMEOUT) {
                        tracing::warn!(sandbox_id = %id, error = %e, "a paused sandbox could not be paused again");
                    }
                }
                match answer {
                    Ok(()) => {
                        tracing::info!(sandbox_id = %id, pid = record.pid, paused, "adopted sandbox");
                        let boot = BootSpec::read(&run_dir);
                        return Ok(Adoption::Alive(SandboxHandle {
                            id: id.clone(),
                            agent_socket: socket,
                            network: boot.as_ref().and_then(|b| b.network.as_ref()).map(|n| n.link()),
                            inner: AnyHandle::Native(NativeSandbox {
                                run_dir,
                                cgroup,
                                init_pid: record.pid,
                                pidfd: Some(pidfd),
                                child: false,
                                reaped: false,
                                boot,
                                freezer: Mutex::new(()),
                                next: Mutex::new(None),
                                _lock: lock,
                            }),
                        }));
                    }
                    Err(e) => format!("its agent does not answer (within {ADOPT_CONNECT_TIMEOUT:?}): {e}"),
                }
            }
        };
        tracing::info!(sandbox_id = %id, reason = %why_dead, "reclaiming a sandbox that did not survive");
        // The lock is held until everything is gone.
        let reclaimed = self.reclaim(id.as_str());
        drop(lock);
        reclaimed.map(|()| Adoption::Dead)
    }

    /// The sandbox's init, if it still runs: its record and a pidfd of it. Otherwise why not.
    fn live_init(
        &self,
        run_dir: &Path,
        cgroup: &super::cgroup::SandboxCgroup,
    ) -> Result<(InitRecord, OwnedFd), String> {
        let record = InitRecord::read(run_dir).ok_or("it has no readable init.pid")?;
        let pidfd = paddock_sys::namespace::pidfd_open(record.pid)
            .map_err(|e| format!("its init {} is gone ({e})", record.pid))?;
        // Checked after the pidfd was opened: if the pid named another process by now, its start
        // time differs (a process started later cannot have the init's start time).
        match process_start_time(record.pid) {
            Ok(t) if t == record.start_time => {}
            _ => return Err(format!("pid {} is no longer its init", record.pid)),
        }
        if !cgroup.contains(record.pid) {
            return Err(format!("its init {} is not in its cgroup", record.pid));
        }
        if wait_exit(&pidfd, Some(Duration::ZERO)) {
            reap_if_child(&pidfd);
            return Err(format!("its init {} has exited", record.pid));
        }
        Ok((record, pidfd))
    }

    /// [`SandboxBackend::park_sandbox`](crate::SandboxBackend::park_sandbox): whatever runs of sandbox `id` ends
    /// (its init, its prepared copy, anything in its cgroups), its run directory, cgroups and link go,
    /// and its file system is kept as a stopped sandbox's (moved to `stopped/` unless it is there
    /// already). Whether a kept file system exists now.
    pub(super) fn park(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        let _lock = match self.take_ownership(id.as_str())? {
            Ownership::Busy => {
                return Err(RuntimeError::Unsupported(format!(
                    "sandbox {id} is held by another process"
                )))
            }
            Ownership::Taken(lock) => Some(lock),
            Ownership::NoRunDir { .. } => None,
        };
        let run_dir = self.run_dir(id.as_str());
        let cgroup = self.cgroups.sandbox(id.as_str());
        InitRecord::kill_recorded(&run_dir);
        if cgroup.exists() {
            // Frozen processes take SIGKILL only once thawed.
            if cgroup.frozen().unwrap_or(false) {
                cgroup.thaw()?;
            }
            cgroup.kill_all(super::lifecycle::KILL_DEADLINE)?;
        }
        // Nothing writes to the files any more: they go aside before anything is removed.
        self.pool.return_stopped(id.as_str())?;
        self.cleanup(id.as_str(), &cgroup, &run_dir)?;
        Ok(self.pool.stopped_path(id.as_str()).exists())
    }

    /// [`SandboxBackend::reclaim_sandbox`](crate::SandboxBackend::reclaim_sandbox).
    pub(super) fn reclaim_unowned(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        match self.take_ownership(id.as_str())? {
            Ownership::Busy | Ownership::NoRunDir { leftovers: false } => Ok(false),
            Ownership::Taken(lock) => {
                tracing::info!(sandbox_id = %id, "reclaiming sandbox");
                let reclaimed = self.reclaim(id.as_str());
                drop(lock);
                reclaimed.map(|()| true)
            }
            Ownership::NoRunDir { leftovers: true } => {
                tracing::info!(sandbox_id = %id, "reclaiming the leftovers of a sandbox without a run directory");
                self.reclaim(id.as_str()).map(|()| true)
            }
        }
    }
}

/// Reaps the exited process of `pidfd` if it is this process's child (a sandbox this process created
/// and then lost its handle of); does nothing for anyone else's (`ECHILD`).
pub(super) fn reap_if_child(pidfd: &OwnedFd) {
    let _ = rustix::process::waitid(
        rustix::process::WaitId::PidFd(pidfd.as_fd()),
        rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_record_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let record = InitRecord::of(std::process::id() as i32).expect("own record");
        record.write(dir.path()).expect("write");
        assert_eq!(InitRecord::read(dir.path()), Some(record));
        assert!(!dir.path().join(".init.pid.new").exists(), "renamed into place");
        for bad in ["", "12", "x 5", "0 5", "-3 5", "12 5 7", "12 five"] {
            assert_eq!(InitRecord::parse(bad), None, "{bad:?}");
        }
        assert_eq!(
            InitRecord::parse("12 345\n"),
            Some(InitRecord {
                pid: 12,
                start_time: 345
            })
        );
    }

    #[test]
    fn start_time_survives_odd_command_names() {
        let stat = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 \
                    100 18446744073709551615";
        assert_eq!(parse_start_time(stat), Some(987_654));
        assert_eq!(parse_start_time("4242 (truncated"), None);
        let own = process_start_time(std::process::id() as i32).expect("own start time");
        assert!(own > 0);
    }
}
