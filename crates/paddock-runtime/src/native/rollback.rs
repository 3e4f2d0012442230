//! Rolling a sandbox back to a snapshot by restarting it on a copy of the snapshot.
//!
//! The sandbox keeps its id, run directory, lock, cgroups (so its limits, and its usage counters) and
//! disk limit; its processes do not survive. Two paths:
//!
//! - **Prepared** (`SandboxBackend::prepare_rollback`, run in the background after a checkpoint): a complete
//!   second sandbox, `<id>.next`, is booted ahead of time on a writable copy of the snapshot, with the
//!   sandbox's own hostname, mounts and user, its own run directory and PID namespace, and an idle
//!   agent, inside the sandbox's own cgroups (moving processes between cgroups at the rollback would
//!   cost milliseconds of RCU synchronisation per hierarchy on cgroup v1; the idle agent counts
//!   against the sandbox's limits meanwhile: one process and well under a MiB). Nothing runs in it,
//!   so its files stay exactly the snapshot's. The rollback then only kills the old init, renames the
//!   prepared volume into place (the old one goes to the pool's trash, deleted in the background) and
//!   moves the agent socket, log and init record into the sandbox's run directory: no transaction
//!   commit, no setup.
//! - **Cold** (no prepared sandbox for this snapshot): the new setup shim is spawned (its exec overlaps
//!   the rest), the init is killed (which ends its PID namespace) and reaped, the sandbox is thawed if
//!   it was paused (a frozen cgroup would freeze the new init too), and then, as at creation, the shim
//!   builds the new sandbox while the old subvolume goes to the trash and a writable snapshot of the
//!   snapshot takes its place (with the disk limit re-applied).
//!
//! Swapping the subvolume under a live, frozen sandbox instead would keep its processes, but
//! Landlock rules do not follow replaced mounts (see ARCHITECTURE.md, "Snapshots"); a prepared sandbox
//! gets its rules at its own setup, like any other.

use std::fs;
use std::io;
use std::path::Path;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use paddock_sys::fs_in_root::Symlinks;
use paddock_types::{ByteSize, SandboxId, SnapshotId, VolumeSource};

use super::lifecycle::{volume_etc, Shim, Slot};
use super::sandbox::{
    kill_init, kill_pid, reap, state_err, InitRecord, NativeSandbox, Prepared, KILL_DEADLINE,
};
use super::NativeBackend;
use crate::{AnyHandle, RuntimeError, SandboxHandle};

/// Most bytes of a snapshot's `/etc/hostname` read (a sandbox id is 27).
const MAX_HOSTNAME_BYTES: u64 = 256;

impl NativeBackend {
    /// [`SandboxBackend::prepare_rollback`](crate::SandboxBackend::prepare_rollback): boots `<id>.next` on a copy of
    /// `snapshot`, replacing one prepared for another snapshot.
    pub(super) fn prepare(&self, handle: &SandboxHandle, snapshot: &SnapshotId) -> Result<(), RuntimeError> {
        let sb = handle.native()?;
        let mut next = sb.next.lock().unwrap_or_else(PoisonError::into_inner);
        if next.as_ref().is_some_and(|p| &p.snapshot == snapshot) {
            return Ok(());
        }
        // The copy boots in the sandbox's cgroups: not while they are frozen (its setup would freeze
        // with them), and a pause waits until it is up.
        let _freezer = sb.freezer.lock().unwrap_or_else(PoisonError::into_inner);
        if sb.cgroup.frozen()? {
            return Err(RuntimeError::Unsupported(format!(
                "sandbox {} is paused: a rollback is prepared only for a running sandbox",
                handle.id
            )));
        }
        if let Some(old) = next.take() {
            self.discard(old);
        }
        let boot = sb.boot.as_deref().ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "sandbox {} was started by an older paddock that did not record how to restart it",
                handle.id
            ))
        })?;
        self.pool.existing_snapshot(snapshot)?;
        let t = Instant::now();
        let shim = Shim::start(&self.config.setup_binary)?;
        let name = format!("{}.next", handle.id);
        let run_dir = self.run_dir(&name);
        // As at creation: the run directory appears under its name only with its lock held.
        let staging = run_dir.with_file_name(format!(".new-{name}"));
        let lock = super::lock::stage_run_dir(&staging, &run_dir, || {
            if run_dir.exists() {
                // Left by a crash; gc would reclaim it, but it is in the way now.
                self.reclaim(&name)?;
            }
            Ok(())
        })?;
        let volume = self.pool.fresh_volume_path(&name);
        let source = VolumeSource::Snapshot(snapshot.clone());
        let started = self
            .start(
                &handle.id,
                boot,
                Slot {
                    run_dir: &run_dir,
                    cgroup: &sb.cgroup,
                    fresh_cgroups: false,
                    volume: &volume,
                },
                shim,
                || {
                    let volume = self.pool.create_volume_as(&name, &source, &boot.rootfs, None)?;
                    match &boot.network {
                        Some(network) => self.write_sandbox_network_files(
                            &volume,
                            &self.pool.rootfs(&boot.rootfs),
                            network,
                        ),
                        None => Ok(()),
                    }
                },
            )
            .and_then(|pid| InitRecord::of(pid).and_then(|r| r.write(&run_dir)).map(|()| pid));
        let init_pid = match started {
            Ok(pid) => pid,
            Err(e) => {
                if let Err(cleanup) = self.remove_prepared(&name, &run_dir) {
                    tracing::warn!(sandbox_id = %handle.id, error = %cleanup, "cleanup after a failed rollback preparation");
                }
                return Err(e);
            }
        };
        *next = Some(Prepared {
            snapshot: snapshot.clone(),
            name,
            run_dir,
            init_pid,
            pidfd: paddock_sys::namespace::pidfd_open(init_pid).ok(),
            _lock: lock,
        });
        tracing::debug!(sandbox_id = %handle.id, snapshot = %snapshot, us = t.elapsed().as_micros() as u64, "rollback prepared");
        Ok(())
    }

    /// [`SandboxBackend::discard_rollback`](crate::SandboxBackend::discard_rollback).
    pub(super) fn discard_prepared(&self, sb: &NativeSandbox) {
        if let Some(prepared) = sb.next.lock().unwrap_or_else(PoisonError::into_inner).take() {
            self.discard(prepared);
        }
    }

    /// Kills a prepared sandbox and removes everything of it.
    fn discard(&self, prepared: Prepared) {
        kill_pid(prepared.pidfd.as_ref(), prepared.init_pid);
        // It is this process's child (the shim clones it with CLONE_PARENT).
        if let Some(pid) = rustix::process::Pid::from_raw(prepared.init_pid) {
            let _ = rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty());
        }
        if let Err(e) = self.remove_prepared(&prepared.name, &prepared.run_dir) {
            tracing::warn!(name = %prepared.name, error = %e, "cannot remove a prepared sandbox; gc will");
        }
    }

    /// Removes a prepared sandbox's volume and run directory (its processes are gone).
    pub(super) fn remove_prepared(&self, name: &str, run_dir: &std::path::Path) -> Result<(), RuntimeError> {
        self.pool.delete_volume(name)?;
        match fs::remove_dir_all(run_dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(state_err("remove", run_dir)(e)),
            _ => Ok(()),
        }
    }

    /// [`SandboxBackend::rollback_sandbox`](crate::SandboxBackend::rollback_sandbox). On failure everything of the
    /// sandbox is removed, as by `destroy_sandbox`.
    pub(super) fn rollback(
        &self,
        handle: SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<SandboxHandle, RuntimeError> {
        let SandboxHandle {
            id,
            agent_socket,
            network,
            inner,
        } = handle;
        let mut sb = super::into_native(inner)?;
        let prepared = {
            let mut next = sb.next.lock().unwrap_or_else(PoisonError::into_inner);
            match next.take() {
                Some(p) if &p.snapshot == snapshot => Some(p),
                Some(other) => {
                    self.discard(other);
                    None
                }
                None => None,
            }
        };
        let restarted = match prepared {
            Some(p) => self.switch_to(&id, &mut sb, p),
            None => self.restart_on(&id, &mut sb, snapshot),
        };
        match restarted {
            Ok(()) => Ok(SandboxHandle {
                id,
                agent_socket,
                network,
                inner: AnyHandle::Native(sb),
            }),
            Err(e) => {
                tracing::warn!(sandbox_id = %id, snapshot = %snapshot, error = %e, "rollback failed; destroying the sandbox");
                if !sb.reaped {
                    kill_init(&sb);
                    reap(&mut sb);
                }
                if let Err(cleanup) = self.cleanup(id.as_str(), &sb.cgroup, &sb.run_dir) {
                    tracing::warn!(sandbox_id = %id, error = %cleanup, "cleanup after failed rollback");
                }
                Err(e)
            }
        }
    }

    /// The prepared path: the sandbox becomes its prepared copy.
    fn switch_to(
        &self,
        id: &SandboxId,
        sb: &mut NativeSandbox,
        prepared: Prepared,
    ) -> Result<(), RuntimeError> {
        let start = Instant::now();
        // The limit in force now (it may have changed since creation), not the one created with.
        let disk = self.pool.volume_usage(id.as_str())?.limit.map(ByteSize::bytes);
        self.kill_old(sb, Some(prepared.init_pid))?;
        crate::fault::point("rollback.prepared.old_killed");
        let killed = start.elapsed();
        let mut steps = [Duration::ZERO; 2];
        let switched = (|| {
            let t = Instant::now();
            self.pool.retire_volume(id.as_str())?;
            steps[0] = t.elapsed();
            self.pool.move_volume(&prepared.name, id.as_str())?;
            if disk.is_some() {
                self.pool.set_disk_limit(id.as_str(), disk)?;
            }
            steps[1] = t.elapsed();
            for file in ["agent.sock", "agent.log"] {
                let from = prepared.run_dir.join(file);
                fs::rename(&from, sb.run_dir.join(file)).map_err(state_err("move", &from))?;
            }
            InitRecord::of(prepared.init_pid)?.write(&sb.run_dir)
        })();
        let Prepared {
            name,
            run_dir,
            init_pid,
            pidfd,
            ..
        } = prepared;
        // The new init is this process's child (CLONE_PARENT by the shim this process started).
        sb.init_pid = init_pid;
        sb.pidfd = pidfd;
        sb.child = true;
        sb.reaped = false;
        if let Err(e) = switched {
            // The caller destroys the sandbox (and with it, now, the prepared init); its leftovers:
            let _ = self.remove_prepared(&name, &run_dir);
            return Err(e);
        }
        crate::fault::point("rollback.prepared.switched");
        let switched_at = start.elapsed();
        let _ = fs::remove_dir_all(&run_dir);
        let _ = fs::remove_dir(sb.run_dir.join("root"));
        tracing::debug!(
            sandbox_id = %id,
            kill_us = killed.as_micros() as u64,
            retire_us = steps[0].as_micros() as u64,
            volume_us = steps[1].as_micros() as u64,
            switched_us = switched_at.as_micros() as u64,
            total_us = start.elapsed().as_micros() as u64,
            "rolled back to a prepared sandbox"
        );
        Ok(())
    }

    /// Ends the sandbox's current processes (its init, so its PID namespace, and anything left in its
    /// cgroups), thawing it if it was paused (SIGKILL reaches frozen processes; the thaw lets them
    /// exit). `spared`: the init of a prepared sandbox sharing the cgroups, which lives on.
    pub(super) fn kill_old(&self, sb: &mut NativeSandbox, spared: Option<i32>) -> Result<(), RuntimeError> {
        if !sb.reaped {
            // A reaped init's pid may belong to another process by now.
            kill_init(sb);
        }
        // A paused sandbox's processes die frozen; the new init must not join a frozen cgroup.
        if sb.cgroup.frozen().unwrap_or(false) {
            sb.cgroup.thaw()?;
        }
        reap(sb);
        match spared {
            None => sb.cgroup.kill_all(KILL_DEADLINE),
            Some(init) => sb.cgroup.kill_all_but(Some(init), KILL_DEADLINE),
        }
    }

    /// The cold path.
    fn restart_on(
        &self,
        id: &SandboxId,
        sb: &mut NativeSandbox,
        snapshot: &SnapshotId,
    ) -> Result<(), RuntimeError> {
        let start = Instant::now();
        self.pool.existing_snapshot(snapshot)?;
        let boot = sb.boot.clone().ok_or_else(|| {
            RuntimeError::Unsupported(format!(
                "sandbox {id} was started by an older paddock that did not record how to restart it"
            ))
        })?;
        let disk = self.pool.volume_usage(id.as_str())?.limit.map(ByteSize::bytes);
        let shim = Shim::start(&self.config.setup_binary)?;
        self.kill_old(sb, None)?;
        crate::fault::point("rollback.cold.old_killed");
        let killed = start.elapsed();

        let root_mount = sb.run_dir.join("root");
        match fs::remove_dir(&root_mount) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(state_err("remove", &root_mount)(e)),
            _ => {}
        }
        let source = VolumeSource::Snapshot(snapshot.clone());
        // Where the volume made below goes (not the old one's place: an older paddock's was elsewhere).
        let volume = self.pool.fresh_volume_path(id.as_str());
        let slot = Slot {
            run_dir: &sb.run_dir,
            cgroup: &sb.cgroup,
            fresh_cgroups: false,
            volume: &volume,
        };
        let pid = self.start(id, &boot, slot, shim, || {
            self.pool.retire_volume(id.as_str())?;
            crate::fault::point("rollback.cold.volume_retired");
            let volume = self.pool.create_volume(id, &source, &boot.rootfs, disk)?;
            // A snapshot carries the hostname it was taken with, which its sandbox may have changed
            // (or replaced with a symlink, a fifo, a huge file: read as the sandbox's, bounded,
            // never followed, never opened unless it is a regular file).
            // Anything unreadable means the identity files are rewritten: no error to build.
            let hostname = volume_etc(&volume)
                .ok()
                .and_then(|etc| {
                    etc.read_regular(Path::new("hostname"), MAX_HOSTNAME_BYTES, Symlinks::Refuse)
                        .ok()
                })
                .unwrap_or_default();
            if hostname.trim_ascii_end() != id.as_str().as_bytes() {
                self.write_identity(id, &self.pool.rootfs(&boot.rootfs), &volume)?;
            }
            // Always: the snapshot may hold another link's files (taken before a stop and resume).
            if let Some(network) = &boot.network {
                self.write_sandbox_network_files(&volume, &self.pool.rootfs(&boot.rootfs), network)?;
            }
            Ok(())
        })?;
        sb.init_pid = pid;
        sb.pidfd = paddock_sys::namespace::pidfd_open(pid).ok();
        // The new init is this process's child, whoever started the old one.
        sb.child = true;
        sb.reaped = false;
        crate::fault::point("rollback.cold.started");
        InitRecord::of(pid)?.write(&sb.run_dir)?;
        tracing::debug!(
            sandbox_id = %id,
            snapshot = %snapshot,
            kill_us = killed.as_micros() as u64,
            total_us = start.elapsed().as_micros() as u64,
            "rolled back by a restart"
        );
        Ok(())
    }
}
