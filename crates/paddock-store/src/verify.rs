//! Verifying the audit chain: every row's hash, its link to the previous row, and seq continuity.

use serde::{Deserialize, Serialize};

use crate::audit::{AuditRow, AUDIT_COLUMNS};
use crate::audit_hash::{audit_hash, AuditFields, GENESIS_HASH};
use crate::{Store, StoreError};

/// Rows read per query, so that verification never holds the whole table (or the lock) at once.
const BATCH_ROWS: i64 = 1000;

/// The result of [`Store::verify_audit`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditVerification {
    /// Rows examined, the broken one included.
    pub rows_checked: u64,
    /// The first row at which the chain does not hold, if any.
    pub first_broken: Option<BrokenRow>,
}

impl AuditVerification {
    pub fn is_intact(&self) -> bool {
        self.first_broken.is_none()
    }
}

/// Where and why the chain breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokenRow {
    pub seq: u64,
    pub reason: String,
}

impl Store {
    /// Walks the whole audit log in seq order, in batches, checking that seqs run 1, 2, 3, ... without
    /// gaps, that each row's `prev_hash` is the previous row's `hash` (the first row's is
    /// [`GENESIS_HASH`]) and that each row's `hash` matches its contents. Stops at the first break.
    ///
    /// Rows appended while it runs are verified too. What a chain cannot show is the removal of its
    /// newest rows: anchor the latest hash elsewhere to catch that.
    pub fn verify_audit(&self) -> Result<AuditVerification, StoreError> {
        let mut rows_checked = 0u64;
        let mut prev_seq = 0i64;
        let mut prev_hash = GENESIS_HASH.to_owned();
        loop {
            let batch = self.read_audit_batch(prev_seq)?;
            if batch.is_empty() {
                return Ok(AuditVerification {
                    rows_checked,
                    first_broken: None,
                });
            }
            for row in batch {
                rows_checked += 1;
                if let Some(reason) = check_row(&row, prev_seq, &prev_hash) {
                    return Ok(AuditVerification {
                        rows_checked,
                        first_broken: Some(BrokenRow {
                            // Seqs are positive: the column is an INTEGER PRIMARY KEY we only fill
                            // with 1, 2, ...; a forged negative one shows as 0.
                            seq: u64::try_from(row.seq).unwrap_or(0),
                            reason,
                        }),
                    });
                }
                prev_seq = row.seq;
                prev_hash = row.hash;
            }
        }
    }

    fn read_audit_batch(&self, after_seq: i64) -> Result<Vec<AuditRow>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {AUDIT_COLUMNS} FROM audit WHERE seq > ?1 ORDER BY seq LIMIT ?2"
            ))
            .map_err(StoreError::read("audit rows"))?;
        let rows = stmt
            .query_map((after_seq, BATCH_ROWS), AuditRow::read)
            .map_err(StoreError::read("audit rows"))?;
        rows.map(|row| row.map_err(StoreError::read("audit rows")))
            .collect()
    }
}

/// Why `row` does not follow the row with `prev_seq` and `prev_hash`, if it does not.
fn check_row(row: &AuditRow, prev_seq: i64, prev_hash: &str) -> Option<String> {
    let expected_seq = prev_seq + 1;
    if row.seq != expected_seq {
        return Some(if prev_seq == 0 {
            format!(
                "the log starts at seq {} instead of 1: earlier rows are missing",
                row.seq
            )
        } else {
            let missing = if row.seq - 1 == expected_seq {
                format!("row {expected_seq} is missing")
            } else {
                format!("rows {expected_seq} to {} are missing", row.seq - 1)
            };
            format!("seq {} follows seq {prev_seq}: {missing}", row.seq)
        });
    }
    if row.prev_hash != prev_hash {
        return Some(if prev_seq == 0 {
            format!("prev_hash is {} instead of the genesis hash", row.prev_hash)
        } else {
            format!(
                "prev_hash {} does not match the hash {prev_hash} of seq {prev_seq}",
                row.prev_hash
            )
        });
    }
    let computed = audit_hash(&AuditFields {
        // Positive: it equals expected_seq, which is at least 1.
        seq: row.seq.unsigned_abs(),
        ts_ms: row.ts_ms,
        tenant: row.tenant.as_deref(),
        key_id: row.key_id.as_deref(),
        action: &row.action,
        sandbox_id: row.sandbox_id.as_deref(),
        outcome: &row.outcome,
        detail_json: &row.detail_json,
        prev_hash: &row.prev_hash,
    });
    if row.hash != computed {
        return Some(format!(
            "stored hash {} does not match the row's contents (they hash to {computed})",
            row.hash
        ));
    }
    None
}
