//! Changing a stored sandbox: compare-and-set state transitions, expiry, and purging old history.

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection};

use crate::cached::Cached;
use crate::{SandboxState, Store, StoreError, StoreTx};

const ENDED_STATES_SQL: &str = "('killed', 'expired', 'failed')";

impl Store {
    /// Moves sandbox `id` to `to` if its current state is one of `from` (compare-and-set). Moving to an
    /// ended state also records `now_ms` as its end and `end_reason`. `false` if the sandbox does not
    /// exist or is in no state of `from`.
    pub fn transition_sandbox(
        &self,
        id: &str,
        from: &[SandboxState],
        to: SandboxState,
        now_ms: i64,
        end_reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        transition_sandbox(&self.conn(), id, from, to, now_ms, end_reason)
    }

    /// Marks a running sandbox paused (or not). `false` if there is no such running sandbox or it is
    /// already so.
    pub fn set_sandbox_paused(&self, id: &str, paused: bool) -> Result<bool, StoreError> {
        set_sandbox_paused(&self.conn(), id, paused)
    }

    /// Sets (or with `None`, clears) the sandbox's expiry. `false` if there is no such sandbox.
    pub fn set_sandbox_expiry(&self, id: &str, expires_at_ms: Option<i64>) -> Result<bool, StoreError> {
        set_sandbox_expiry(&self.conn(), id, expires_at_ms)
    }

    /// Deletes the records of sandboxes that ended before `before_ms` (housekeeping: ended rows are kept
    /// as history until then), with their approval policies. Their audit rows stay. Returns how many
    /// were deleted.
    pub fn purge_ended_sandboxes(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.transaction(|tx| {
            tx.tx
                .execute_cached(
                    &format!(
                        "DELETE FROM approval_policies WHERE sandbox_id IN (
                           SELECT id FROM sandboxes
                           WHERE state IN {ENDED_STATES_SQL} AND COALESCE(ended_at_ms, created_at_ms) < ?1)"
                    ),
                    [before_ms],
                )
                .map_err(StoreError::write("sandbox purge"))?;
            let deleted = tx
                .tx
                .execute_cached(
                    &format!(
                        "DELETE FROM sandboxes
                         WHERE state IN {ENDED_STATES_SQL} AND COALESCE(ended_at_ms, created_at_ms) < ?1"
                    ),
                    [before_ms],
                )
                .map_err(StoreError::write("sandbox purge"))?;
            Ok(deleted as u64)
        })
    }
}

impl StoreTx<'_> {
    /// [`Store::set_sandbox_paused`] inside this transaction.
    pub fn set_sandbox_paused(&self, id: &str, paused: bool) -> Result<bool, StoreError> {
        set_sandbox_paused(&self.tx, id, paused)
    }

    /// [`Store::transition_sandbox`] inside this transaction.
    pub fn transition_sandbox(
        &self,
        id: &str,
        from: &[SandboxState],
        to: SandboxState,
        now_ms: i64,
        end_reason: Option<&str>,
    ) -> Result<bool, StoreError> {
        transition_sandbox(&self.tx, id, from, to, now_ms, end_reason)
    }

    /// [`Store::set_sandbox_expiry`] inside this transaction.
    pub fn set_sandbox_expiry(&self, id: &str, expires_at_ms: Option<i64>) -> Result<bool, StoreError> {
        set_sandbox_expiry(&self.tx, id, expires_at_ms)
    }
}

fn transition_sandbox(
    conn: &Connection,
    id: &str,
    from: &[SandboxState],
    to: SandboxState,
    now_ms: i64,
    end_reason: Option<&str>,
) -> Result<bool, StoreError> {
    if from.is_empty() {
        return Ok(false);
    }
    let placeholders = vec!["?"; from.len()].join(", ");
    let sql = if to.is_ended() {
        format!(
            "UPDATE sandboxes SET state = ?, ended_at_ms = ?, end_reason = ?
             WHERE id = ? AND state IN ({placeholders})"
        )
    } else {
        format!("UPDATE sandboxes SET state = ? WHERE id = ? AND state IN ({placeholders})")
    };
    let mut params: Vec<Value> = vec![Value::from(to.as_str().to_owned())];
    if to.is_ended() {
        params.push(Value::from(now_ms));
        params.push(Value::from(end_reason.map(str::to_owned)));
    }
    params.push(Value::from(id.to_owned()));
    params.extend(from.iter().map(|state| Value::from(state.as_str().to_owned())));
    let changed = conn
        .execute_cached(&sql, params_from_iter(params))
        .map_err(StoreError::write("sandbox state"))?;
    Ok(changed == 1)
}

fn set_sandbox_expiry(conn: &Connection, id: &str, expires_at_ms: Option<i64>) -> Result<bool, StoreError> {
    let changed = conn
        .execute_cached(
            "UPDATE sandboxes SET expires_at_ms = ?2 WHERE id = ?1",
            (id, expires_at_ms),
        )
        .map_err(StoreError::write("sandbox expiry"))?;
    Ok(changed == 1)
}

fn set_sandbox_paused(conn: &Connection, id: &str, paused: bool) -> Result<bool, StoreError> {
    let changed = conn
        .execute_cached(
            "UPDATE sandboxes SET paused = ?2 WHERE id = ?1 AND state = 'running' AND paused <> ?2",
            (id, paused),
        )
        .map_err(StoreError::write("sandbox pause"))?;
    Ok(changed == 1)
}
