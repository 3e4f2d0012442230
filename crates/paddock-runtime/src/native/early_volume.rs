//! A new sandbox's volume, made on a thread of its own while its create goes on (its cgroups, its
//! network link, the setup shim's start), and waited for only when the shim needs it.
//!
//! A volume snapshotted from a template or a snapshot waits for a btrfs transaction commit (5-10 ms
//! here, more under load). Made this early, that wait overlaps the rest of the create; and creates
//! that run together (a fork's copies) issue their snapshots within a few milliseconds of each other,
//! so they join the same commits instead of spreading over the commits that follow as each create
//! reaches its volume after its cgroups (which took up to 7 ms each with ten at once on two cores).
//!
//! The thread starts only once the create holds the sandbox's run directory lock, so gc never takes
//! the volume for an orphan's. A job dropped without [`VolumeJob::wait`] (a create that failed
//! before its volume was needed) waits for its thread, so whatever cleans up after finds the volume
//! made, or nothing; this module does not undo the volume itself (the create's cleanup does).

use std::path::PathBuf;
use std::thread::JoinHandle;

use paddock_types::SandboxSpec;

use super::pool::StoragePool;
use crate::RuntimeError;

/// A volume being made (see the module docs).
pub(super) struct VolumeJob {
    state: State,
}

enum State {
    Running(JoinHandle<Result<PathBuf, RuntimeError>>),
    /// Failed to start, or taken.
    Done(Option<Result<PathBuf, RuntimeError>>),
}

impl VolumeJob {
    /// Starts making `spec`'s volume in `pool` ([`StoragePool::create_volume`]). The caller must hold
    /// the sandbox's run directory lock.
    pub(super) fn start(pool: &StoragePool, spec: &SandboxSpec) -> Self {
        let pool = pool.clone();
        let (id, source, rootfs, disk) = (
            spec.id.clone(),
            spec.volume.clone(),
            spec.rootfs.clone(),
            spec.limits.disk,
        );
        let spawned = std::thread::Builder::new()
            .name("volume".into())
            .spawn(move || pool.create_volume(&id, &source, &rootfs, disk));
        let state = match spawned {
            Ok(handle) => State::Running(handle),
            // As any other failure to make the volume: the create fails and cleans up.
            Err(e) => State::Done(Some(Err(RuntimeError::Setup(format!(
                "cannot start a thread to make the volume: {e}"
            ))))),
        };
        Self { state }
    }

    /// Waits for the volume; its path.
    pub(super) fn wait(mut self) -> Result<PathBuf, RuntimeError> {
        self.result()
    }

    fn result(&mut self) -> Result<PathBuf, RuntimeError> {
        match std::mem::replace(&mut self.state, State::Done(None)) {
            State::Running(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(RuntimeError::Setup("the thread making a volume panicked".into()))),
            State::Done(result) => {
                result.unwrap_or_else(|| Err(RuntimeError::Setup("the volume was already taken".into())))
            }
        }
    }
}

impl Drop for VolumeJob {
    /// Waits for the thread: a failed create's cleanup must come after its volume is made.
    fn drop(&mut self) {
        if let State::Running(_) = self.state {
            let _ = self.result();
        }
    }
}
