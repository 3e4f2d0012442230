//! Opening the database: file creation, connection settings, migrations; the `Store` handle itself and
//! its transactions.

use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, TransactionBehavior};

use crate::error::take_no_space_seen;
use crate::error::DbError;
use crate::migrate;
use crate::shm;
use crate::StoreError;

/// How long a statement waits for another connection's write lock before failing with "database is
/// locked". Writes are short, so this only runs out when something is badly wrong.
const BUSY_TIMEOUT: Duration = Duration::from_millis(5000);

/// A handle on the control plane's database.
///
/// One SQLite connection behind a mutex: every call is short, and SQLite serializes writers anyway.
/// Several `Store`s (in one process or several) may open the same file: every read-modify-write runs in
/// a `BEGIN IMMEDIATE` transaction, so their checks (quotas, the audit chain) stay race-free.
pub struct Store {
    conn: Mutex<Connection>,
    path: PathBuf,
    space: SpaceWatch,
}

/// Whether the database's file system is full, as the last write found it, and how many writes that
/// refused. Logged once when the condition starts and once when a write succeeds again.
#[derive(Debug, Default)]
struct SpaceWatch {
    full: AtomicBool,
    refused: AtomicU64,
}

/// The no-space condition as [`Store::space_status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceStatus {
    /// The last write found the file system full (and no write has succeeded since).
    pub full: bool,
    /// Writes refused for lack of space since the store was opened.
    pub refused_writes: u64,
}

impl SpaceWatch {
    fn refused(&self, path: &Path) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        if !self.full.swap(true, Ordering::Relaxed) {
            tracing::error!(
                database = %path.display(),
                "the state directory's file system is full: refusing writes (reads are still served) \
                 until space is freed"
            );
        }
    }

    fn written(&self, path: &Path) {
        if self.full.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                database = %path.display(),
                refused_writes = self.refused.load(Ordering::Relaxed),
                "the state directory's file system has space again: writes are accepted"
            );
        }
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (creating it with mode 0600 if missing) the database at `path` and brings its schema up to
    /// date. A database written by a newer paddock (unknown schema version) is refused.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        create_private_file(path)?;
        shm::prepare_directory()?;
        shm::guard_foreign_index(path)?;
        let conn = Connection::open(path).map_err(|e| StoreError::Open {
            path: path.to_owned(),
            source: DbError(e),
        })?;
        configure(&conn, path, true)?;
        let mut store = Store {
            conn: Mutex::new(conn),
            path: path.to_owned(),
            space: SpaceWatch::default(),
        };
        migrate::migrate(store.conn.get_mut().unwrap_or_else(PoisonError::into_inner), path)?;
        shm::check_index_relocated(path)?;
        Ok(store)
    }

    /// Opens the database at `path` for reading only: nothing is created or migrated, and a schema
    /// version other than the one this binary knows is refused. For audits and offline inspection.
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        let flags =
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
        shm::prepare_directory()?;
        let conn = Connection::open_with_flags(path, flags).map_err(|e| StoreError::Open {
            path: path.to_owned(),
            source: DbError(e),
        })?;
        configure(&conn, path, false)?;
        migrate::check_current(&conn, path)?;
        shm::check_index_relocated(path)?;
        Ok(Store {
            conn: Mutex::new(conn),
            path: path.to_owned(),
            space: SpaceWatch::default(),
        })
    }

    /// A fresh private in-memory database, fully migrated. For tests.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory().map_err(|e| StoreError::Open {
            path: path.clone(),
            source: DbError(e),
        })?;
        configure(&conn, &path, false)?;
        let mut store = Store {
            conn: Mutex::new(conn),
            path,
            space: SpaceWatch::default(),
        };
        migrate::migrate(
            store.conn.get_mut().unwrap_or_else(PoisonError::into_inner),
            &store.path,
        )?;
        Ok(store)
    }

    /// The schema version this database is at (always [`crate::SCHEMA_VERSION`] once opened).
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        migrate::read_version(&self.conn(), &self.path)
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction, committed if `f` returns `Ok` and rolled back
    /// otherwise. This is how a state change and its audit row are written together.
    pub fn transaction<T, E>(&self, f: impl FnOnce(&StoreTx<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<StoreError>,
    {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::begin("run a caller's transaction"))?;
        let store_tx = StoreTx { tx };
        let value = f(&store_tx)?;
        store_tx
            .tx
            .commit()
            .map_err(StoreError::commit("run a caller's transaction"))?;
        Ok(value)
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction: the store's own multi-statement writes.
    pub(crate) fn write<T>(
        &self,
        what: &'static str,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut conn = self.conn();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(StoreError::begin(what))?;
        let value = f(&tx)?;
        tx.commit().map_err(StoreError::commit(what))?;
        Ok(value)
    }

    /// Whether writes are being refused for lack of space, and how many have been.
    pub fn space_status(&self) -> SpaceStatus {
        SpaceStatus {
            full: self.space.full.load(Ordering::Relaxed),
            refused_writes: self.space.refused.load(Ordering::Relaxed),
        }
    }

    /// The connection. A panic while it was held cannot leave a transaction open (rusqlite rolls back
    /// on drop, which runs during unwinding), so a poisoned lock is safe to reuse.
    pub(crate) fn conn(&self) -> ConnGuard<'_> {
        let conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        // Left over from a write that failed outside any guard (opening, migrating): not this one's.
        take_no_space_seen();
        ConnGuard {
            changes_before: conn.total_changes(),
            conn,
            store: self,
        }
    }
}

/// The locked connection. When released it tells the store whether a write in between was refused
/// for lack of space ([`StoreError::NoSpace`] marks the thread) or rows were written, which is how the
/// no-space condition is noticed whichever store method met it.
pub(crate) struct ConnGuard<'a> {
    conn: MutexGuard<'a, Connection>,
    store: &'a Store,
    changes_before: u64,
}

impl Deref for ConnGuard<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl DerefMut for ConnGuard<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

impl Drop for ConnGuard<'_> {
    fn drop(&mut self) {
        if take_no_space_seen() {
            self.store.space.refused(&self.store.path);
        } else if self.conn.is_autocommit() && self.conn.total_changes() > self.changes_before {
            // Rows were written and no transaction is left open: they were committed.
            self.store.space.written(&self.store.path);
        }
    }
}

/// An open `BEGIN IMMEDIATE` transaction handed to the closure of [`Store::transaction`]. Its methods are
/// the store's write operations (and the reads they need), all committed or rolled back together.
pub struct StoreTx<'conn> {
    pub(crate) tx: rusqlite::Transaction<'conn>,
}

impl fmt::Debug for StoreTx<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreTx").finish_non_exhaustive()
    }
}

/// Creates `path` with mode 0600 unless it exists. SQLite gives its `-wal` and `-shm` files the
/// database file's permissions, so they are private too.
fn create_private_file(path: &Path) -> Result<(), StoreError> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(StoreError::CreateFile {
            path: path.to_owned(),
            source,
        }),
    }
}

/// `PRAGMA journal_mode = WAL`; the mode now in force. Switching takes an exclusive lock from a
/// shared one, and when several connections open a new database at once SQLite answers one of them
/// `SQLITE_BUSY` at once (deadlock avoidance: the busy handler is not called), so that answer is
/// retried until [`BUSY_TIMEOUT`], with a short pause that doubles up to 16 ms.
fn journal_mode_wal(conn: &Connection) -> rusqlite::Result<String> {
    let deadline = std::time::Instant::now() + BUSY_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        match conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)) {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(16));
            }
            other => return other,
        }
    }
}

fn configure(conn: &Connection, path: &Path, writable_file: bool) -> Result<(), StoreError> {
    let fail = |setting: &'static str| {
        move |e| StoreError::Configure {
            path: path.to_owned(),
            setting,
            source: DbError(e),
        }
    };
    conn.busy_timeout(BUSY_TIMEOUT).map_err(fail("busy_timeout"))?;
    conn.set_prepared_statement_cache_capacity(crate::cached::STATEMENT_CACHE);
    if writable_file {
        let mode = journal_mode_wal(conn).map_err(fail("journal_mode"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::WalRefused {
                path: path.to_owned(),
                mode,
            });
        }
        conn.execute_batch("PRAGMA synchronous = NORMAL")
            .map_err(fail("synchronous"))?;
    }
    conn.execute_batch("PRAGMA foreign_keys = ON")
        .map_err(fail("foreign_keys"))?;
    Ok(())
}
