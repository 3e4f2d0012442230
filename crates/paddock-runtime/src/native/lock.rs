//! Liveness locks: a sandbox belongs to the process holding the `flock(2)` on its lock file.
//!
//! When that process dies however it dies (kill -9 included), the kernel drops the lock, and the next
//! `paddock` start or `paddock gc` sees an unlocked sandbox and reclaims it.
//!
//! A run directory is born as `run/.new-<name>` with its lock held and renamed into place
//! ([`stage_run_dir`]), so gc never mistakes a sandbox being born for an abandoned one.

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

    /// The lock on `path` held through `fd`, a descriptor this process inherited across an `exec`
    /// (`handover.rs`): refused unless `fd` is that very file (same device and inode; never followed
    /// through a link) and its lock is held through it (or free, and taken now).
    pub(crate) fn inherited(fd: std::os::fd::OwnedFd, path: &Path) -> Result<Self, RuntimeError> {
        let err = |source: std::io::Error| RuntimeError::State {
            what: "inherited lock",
            path: path.to_owned(),
            source,
        };
        let held = rustix::fs::fstat(&fd).map_err(|e| err(e.into()))?;
        let named = rustix::fs::lstat(path).map_err(|e| err(e.into()))?;
        if (held.st_dev, held.st_ino) != (named.st_dev, named.st_ino) {
            return Err(err(std::io::Error::other("the descriptor is not this lock file")));
        }
        match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(err(std::io::Error::other("another process holds the lock")))
            }
            Err(e) => return Err(err(e.into())),
        }
        rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC).map_err(|e| err(e.into()))?;
        Ok(Self {
            _file: File::from(fd),
        })
    }

    /// The lock file's descriptor.
    pub(crate) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self._file)
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

/// Creates the run directory `run_dir` through its staging name `staging` (`run/.new-<name>`): makes
/// `staging`, takes its lock, runs `clear` (which may make way for `run_dir` or refuse), and renames
/// it into place; returns the lock. A staging directory of the same name whose lock nobody holds
/// (left by a crash between its creation and its rename) is taken over. On any failure once the
/// staging directory is this call's, it is removed: nothing is left under `.new-*`.
pub(super) fn stage_run_dir(
    staging: &Path,
    run_dir: &Path,
    clear: impl FnOnce() -> Result<(), RuntimeError>,
) -> Result<StateLock, RuntimeError> {
    let lock_path = staging.join("lock");
    let lock = match std::fs::create_dir(staging) {
        // The sandbox's init, an unprivileged host user, traverses it to build its root: its mode is
        // set, not left to the caller's umask (under 077 every create failed with EACCES). `run/`
        // itself (0710) keeps other host users out.
        Ok(()) => searchable(staging).and_then(|()| StateLock::acquire(&lock_path)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            match StateLock::try_acquire(&lock_path)? {
                Some(lock) => Ok(lock),
                None => {
                    return Err(RuntimeError::State {
                        what: "stage (another process is creating it)",
                        path: staging.to_owned(),
                        source: std::io::ErrorKind::AlreadyExists.into(),
                    })
                }
            }
        }
        Err(source) => {
            return Err(RuntimeError::State {
                what: "create",
                path: staging.to_owned(),
                source,
            })
        }
    };
    let staged = lock.and_then(|lock| {
        clear()?;
        std::fs::rename(staging, run_dir).map_err(|source| RuntimeError::State {
            what: "rename",
            path: staging.to_owned(),
            source,
        })?;
        Ok(lock)
    });
    if staged.is_err() {
        let _ = std::fs::remove_dir_all(staging);
    }
    staged
}

/// Sets directory `dir`'s mode to 0755, whatever the umask.
pub(super) fn searchable(dir: &Path) -> Result<(), RuntimeError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(|source| {
        RuntimeError::State {
            what: "chmod",
            path: dir.to_owned(),
            source,
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("read_dir")
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_staged_run_directory_is_renamed_into_place_or_removed() {
        let run = tempfile::tempdir().expect("tempdir");
        let staging = run.path().join(".new-a");
        let run_dir = run.path().join("a");
        let lock = stage_run_dir(&staging, &run_dir, || Ok(())).expect("staged");
        assert_eq!(entries(run.path()), ["a"]);
        assert_eq!(
            StateLock::try_acquire(&run_dir.join("lock"))
                .expect("lock")
                .map(drop),
            None,
            "its lock is held"
        );
        drop(lock);

        let refused = stage_run_dir(&run.path().join(".new-b"), &run.path().join("b"), || {
            Err(RuntimeError::InvalidSpec("no".into()))
        });
        assert!(
            matches!(refused, Err(RuntimeError::InvalidSpec(_))),
            "{refused:?}"
        );
        assert_eq!(
            entries(run.path()),
            ["a"],
            "the staging directory of a failure is removed"
        );

        // A rename that fails (a file in the way) removes it too.
        std::fs::write(run.path().join("c"), "x").expect("file");
        stage_run_dir(&run.path().join(".new-c"), &run.path().join("c"), || Ok(())).expect_err("blocked");
        assert_eq!(entries(run.path()), ["a", "c"]);
    }

    #[test]
    fn a_crash_s_staging_directory_is_taken_over_and_a_live_one_left_alone() {
        let run = tempfile::tempdir().expect("tempdir");
        let staging = run.path().join(".new-a");
        std::fs::create_dir(&staging).expect("left by a crash");
        let lock = stage_run_dir(&staging, &run.path().join("a"), || Ok(())).expect("taken over");
        assert_eq!(entries(run.path()), ["a"]);
        drop(lock);

        let busy = run.path().join(".new-b");
        std::fs::create_dir(&busy).expect("dir");
        let held = StateLock::acquire(&busy.join("lock")).expect("held by its creator");
        stage_run_dir(&busy, &run.path().join("b"), || Ok(())).expect_err("busy");
        assert!(
            busy.join("lock").exists(),
            "another creator's staging is left alone"
        );
        assert_eq!(entries(run.path()), [".new-b", "a"]);
        drop(held);
    }
}
