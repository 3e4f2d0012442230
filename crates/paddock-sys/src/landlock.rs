//! Landlock: confine where the calling thread (and everything it later executes) may write.
//!
//! [`restrict_writes`] builds one ruleset with the `landlock` crate: every file-system access right of
//! the tested ABI is handled (so denied unless a rule grants it), read and execute are granted on the
//! whole tree (`/`), and every right is granted beneath each writable path. Where the kernel supports
//! scoping (ABI 6+), abstract UNIX sockets and signals are also scoped to the sandbox.
//!
//! Compatibility is best-effort, as the crate recommends: on an older kernel the rights it lacks are
//! left out and the result says [`LandlockStatus::PartiallyEnforced`] (or `NotEnforced` without
//! Landlock). The caller decides whether that is acceptable; this module never silently claims more.
//!
//! What this module does not do: network rules (egress is enforced elsewhere), or choose the writable
//! paths (that is the sandbox spec's job).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, BitFlags, PathBeneath, PathFd, PathFdError, RestrictionStatus, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetError, RulesetStatus, Scope, ABI,
};

/// The newest Landlock ABI this code was written and tested against (Linux 6.15+). Raising it is a
/// deliberate change: ABI 9 adds `LANDLOCK_ACCESS_FS_RESOLVE_UNIX`, which would also refuse connecting
/// to UNIX sockets outside the writable paths. On older kernels the crate degrades to what they have.
const TESTED_ABI: ABI = ABI::V7;

/// How much of the requested confinement the running kernel enforces (from the crate's
/// `RulesetStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandlockStatus {
    /// Every requested restriction is in force.
    FullyEnforced,
    /// Landlock is in force but the kernel lacks some of the requested rights or scopes (its ABI is
    /// older than 7); e.g. without ABI 3 truncation is not restricted, without ABI 6 nothing is scoped.
    PartiallyEnforced,
    /// The kernel has no (enabled) Landlock: nothing is restricted.
    NotEnforced,
}

/// Why Landlock could not be set up. Each variant names the step; the source is the crate's error.
#[derive(Debug, thiserror::Error)]
pub enum LandlockError {
    /// Declaring the handled access rights or scopes, or creating the ruleset, failed.
    #[error("failed to create the landlock ruleset")]
    CreateRuleset {
        /// The crate's error.
        #[source]
        source: RulesetError,
    },
    /// A path to grant rights on exists but could not be opened or inspected.
    #[error("failed to open {path} for a landlock rule")]
    OpenPath {
        /// The path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Adding the rule for a path to the ruleset failed.
    #[error("failed to add the landlock rule for {path}")]
    AddRule {
        /// The path.
        path: PathBuf,
        /// The crate's error.
        #[source]
        source: RulesetError,
    },
    /// The descriptor passed as `exec_file` could not be inspected.
    #[error("failed to inspect the executable file descriptor for a landlock rule")]
    InspectExecFile {
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Adding the rule for the descriptor passed as `exec_file` failed.
    #[error("failed to add the landlock rule for the executable file descriptor")]
    AddExecRule {
        /// The crate's error.
        #[source]
        source: RulesetError,
    },
    /// `landlock_restrict_self` (or the `no_new_privs` it needs) failed.
    #[error("failed to enforce the landlock ruleset")]
    RestrictSelf {
        /// The crate's error.
        #[source]
        source: RulesetError,
    },
}

/// Confines the calling thread, and every process it creates or executes afterwards, so that it can
/// read and execute anywhere but write only beneath the paths in `writable`. Irreversible.
///
/// "Write" means every file-system right Landlock has besides read and execute: writing and truncating
/// files, creating, removing, renaming and linking entries, and `ioctl` on device files. Because of
/// the latter two, **character devices a program writes to must be listed too**, e.g. `/dev/null`,
/// `/dev/zero`, `/dev/tty`, `/dev/ptmx` and `/dev/pts` (for the sandbox's terminals) and `/dev/shm`.
/// Rights attach to files when they are opened: descriptors opened before this call (such as an
/// inherited pty slave) keep working.
///
/// A writable path that is a file rather than a directory gets the rights that apply to files. Paths
/// that do not exist are skipped without error. Also sets `no_new_privs`, which Landlock requires.
/// With ABI 6+, the thread also can no longer connect to abstract UNIX sockets or signal processes
/// created outside this Landlock domain.
///
/// `exec_file` is a file (or directory) outside the `/` in force, typically the agent binary opened
/// before `pivot_root` and later run with `execveat(fd, "", AT_EMPTY_PATH)`: Landlock judges a file by
/// its own path, so without this rule executing it would fail with `EACCES`. It gets read and execute
/// rights only.
pub fn restrict_writes(
    writable: &[PathBuf],
    exec_file: Option<BorrowedFd<'_>>,
) -> Result<LandlockStatus, LandlockError> {
    let all = AccessFs::from_all(TESTED_ABI);
    let mut ruleset = Ruleset::default()
        .handle_access(all)
        .and_then(|ruleset| ruleset.scope(Scope::from_all(TESTED_ABI)))
        .and_then(|ruleset| ruleset.create())
        .map_err(|source| LandlockError::CreateRuleset { source })?;

    let root = Path::new("/");
    let root_fd = open_path(root)?.ok_or_else(|| LandlockError::OpenPath {
        path: root.to_path_buf(),
        source: io::Error::from(io::ErrorKind::NotFound),
    })?;
    ruleset = ruleset
        .add_rule(PathBeneath::new(root_fd, AccessFs::from_read(TESTED_ABI)))
        .map_err(|source| LandlockError::AddRule {
            path: root.to_path_buf(),
            source,
        })?;

    for path in writable {
        let Some(fd) = open_path(path)? else { continue };
        let access = rights_for(&fd, all).map_err(|source| LandlockError::OpenPath {
            path: path.clone(),
            source,
        })?;
        ruleset =
            ruleset
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|source| LandlockError::AddRule {
                    path: path.clone(),
                    source,
                })?;
    }

    if let Some(fd) = exec_file {
        let access = rights_for(fd, AccessFs::from_read(TESTED_ABI))
            .map_err(|source| LandlockError::InspectExecFile { source })?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|source| LandlockError::AddExecRule { source })?;
    }

    let status = ruleset
        .restrict_self()
        .map_err(|source| LandlockError::RestrictSelf { source })?;
    Ok(status_of(&status))
}

/// Opens `path` with `O_PATH` for a rule; `None` if it does not exist.
fn open_path(path: &Path) -> Result<Option<PathFd>, LandlockError> {
    match PathFd::new(path) {
        Ok(fd) => Ok(Some(fd)),
        Err(PathFdError::OpenCall { source, .. })
            if matches!(source.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
        {
            Ok(None)
        }
        Err(PathFdError::OpenCall { source, .. }) => Err(LandlockError::OpenPath {
            path: path.to_path_buf(),
            source,
        }),
        // PathFdError is non_exhaustive.
        Err(other) => Err(LandlockError::OpenPath {
            path: path.to_path_buf(),
            source: io::Error::other(other),
        }),
    }
}

/// The subset of `wanted` that Landlock accepts on this kind of file: the kernel refuses
/// directory-only rights (reading a directory, creating or removing entries, `refer`) on a
/// non-directory.
fn rights_for(fd: impl AsFd, wanted: BitFlags<AccessFs>) -> io::Result<BitFlags<AccessFs>> {
    let stat = rustix::fs::fstat(fd)?;
    let is_dir = rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory;
    Ok(if is_dir {
        wanted
    } else {
        wanted & AccessFs::from_file(TESTED_ABI)
    })
}

/// Maps the crate's enforcement report to ours.
fn status_of(status: &RestrictionStatus) -> LandlockStatus {
    match status.ruleset {
        RulesetStatus::FullyEnforced => LandlockStatus::FullyEnforced,
        RulesetStatus::PartiallyEnforced => LandlockStatus::PartiallyEnforced,
        RulesetStatus::NotEnforced => LandlockStatus::NotEnforced,
    }
}

/// The Landlock ABI version the running kernel offers, or `None` when Landlock is not available
/// (not built in, or disabled at boot). One `landlock_create_ruleset(NULL, 0, VERSION)` call.
pub fn kernel_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with the VERSION flag the kernel reads no attribute struct (NULL with size 0 is the
    // documented form) and only returns the ABI number; no memory is written.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(r).ok().filter(|v| *v > 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn kernel_abi_matches_what_the_landlock_crate_sees() {
        use landlock::{CompatLevel, Compatible};
        let crate_sees = landlock::Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(landlock::AccessFs::from_all(landlock::ABI::V1))
            .and_then(|r| r.create())
            .is_ok();
        assert_eq!(super::kernel_abi().is_some(), crate_sees);
    }

    use std::fs;
    use std::process::Command;

    use super::*;
    use crate::child_test::{in_child, run_in_child_with_env};

    /// Set in the environment of a child test process; its value is the test to run there (see
    /// [`crate::child_test`]).
    const CHILD_ENV: &str = "PADDOCK_SYS_LANDLOCK_CHILD";
    /// Set in the environment of the child test process: the writable directory.
    const WRITABLE_ENV: &str = "PADDOCK_SYS_LANDLOCK_WRITABLE";
    /// Set in the environment of the child test process: a directory that must stay read-only.
    const READONLY_ENV: &str = "PADDOCK_SYS_LANDLOCK_READONLY";

    #[test]
    fn files_get_file_rights_only() {
        let fd = PathFd::new("/dev/null").expect("open /dev/null");
        let rights = rights_for(&fd, AccessFs::from_all(TESTED_ABI)).expect("fstat");
        let read = rights_for(&fd, AccessFs::from_read(TESTED_ABI)).expect("fstat");
        assert_eq!(
            read,
            AccessFs::Execute | AccessFs::ReadFile,
            "no ReadDir on a file"
        );
        assert!(rights.contains(AccessFs::WriteFile | AccessFs::IoctlDev));
        assert!(!rights.intersects(AccessFs::MakeReg | AccessFs::RemoveFile | AccessFs::Refer));
        let dir = PathFd::new("/").expect("open /");
        assert_eq!(
            rights_for(&dir, AccessFs::from_all(TESTED_ABI)).expect("fstat"),
            AccessFs::from_all(TESTED_ABI)
        );
    }

    #[test]
    fn missing_paths_are_skipped() {
        assert!(open_path(Path::new("/nonexistent/paddock/landlock"))
            .expect("no error")
            .is_none());
        assert!(open_path(Path::new("/etc/hostname/below-a-file"))
            .expect("no error")
            .is_none());
    }

    /// Landlock is irreversible, so the restricted part runs in a fresh process; the directories are
    /// made (and removed) here, outside the sandbox.
    #[test]
    fn writes_are_confined_in_child() {
        let name = "landlock::tests::writes_are_confined_in_child";
        if in_child(CHILD_ENV, name) {
            child_writes_are_confined();
            return;
        }
        let writable = tempfile::tempdir().expect("tempdir");
        let readonly = tempfile::tempdir().expect("tempdir");
        run_in_child_with_env(
            CHILD_ENV,
            name,
            &[
                (WRITABLE_ENV, writable.path().as_os_str()),
                (READONLY_ENV, readonly.path().as_os_str()),
            ],
        );
        assert!(
            !readonly.path().join("x").exists(),
            "the read-only directory was written"
        );
    }

    /// The body of `writes_are_confined_in_child`, run in its child process.
    fn child_writes_are_confined() {
        let writable =
            PathBuf::from(std::env::var_os(WRITABLE_ENV).expect("run through writes_are_confined_in_child"));
        let readonly =
            PathBuf::from(std::env::var_os(READONLY_ENV).expect("run through writes_are_confined_in_child"));
        let true_bin = fs::File::open("/bin/true").expect("open /bin/true");
        let writable_paths = [
            writable.clone(),
            PathBuf::from("/dev/null"),
            PathBuf::from("/nonexistent/paddock/landlock"),
        ];
        let status = restrict_writes(&writable_paths, Some(true_bin.as_fd())).expect("restrict_writes");
        match status {
            LandlockStatus::NotEnforced => {
                eprintln!("SKIPPED: this kernel does not enforce Landlock");
                return;
            }
            LandlockStatus::PartiallyEnforced => {
                eprintln!("note: Landlock only partially enforced (ABI < 7)")
            }
            LandlockStatus::FullyEnforced => {}
        }

        fs::write(writable.join("x"), b"ok").expect("write beneath a writable path");
        fs::create_dir(writable.join("sub")).expect("mkdir beneath a writable path");
        fs::rename(writable.join("x"), writable.join("sub/y")).expect("rename beneath a writable path");
        fs::remove_file(writable.join("sub/y")).expect("unlink beneath a writable path");
        fs::write("/dev/null", b"discarded").expect("write the listed /dev/null");

        let err = fs::write(readonly.join("x"), b"no").expect_err("write outside the writable paths");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        let err = fs::create_dir(readonly.join("d")).expect_err("mkdir outside the writable paths");
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");

        // Reading and executing still work everywhere.
        fs::read_to_string("/proc/self/status").expect("read outside the writable paths");
        assert!(Command::new("/bin/true")
            .status()
            .expect("exec /bin/true")
            .success());

        if status == LandlockStatus::FullyEnforced {
            // Signal scoping: the parent test process is outside this Landlock domain.
            let parent = rustix::process::getppid().expect("has a parent");
            let err = rustix::process::test_kill_process(parent).expect_err("signal outside the domain");
            assert_eq!(err, rustix::io::Errno::PERM);
        }
    }
}
