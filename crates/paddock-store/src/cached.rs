//! Statements through the connection's prepared-statement cache.
//!
//! `Connection::execute` and `Connection::query_row` parse their SQL on every call; under load
//! (create, exec and destroy through the API, 100 clients) that parsing was about a tenth of the
//! server's CPU (`perf`, `bench/throughput.py`). These do the same through `prepare_cached`, so
//! each statement is parsed once per connection. The SQL must not be built from values: those go
//! in `params`, or every distinct string would take a slot of the cache.
//!
//! This module does not change what a statement does or how its errors read.

use rusqlite::{Connection, Params, Row};

/// How many prepared statements a connection keeps, least recently used first out. The store's
/// fixed statements number about 120; the filtered listings (audit, sandboxes, snapshots) add one
/// per combination of filters, placeholders only, so the set is bounded but can exceed this. The
/// statements every create, exec and destroy runs are used constantly, so a rare listing evicts
/// other rare ones, not them.
pub(crate) const STATEMENT_CACHE: usize = 256;

/// `execute` and `query_row` through the prepared-statement cache.
pub(crate) trait Cached {
    /// [`Connection::execute`], prepared once.
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
    /// [`Connection::query_row`], prepared once.
    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>;
}

impl Cached for Connection {
    fn execute_cached<P: Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    fn query_row_cached<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: Params,
        F: FnOnce(&Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }
}
