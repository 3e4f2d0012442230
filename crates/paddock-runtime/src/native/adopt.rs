//! Taking over sandboxes an earlier process created (a `paddock serve` restart), and reclaiming one
//! sandbox by id.
//!
//! A sandbox created with `die_with_parent: false` outlives its creator. What proves it is still the
//! same sandbox: its run directory's lock is free (its owner is gone), `<run>/init.pid` names a
//! process that is alive, started at the recorded time (so a reused pid is never mistaken for it) and
//! sits in the sandbox's cgroup, and its agent answers a handshake. The adopter then holds the lock
//! and a pidfd of the init; the init is not its child, so teardown watches the pidfd instead of
//! waiting for it.

use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::Duration;

use paddock_types::SandboxId;

use super::lock::StateLock;
use super::sandbox::{
    process_start_time, reap_if_child, wait_exit, InitRecord, NativeSandbox, KILL_DEADLINE,
};
use super::NativeBackend;
use crate::agent_client;
use crate::{Adoption, RuntimeError};

/// How long adoption waits for the agent's handshake before declaring the sandbox dead.
const ADOPT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

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
        let leftovers = self.cgroups.sandbox(id).exists() || self.pool.holds_volume(id);
        let run_dir = self.run_dir(id);
        match StateLock::try_acquire(&run_dir.join("lock")) {
            Ok(Some(lock)) => Ok(Ownership::Taken(lock)),
            Ok(None) => Ok(Ownership::Busy),
            Err(_) if !run_dir.exists() => Ok(Ownership::NoRunDir { leftovers }),
            Err(e) => Err(e),
        }
    }

    /// The staging directory (`.new-<id>`) of a create of `id` whose process died before it
    /// renamed the directory into place: removed once its lock is free. Only for an id the caller
    /// owns (one its store recorded, after a restart), so no create of that id can be under way;
    /// gc's general rule waits a minute instead, not knowing whose a staging directory is.
    fn remove_abandoned_staging(&self, id: &str) {
        let staging = self.run_dir(id).with_file_name(format!(".new-{id}"));
        if std::fs::symlink_metadata(&staging).is_err() {
            return;
        }
        if let Ok(Some(_lock)) = StateLock::try_acquire(&staging.join("lock")) {
            match std::fs::remove_dir_all(&staging) {
                Ok(()) => {
                    tracing::info!(sandbox_id = %id, "removed the staging directory of an interrupted create")
                }
                Err(e) => {
                    tracing::warn!(sandbox_id = %id, error = %e, "cannot remove the staging directory of an interrupted create; gc will")
                }
            }
        }
    }

    /// [`SandboxBackend::adopt_sandbox`](crate::SandboxBackend::adopt_sandbox).
    pub(super) fn adopt(&self, id: &SandboxId) -> Result<Adoption, RuntimeError> {
        let lock = match self.take_ownership(id.as_str())? {
            Ownership::Taken(lock) => lock,
            Ownership::Busy => return Ok(Adoption::Busy),
            Ownership::NoRunDir { leftovers: false } => {
                self.remove_abandoned_staging(id.as_str());
                return Ok(Adoption::Missing);
            }
            Ownership::NoRunDir { leftovers: true } => {
                self.remove_abandoned_staging(id.as_str());
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
                        return Ok(Adoption::Alive(NativeSandbox::not_a_child(
                            id.clone(),
                            run_dir,
                            cgroup,
                            record.pid,
                            pidfd,
                            lock,
                        )));
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
    pub(super) fn live_init(
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
            cgroup.kill_all(KILL_DEADLINE)?;
        }
        // Nothing writes to the files any more: they go aside before anything is removed.
        self.pool.return_stopped(id.as_str())?;
        self.cleanup(id.as_str(), &cgroup, &run_dir)?;
        Ok(self.pool.stopped_path(id.as_str()).exists())
    }

    /// [`SandboxBackend::reclaim_sandbox`](crate::SandboxBackend::reclaim_sandbox).
    pub(super) fn reclaim_unowned(&self, id: &SandboxId) -> Result<bool, RuntimeError> {
        match self.take_ownership(id.as_str())? {
            Ownership::Busy => Ok(false),
            Ownership::NoRunDir { leftovers: false } => {
                self.remove_abandoned_staging(id.as_str());
                Ok(false)
            }
            Ownership::Taken(lock) => {
                tracing::info!(sandbox_id = %id, "reclaiming sandbox");
                let reclaimed = self.reclaim(id.as_str());
                drop(lock);
                reclaimed.map(|()| true)
            }
            Ownership::NoRunDir { leftovers: true } => {
                self.remove_abandoned_staging(id.as_str());
                tracing::info!(sandbox_id = %id, "reclaiming the leftovers of a sandbox without a run directory");
                self.reclaim(id.as_str()).map(|()| true)
            }
        }
    }
}
