//! The host uid that owns a sandbox's user namespace: one per live sandbox, so that the kernel's
//! per-user budgets charged to a namespace's owner are the sandbox's own.
//!
//! A user namespace's owner is the effective uid of the process that creates it. The kernel charges
//! the "ucounts" of everything done inside the namespace to that owner in the parent namespace too:
//! inotify instances and watches (`fs.inotify.max_user_instances`, 128 by default, and
//! `max_user_watches`), pending signals and POSIX message-queue bytes (the creator's
//! `RLIMIT_SIGPENDING`/`RLIMIT_MSGQUEUE`), user namespaces. Created by host root, every sandbox
//! charged host root: one sandbox holding 128 inotify instances made `inotify_init` fail for every
//! other sandbox and for every root service of the host. Owned by a uid of its own, a sandbox
//! exhausts only its own budget.
//!
//! The uids come from [`OwnerPool::default_pool`]: a range no host user, no sandbox (the sandbox id
//! range [`IdRange`]) and no host process uses; a uid owns capabilities over the namespaces it
//! owns, so it must never be a uid anything on the host runs as. Which one a sandbox gets is
//! arbitrated by the kernel with `flock(2)`: uid `N` is taken while someone holds the lock on
//! `<dir>/N`, and the sandbox's init holds it for its whole life (the shim locks it, the init
//! inherits the descriptor and keeps it as fd [`OWNER_LOCK_FD`] through the exec of the agent,
//! which never closes it; the agent's children never inherit it). So the uid is free again exactly
//! when the sandbox's init is gone, whoever created it: `paddock run`, any `paddock serve`, any
//! pool, a rollback's prepared sandbox. The lock files stay (one per uid ever used at once, empty).
//!
//! What this does not do: budgets the kernel keeps per user (`struct user_struct`: pipe buffers,
//! epoll watches, SCM_RIGHTS in flight) are charged to the uid a process runs as, and every
//! sandbox's `user` is the same host uid; ARCHITECTURE.md says how those are bounded.

use std::collections::BTreeSet;
use std::io::{self, Read};
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, Mode, OFlags};
use serde::{Deserialize, Serialize};

use crate::native::users::IdRange;

/// The descriptor number the init (and then the agent) keeps the owner lock as.
pub const OWNER_LOCK_FD: i32 = 4;

/// Where user-namespace owner uids come from, and the directory of their locks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnerPool {
    /// Directory of the lock files, one per uid (host-wide: every paddock on the host uses it).
    pub dir: PathBuf,
    /// First uid.
    pub base: u32,
    /// Number of uids (the most sandboxes alive at once on the host).
    pub count: u32,
}

impl OwnerPool {
    /// 65,536 uids right above the default sandbox id range (which ends at 1,000,065,535), and
    /// their locks under `/run` (a tmpfs: gone at reboot, like every sandbox).
    pub fn default_pool() -> Self {
        Self {
            dir: PathBuf::from("/run/paddock/userns-owners"),
            base: IdRange::DEFAULT.base + IdRange::DEFAULT.count,
            count: 65_536,
        }
    }

    /// Whether any uid of the pool is one of `ids`.
    pub fn overlaps(&self, ids: IdRange) -> bool {
        let (start, end) = (u64::from(self.base), u64::from(self.base) + u64::from(self.count));
        let (ids_start, ids_end) = (u64::from(ids.base), u64::from(ids.base) + u64::from(ids.count));
        start < ids_end && ids_start < end
    }
}

/// A uid of the pool, held while the descriptor (an open file description with the lock) lives.
#[derive(Debug)]
pub struct OwnerUid {
    /// The uid.
    pub uid: u32,
    /// The locked file.
    pub lock: OwnedFd,
}

/// Takes the lowest free uid of `pool` (`flock(LOCK_EX | LOCK_NB)` on `<dir>/<uid>`, created if
/// missing), skipping any uid `/etc/passwd` names (a real host user must never own a sandbox's
/// namespace). Refuses a lock directory that is not a root-owned directory writable by root alone
/// (or that is a symlink): anyone able to hold those locks could make two sandboxes share a uid.
pub fn allocate_owner(pool: &OwnerPool) -> Result<OwnerUid, String> {
    let dir = open_lock_dir(pool)?;
    let users = host_user_uids(Path::new("/etc/passwd"));
    for uid in pool.base..pool.base.saturating_add(pool.count) {
        if users.contains(&uid) {
            continue;
        }
        let name = uid.to_string();
        let file = rustix::fs::openat(
            &dir,
            name.as_str(),
            OFlags::RDONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(|e| format!("failed to open {}/{name}: {e}", pool.dir.display()))?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => continue,
            Err(e) => return Err(format!("failed to lock {}/{name}: {e}", pool.dir.display())),
        }
        // The agent keeps the lock for the sandbox's life, in the sandbox: hold it through a
        // descriptor of a detached mount of the file alone, which names `/` inside rather than the
        // lock's host path. The lock moves to that descriptor (another open file description): a
        // second owner may take the uid in between, and then the scan goes on.
        let hidden = paddock_sys::mount::clone_detached(file.as_fd())
            .and_then(|detached| paddock_sys::fs_in_root::reopen(detached.as_fd(), OFlags::RDONLY))
            .map_err(|e| format!("failed to detach {}/{name}: {e}", pool.dir.display()))?;
        drop(file);
        match rustix::fs::flock(&hidden, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(OwnerUid { uid, lock: hidden }),
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(e) => return Err(format!("failed to lock {}/{name}: {e}", pool.dir.display())),
        }
    }
    Err(format!(
        "no free user-namespace owner uid: all {} of {}.. are taken by live sandboxes",
        pool.count, pool.base
    ))
}

/// The uids `passwd` (a file in `/etc/passwd`'s format) names; empty if it cannot be read (the pool's
/// range is far above the ranges distributions give users anyway). At most 16 MiB are read.
fn host_user_uids(passwd: &Path) -> BTreeSet<u32> {
    let mut text = String::new();
    let read = std::fs::File::open(passwd).and_then(|f| f.take(16 << 20).read_to_string(&mut text));
    if read.is_err() {
        return BTreeSet::new();
    }
    text.lines()
        .filter_map(|line| line.split(':').nth(2)?.trim().parse().ok())
        .collect()
}

/// Opens (creating it and its parent if missing, mode 0700) the lock directory, checked.
fn open_lock_dir(pool: &OwnerPool) -> Result<OwnedFd, String> {
    let shown = pool.dir.display();
    match std::fs::DirBuilder::new().recursive(true).create(&pool.dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("failed to create {shown}: {e}")),
    }
    let dir = paddock_sys::fs_in_root::open_dir_at(rustix::fs::CWD, &pool.dir)
        .map_err(|e| format!("failed to open {shown}: {e}"))?;
    let stat = rustix::fs::fstat(&dir).map_err(|e| format!("failed to inspect {shown}: {e}"))?;
    if stat.st_uid != 0 {
        return Err(format!("{shown} is not owned by root"));
    }
    if stat.st_mode & 0o077 != 0 {
        rustix::fs::fchmod(&dir, Mode::RWXU).map_err(|e| format!("failed to chmod {shown}: {e}"))?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_in(dir: &tempfile::TempDir, count: u32) -> OwnerPool {
        OwnerPool {
            dir: dir.path().join("owners"),
            base: 5_000,
            count,
        }
    }

    #[test]
    fn default_pool_is_apart_from_the_sandbox_ids() {
        let pool = OwnerPool::default_pool();
        assert!(!pool.overlaps(IdRange::DEFAULT));
        assert!(pool.base > 65_535, "above every ordinary and system uid");
        assert!(u64::from(pool.base) + u64::from(pool.count) < u64::from(u32::MAX) / 2);
        let touching = IdRange {
            base: pool.base + pool.count - 1,
            count: 1,
        };
        assert!(pool.overlaps(touching));
    }

    /// Two holders never get the same uid; a released uid is taken again; a full pool refuses.
    /// (The locks are per open file description, so one process can play several holders.)
    #[test]
    fn live_holders_never_share_a_uid() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: the lock directory must be owned by root");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let pool = pool_in(&dir, 3);
        let a = allocate_owner(&pool).expect("first");
        let b = allocate_owner(&pool).expect("second");
        let c = allocate_owner(&pool).expect("third");
        assert_eq!([a.uid, b.uid, c.uid], [5_000, 5_001, 5_002]);
        let full = allocate_owner(&pool).expect_err("all taken");
        assert!(full.contains("no free"), "{full}");
        drop(b);
        assert_eq!(allocate_owner(&pool).expect("released").uid, 5_001);
        let mode = std::fs::metadata(&pool.dir).expect("dir").permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o700);
    }

    #[test]
    fn uids_of_host_users_are_read_from_passwd() {
        let dir = tempfile::tempdir().expect("tempdir");
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            "root:x:0:0:root:/root:/bin/bash\nodd\nbig:x:1000065537:100::/:/bin/sh\nbad:x:x:1::/:\n",
        )
        .expect("write");
        assert_eq!(host_user_uids(&passwd), BTreeSet::from([0, 1_000_065_537]));
        assert!(host_user_uids(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn a_symlinked_lock_directory_is_refused() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED: the lock directory must be owned by root");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("elsewhere")).expect("mkdir");
        std::os::unix::fs::symlink("elsewhere", dir.path().join("owners")).expect("symlink");
        let err = allocate_owner(&pool_in(&dir, 3)).expect_err("symlink");
        assert!(err.contains("failed to open"), "{err}");
    }
}
