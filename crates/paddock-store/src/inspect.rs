//! Read-only inspection for tests and diagnostics: the rows of one query, as JSON values.
//!
//! A database's wal-index lives where only paddock's SQLite build looks (see `shm.rs`), so an outside
//! SQLite (the `sqlite3` shell, python's `sqlite3`) cannot read a database a server has open. Tests that
//! check what the store recorded after a crash read it through here instead.
//!
//! What it does not do: write. A statement SQLite does not call read-only is refused before it runs,
//! whatever connection the store holds.

use rusqlite::types::ValueRef;
use serde_json::Value;

use crate::{Store, StoreError};

impl Store {
    /// Every row `sql` selects, each a list of its columns' values (text, numbers and null as JSON;
    /// a blob as its lowercase hex). Refuses a statement that could write.
    pub fn inspect(&self, sql: &str) -> Result<Vec<Vec<Value>>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(sql)
            .map_err(StoreError::read("an inspection query"))?;
        if !stmt.readonly() {
            return Err(StoreError::NotReadOnly { sql: sql.to_owned() });
        }
        let columns = stmt.column_count();
        let mut rows = stmt.query([]).map_err(StoreError::read("an inspection query"))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(StoreError::read("an inspection query"))? {
            let mut values = Vec::with_capacity(columns);
            for i in 0..columns {
                let value = row.get_ref(i).map_err(StoreError::read("an inspection query"))?;
                values.push(match value {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(n) => Value::from(n),
                    ValueRef::Real(f) => Value::from(f),
                    ValueRef::Text(t) => Value::from(String::from_utf8_lossy(t).into_owned()),
                    ValueRef::Blob(b) => Value::from(hex::encode(b)),
                });
            }
            out.push(values);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_back_as_json_and_writes_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("paddock.db");
        drop(Store::open(&db).expect("create"));
        let store = Store::open_read_only(&db).expect("open read-only");
        let rows = store.inspect("SELECT 1, 'two', NULL, x'ff00'").expect("select");
        assert_eq!(
            rows,
            vec![vec![
                Value::from(1),
                Value::from("two"),
                Value::Null,
                Value::from("ff00")
            ]]
        );
        let writable = Store::open(&db).expect("open");
        for sql in ["DELETE FROM sandboxes", "CREATE TABLE t (x)"] {
            assert!(
                matches!(writable.inspect(sql), Err(StoreError::NotReadOnly { .. })),
                "{sql}"
            );
        }
    }
}
