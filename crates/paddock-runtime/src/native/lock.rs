//! Liveness locks: a sandbox belongs to the process holding the `flock(2)` on its lock file.
//!
//! When that process dies however it dies (kill -9 included), the kernel drops the lock, and the next
//! `paddock` start or `paddock gc` sees an unlocked sandbox and reclaims it.

use std::fs::{File, OpenOptions};
use std::path::Path;

use rustix::fs::FlockOperation;

use crate::RuntimeError;

/// A held exclusive lock; released on drop (or process death).
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

impl StateLock {
    /// Blocks until the lock on `path` (created if missing) is held.
    pub fn acquire(path: &Path) -> Result<Self, RuntimeError> {
        let file = open(path)?;
        rustix::fs::flock(&file, FlockOperation::LockExclusive).map_err(|e| RuntimeError::State {
            what: "lock",
            path: path.to_owned(),
            source: e.into(),
        })?;
        Ok(Self { _file: file })
    }

    /// Takes the lock if nobody holds it; `None` when another process does.
    pub fn try_acquire(path: &Path) -> Result<Option<Self>, RuntimeError> {
        let file = open(path)?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(Self { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(RuntimeError::State {
                what: "lock",
                path: path.to_owned(),
                source: e.into(),
            }),
        }
    }
}

fn open(path: &Path) -> Result<File, RuntimeError> {
    // std opens with O_CLOEXEC, so the setup shim and the agent never inherit (and never keep alive) it.
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|source| RuntimeError::State {
            what: "open lock file",
            path: path.to_owned(),
            source,
        })
}
