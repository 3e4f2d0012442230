//! The store's one error type.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("failed to create database file {path}")]
    CreateFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("failed to open database {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: DbError,
    },
    #[error("failed to configure database {path} ({setting})")]
    Configure {
        path: PathBuf,
        setting: &'static str,
        #[source]
        source: DbError,
    },
    #[error("database {path} refused write-ahead logging (journal mode stayed {mode})")]
    WalRefused { path: PathBuf, mode: String },
    #[error("failed to read the schema version of {path}")]
    ReadSchemaVersion {
        path: PathBuf,
        #[source]
        source: DbError,
    },
    #[error(
        "database {path} has schema version {found}, newer than {latest}, the latest this binary knows; \
         refusing to use it (was it written by a newer paddock?)"
    )]
    SchemaTooNew { path: PathBuf, found: i64, latest: i64 },
    #[error(
        "database {path} has schema version {found}, older than {latest}; \
         open it read-write once to migrate it"
    )]
    SchemaOutdated { path: PathBuf, found: i64, latest: i64 },
    #[error("failed to apply migration {version} to {path}")]
    Migrate {
        path: PathBuf,
        version: i64,
        #[source]
        source: DbError,
    },
    #[error("failed to begin a transaction to {what}")]
    Begin {
        what: &'static str,
        #[source]
        source: DbError,
    },
    #[error("failed to commit the transaction to {what}")]
    Commit {
        what: &'static str,
        #[source]
        source: DbError,
    },
    #[error("failed to read {what}")]
    Read {
        what: &'static str,
        #[source]
        source: DbError,
    },
    #[error("failed to write {what}")]
    Write {
        what: &'static str,
        #[source]
        source: DbError,
    },
    #[error("refusing to inspect with {sql:?}: the statement could write")]
    NotReadOnly { sql: String },
    #[error("{what} {id} already exists")]
    Conflict { what: &'static str, id: String },
    #[error("{what} {id} does not exist")]
    Missing { what: &'static str, id: String },
    #[error("tenant {tenant} does not exist")]
    UnknownTenant { tenant: String },
    #[error("sandbox {id} has no tenant to check a quota against")]
    NoTenant { id: String },
    #[error(
        "tenant {tenant} would exceed its {what} quota: limit {limit}, requested total {requested_total}"
    )]
    QuotaExceeded {
        tenant: String,
        /// The quota's field: `max_sandboxes`, `max_memory` (bytes), `max_cpus` (millicpus),
        /// `max_snapshots`, `max_volumes`, `max_templates` or `max_storage` (bytes).
        what: &'static str,
        limit: u64,
        requested_total: u64,
    },
    #[error("{field} value {value} does not fit in the database's signed 64-bit integers")]
    OutOfRange { field: &'static str, value: u64 },
    #[error("stored {what} is corrupt: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error(
        "no space left to {what}: the file system holding the database is full \
         (writes are refused until space is freed; reads still work)"
    )]
    NoSpace {
        what: &'static str,
        #[source]
        source: DbError,
    },
    #[error("failed to prepare the wal-index directory {path}")]
    ShmDirectory {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("refusing the wal-index directory {path}: {problem}")]
    ShmDirectoryUnsafe { path: PathBuf, problem: &'static str },
    #[error("failed to make {path} a guard against SQLite builds that keep the wal-index there")]
    ShmGuard {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the wal-index of {path} is not at {expected}: this paddock's SQLite was built without \
         SQLITE_SHM_DIRECTORY (see .cargo/config.toml), so a full disk could kill it with SIGBUS"
    )]
    ShmNotRelocated { path: PathBuf, expected: PathBuf },
    #[error("failed to encode {what} as JSON")]
    EncodeJson {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl StoreError {
    pub(crate) fn read(what: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |e| StoreError::Read {
            what,
            source: DbError(e),
        }
    }

    pub(crate) fn write(what: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |e| {
            no_space(what, e).unwrap_or_else(|e| StoreError::Write {
                what,
                source: DbError(e),
            })
        }
    }

    pub(crate) fn begin(what: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |e| {
            no_space(what, e).unwrap_or_else(|e| StoreError::Begin {
                what,
                source: DbError(e),
            })
        }
    }

    pub(crate) fn commit(what: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |e| {
            no_space(what, e).unwrap_or_else(|e| StoreError::Commit {
                what,
                source: DbError(e),
            })
        }
    }

    /// Whether this is a write refused for lack of space ([`StoreError::NoSpace`]).
    pub fn is_no_space(&self) -> bool {
        matches!(self, StoreError::NoSpace { .. })
    }
}

thread_local! {
    /// Set when a write on this thread failed for lack of space; read and cleared by the connection
    /// guard (`open::ConnGuard`) when it is released, which is how the store notices the condition
    /// whichever of its methods hit it.
    static NO_SPACE_SEEN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Takes (and clears) this thread's "a write failed for lack of space" mark.
pub(crate) fn take_no_space_seen() -> bool {
    NO_SPACE_SEEN.with(|seen| seen.replace(false))
}

/// `e` as [`StoreError::NoSpace`] if it says the disk is full, `e` itself otherwise. Reads the
/// thread's `errno` for an I/O error: SQLite reports `ENOSPC` on `write` as `SQLITE_FULL` but other
/// calls (`fsync`, `ftruncate`) as `SQLITE_IOERR_*`, leaving the cause in `errno` (no system call
/// between SQLite's failure and this conversion can fail and overwrite it).
fn no_space(what: &'static str, e: rusqlite::Error) -> Result<StoreError, rusqlite::Error> {
    let primary = match &e {
        rusqlite::Error::SqliteFailure(f, _) => f.extended_code & 0xff,
        _ => return Err(e),
    };
    let errno = io::Error::last_os_error().raw_os_error();
    if is_no_space(primary, errno) {
        NO_SPACE_SEEN.with(|seen| seen.set(true));
        Ok(StoreError::NoSpace {
            what,
            source: DbError(e),
        })
    } else {
        Err(e)
    }
}

/// Whether an SQLite result code (primary) with the thread's `errno` means "no space".
fn is_no_space(primary: i32, errno: Option<i32>) -> bool {
    primary == rusqlite::ffi::SQLITE_FULL
        || (primary == rusqlite::ffi::SQLITE_IOERR && matches!(errno, Some(libc::ENOSPC | libc::EDQUOT)))
}

/// An error from SQLite, kept opaque so that no `rusqlite` type is part of this crate's API.
#[derive(Debug)]
pub struct DbError(pub(crate) rusqlite::Error);

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Which constraint an insert violated, when that is the reason it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Violation {
    PrimaryKey,
    ForeignKey,
}

pub(crate) fn violation(e: &rusqlite::Error) -> Option<Violation> {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => match f.extended_code {
            rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY | rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE => {
                Some(Violation::PrimaryKey)
            }
            rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY => Some(Violation::ForeignKey),
            _ => None,
        },
        _ => None,
    }
}

/// Converts an unsigned quantity for storage in an SQLite INTEGER.
pub(crate) fn to_i64(field: &'static str, value: u64) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError::OutOfRange { field, value })
}

/// Converts a stored INTEGER back to the unsigned quantity it was written from.
pub(crate) fn from_i64<T: TryFrom<i64>>(what: &'static str, value: i64) -> Result<T, StoreError> {
    T::try_from(value).map_err(|_| StoreError::Corrupt {
        what,
        detail: format!("value {value} is out of range"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::ffi;

    #[test]
    fn a_full_disk_is_no_space() {
        assert!(is_no_space(ffi::SQLITE_FULL, None));
        assert!(is_no_space(ffi::SQLITE_FULL, Some(0)));
        assert!(is_no_space(ffi::SQLITE_IOERR, Some(libc::ENOSPC)));
        assert!(is_no_space(ffi::SQLITE_IOERR, Some(libc::EDQUOT)));
    }

    #[test]
    fn other_failures_are_not() {
        assert!(!is_no_space(ffi::SQLITE_IOERR, Some(libc::EIO)));
        assert!(!is_no_space(ffi::SQLITE_IOERR, None));
        assert!(!is_no_space(ffi::SQLITE_BUSY, Some(libc::ENOSPC)));
        assert!(!is_no_space(ffi::SQLITE_CONSTRAINT, None));
    }
}
