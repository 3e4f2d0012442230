//! Where the database's wal-index lives, and the checks that keep it there.
//!
//! SQLite memory-maps a WAL database's wal-index (the `-shm` file). Next to the database on a
//! copy-on-write file system (btrfs), every write fault on that mapping must reserve new space, so once
//! the state directory's file system is full the server's next commit dies of SIGBUS instead of getting
//! an error. Preallocating the file does not help there: a copy-on-write file is never overwritten in
//! place. paddock's SQLite is therefore built with `SQLITE_SHM_DIRECTORY` (see `.cargo/config.toml`): the
//! wal-index of every database lives in [`SHM_DIRECTORY`] on tmpfs, which does not copy on write, so
//! SQLite's own preallocation (it writes one byte of each new page before mapping it) turns a full tmpfs
//! into an ordinary error and a full state directory into `SQLITE_FULL` on the WAL's `write`.
//!
//! Every paddock process uses the same build, so they agree on the index's place and still share the
//! database (the server, `paddock keys`, `paddock audit verify`). Another SQLite (the `sqlite3` shell)
//! would look for the index next to the database and, not seeing paddock's, corrupt the WAL by writing
//! with its own: [`guard_foreign_index`] makes `<db>-shm` a dangling symlink, which SQLite refuses to
//! open (`O_NOFOLLOW`), so such a tool fails with "unable to open database file" instead.
//!
//! What this module does not do: it does not create or size the index (SQLite does), and it cannot stop a
//! foreign SQLite that ignores the symlink; the directory's check refuses a tmpfs directory someone else
//! owns or can write to, since the index steers what the server reads.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::StoreError;

/// Where every paddock SQLite keeps its wal-indexes. Must equal `SQLITE_SHM_DIRECTORY` in
/// `.cargo/config.toml`.
pub const SHM_DIRECTORY: &str = "/dev/shm/paddock-sqlite";

/// What a foreign SQLite finds at `<db>-shm`: a symlink to nowhere, whose target says why.
const FOREIGN_GUARD_TARGET: &str =
    "paddock keeps this database's wal-index in /dev/shm/paddock-sqlite; open it with paddock only";

/// tmpfs's `f_type` (`TMPFS_MAGIC` in `linux/magic.h`).
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Creates [`SHM_DIRECTORY`] (mode 0700) unless it exists, and checks it is a real directory on tmpfs,
/// owned by this process's user and closed to everyone else.
pub(crate) fn prepare_directory() -> Result<(), StoreError> {
    let dir = Path::new(SHM_DIRECTORY);
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(StoreError::ShmDirectory {
                path: dir.to_owned(),
                source,
            })
        }
    }
    let meta = fs::symlink_metadata(dir).map_err(|source| StoreError::ShmDirectory {
        path: dir.to_owned(),
        source,
    })?;
    let fs_type = rustix::fs::statfs(dir)
        .map_err(|e| StoreError::ShmDirectory {
            path: dir.to_owned(),
            source: e.into(),
        })?
        .f_type;
    let found = DirectoryFacts {
        is_dir: meta.file_type().is_dir(),
        owner: meta.uid(),
        mode: meta.mode(),
        on_tmpfs: fs_type == TMPFS_MAGIC,
    };
    match directory_problem(&found, rustix::process::geteuid().as_raw()) {
        None => Ok(()),
        Some(problem) => Err(StoreError::ShmDirectoryUnsafe {
            path: dir.to_owned(),
            problem,
        }),
    }
}

/// What [`prepare_directory`] found.
#[derive(Debug, Clone, Copy)]
struct DirectoryFacts {
    is_dir: bool,
    owner: u32,
    mode: u32,
    on_tmpfs: bool,
}

/// Why the wal-index directory must not be used, if it must not.
fn directory_problem(found: &DirectoryFacts, euid: u32) -> Option<&'static str> {
    if !found.is_dir {
        Some("it is not a directory")
    } else if found.owner != euid {
        Some("it belongs to another user")
    } else if found.mode & 0o077 != 0 {
        Some("other users can use it (mode must be 0700)")
    } else if !found.on_tmpfs {
        Some("it is not on tmpfs, so a full file system could still turn a write into SIGBUS")
    } else {
        None
    }
}

/// Makes `<db>-shm` a dangling symlink so that a SQLite built without paddock's setting cannot open
/// the database in WAL mode next to paddock (see the module docs). A regular file there is a stale
/// index from a paddock built before the setting, and is replaced.
pub(crate) fn guard_foreign_index(db: &Path) -> Result<(), StoreError> {
    let guard = sibling(db, "-shm");
    let fail = |source| StoreError::ShmGuard {
        path: guard.clone(),
        source,
    };
    match fs::symlink_metadata(&guard) {
        Ok(meta) if meta.file_type().is_symlink() => return Ok(()),
        Ok(_) => fs::remove_file(&guard).map_err(fail)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(fail(source)),
    }
    match std::os::unix::fs::symlink(FOREIGN_GUARD_TARGET, &guard) {
        Ok(()) => Ok(()),
        // Another process opening the same database got there first.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(fail(source)),
    }
}

/// Checks that SQLite put the wal-index of the open database `db` in [`SHM_DIRECTORY`]: it has, once
/// a WAL database has been read, unless this binary's SQLite was built without the setting.
pub(crate) fn check_index_relocated(db: &Path) -> Result<(), StoreError> {
    let meta = fs::metadata(db).map_err(|source| StoreError::ShmDirectory {
        path: db.to_owned(),
        source,
    })?;
    let index = index_path(meta.ino(), meta.dev());
    if index.exists() {
        Ok(())
    } else {
        Err(StoreError::ShmNotRelocated {
            path: db.to_owned(),
            expected: index,
        })
    }
}

/// The wal-index SQLite uses for the database with inode `ino` on device `dev`: the name
/// `unixOpenSharedMemory` builds under `SQLITE_SHM_DIRECTORY` (both numbers truncated to 32 bits).
fn index_path(ino: u64, dev: u64) -> PathBuf {
    Path::new(SHM_DIRECTORY).join(format!("sqlite-shm-{:x}-{:x}", ino as u32, dev as u32))
}

fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: DirectoryFacts = DirectoryFacts {
        is_dir: true,
        owner: 0,
        mode: 0o040700,
        on_tmpfs: true,
    };

    #[test]
    fn a_private_tmpfs_directory_is_accepted() {
        assert_eq!(directory_problem(&GOOD, 0), None);
    }

    #[test]
    fn a_directory_others_own_or_can_use_is_refused() {
        assert!(directory_problem(&GOOD, 1000).is_some());
        for mode in [0o040750, 0o040701, 0o041777] {
            let open = DirectoryFacts { mode, ..GOOD };
            assert!(directory_problem(&open, 0).is_some(), "{mode:o}");
        }
        let file = DirectoryFacts {
            is_dir: false,
            ..GOOD
        };
        assert!(directory_problem(&file, 0).is_some());
    }

    #[test]
    fn a_directory_off_tmpfs_is_refused() {
        let disk = DirectoryFacts {
            on_tmpfs: false,
            ..GOOD
        };
        assert!(directory_problem(&disk, 0).is_some());
    }

    #[test]
    fn the_index_name_is_sqlites() {
        assert_eq!(
            index_path(0x1_0000_0abc, 0x2d),
            Path::new("/dev/shm/paddock-sqlite/sqlite-shm-abc-2d")
        );
    }
}
