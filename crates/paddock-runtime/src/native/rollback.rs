//! Rolling a sandbox back to a snapshot by restarting it on a copy of the snapshot.
//!
//! The sandbox keeps its id, run directory, lock, cgroups (so its limits, and its usage counters) and
//! disk limit; its processes do not survive. In order: the new setup shim is spawned (its exec
//! overlaps the rest), the init is killed (which ends its PID namespace) and reaped, the sandbox is
//! thawed if it was paused (a frozen cgroup would freeze the new init too), and then, as at creation,
//! the shim builds the new sandbox while the old subvolume is moved to the pool's trash (deleted in the
//! background) and a writable copy of the snapshot takes its place, with the disk limit re-applied:
//! the spare made ahead of time for it (`Backend::prepare_rollback`, a rename) or else a new snapshot
//! (a transaction commit, a few milliseconds).
//!
//! Swapping the subvolume under a live, frozen sandbox instead would keep its processes, but
//! Landlock rules do not follow replaced mounts (see ARCHITECTURE.md, "Snapshots").

use std::fs;
use std::io;
use std::time::Instant;

use paddock_types::{ByteSize, SandboxId, SnapshotId, VolumeSource};

use super::adopt::InitRecord;
use super::lifecycle::{kill_init, reap, state_err, NativeSandbox, Shim, KILL_DEADLINE};
use super::NativeBackend;
use crate::{RuntimeError, SandboxHandle};

impl NativeBackend {
    /// [`Backend::rollback_sandbox`](crate::Backend::rollback_sandbox). On failure everything of the
    /// sandbox is removed, as by `destroy_sandbox`.
    pub(super) fn rollback(
        &self,
        handle: SandboxHandle,
        snapshot: &SnapshotId,
    ) -> Result<SandboxHandle, RuntimeError> {
        let SandboxHandle {
            id,
            agent_socket,
            inner: mut sb,
        } = handle;
        match self.restart_on(&id, &mut sb, snapshot) {
            Ok(()) => Ok(SandboxHandle {
                id,
                agent_socket,
                inner: sb,
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
        // The limit in force now (it may have changed since creation), not the one created with.
        let disk = self.pool.volume_usage(id.as_str())?.limit.map(ByteSize::bytes);
        let shim = Shim::start(&self.config.setup_binary)?;

        kill_init(sb);
        // A paused sandbox's processes die frozen; the new init must not join a frozen cgroup.
        if sb.cgroup.frozen().unwrap_or(false) {
            sb.cgroup.thaw()?;
        }
        reap(sb);
        sb.cgroup.kill_all(KILL_DEADLINE)?;
        let killed = start.elapsed();

        let root_mount = sb.run_dir.join("root");
        match fs::remove_dir(&root_mount) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(state_err("remove", &root_mount)(e)),
            _ => {}
        }
        let source = VolumeSource::Snapshot(snapshot.clone());
        let mut swapped = None;
        let mut spare = false;
        let pid = self.start(id, &boot, &sb.run_dir, &sb.cgroup, shim, || {
            let t = Instant::now();
            self.pool.retire_volume(id.as_str())?;
            let retired = t.elapsed();
            let volume = if self.pool.take_spare(snapshot, id.as_str())? {
                spare = true;
                if disk.is_some() {
                    self.pool.set_disk_limit(id.as_str(), disk)?;
                }
                self.pool.volume_path(id.as_str())
            } else {
                self.pool.create_volume(id, &source, disk)?
            };
            swapped = Some((retired, t.elapsed() - retired));
            // A snapshot of another sandbox carries that one's hostname.
            let hostname = fs::read_to_string(volume.join("etc/hostname")).unwrap_or_default();
            if hostname.trim_end() != id.as_str() {
                self.write_identity(id, &boot.rootfs, &volume)?;
            }
            Ok(())
        })?;
        sb.init_pid = pid;
        sb.pidfd = paddock_sys::namespace::pidfd_open(pid).ok();
        // The new init is this process's child, whoever started the old one.
        sb.child = true;
        sb.reaped = false;
        InitRecord::of(pid)?.write(&sb.run_dir)?;
        tracing::debug!(
            sandbox_id = %id,
            snapshot = %snapshot,
            kill_us = killed.as_micros() as u64,
            retire_us = swapped.map_or(0, |d| d.0.as_micros() as u64),
            volume_us = swapped.map_or(0, |d| d.1.as_micros() as u64),
            spare,
            total_us = start.elapsed().as_micros() as u64,
            "rolled back"
        );
        Ok(())
    }
}
