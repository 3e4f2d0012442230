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
        /// `max_snapshots`, `max_volumes` or `max_storage` (bytes).
        what: &'static str,
        limit: u64,
        requested_total: u64,
    },
    #[error("{field} value {value} does not fit in the database's signed 64-bit integers")]
    OutOfRange { field: &'static str, value: u64 },
    #[error("stored {what} is corrupt: {detail}")]
    Corrupt { what: &'static str, detail: String },
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
        move |e| StoreError::Write {
            what,
            source: DbError(e),
        }
    }

    pub(crate) fn begin(what: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |e| StoreError::Begin {
            what,
            source: DbError(e),
        }
    }

    pub(crate) fn commit(what: &'static str) -> impl FnOnce(rusqlite::Error) -> StoreError {
        move |e| StoreError::Commit {
            what,
            source: DbError(e),
        }
    }
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
