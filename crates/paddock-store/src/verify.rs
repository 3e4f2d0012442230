//! Verifying the audit chain: every row's hash, its link to the previous row, and seq continuity.
//! A gap in the seqs is crossed only through a range retention recorded (`audit_prune.rs`): its
//! `prev_hash` must be the hash of the row before, the next row (or range) must link to its
//! `last_hash`, and the `audit.prune` row that recorded it must carry the digest of its ranges.

use std::collections::HashSet;

use rusqlite::OptionalExtension as _;
use serde::{Deserialize, Serialize};

use crate::audit::{AuditRow, AUDIT_COLUMNS};
use crate::audit_hash::{audit_hash, AuditFields, GENESIS_HASH};
use crate::audit_prune::{pruned_ranges_digest, range_at, ranges_of_anchor, PRUNE_ACTION};
use crate::cached::Cached;
use crate::{Store, StoreError};

/// Rows read per query, so that verification never holds the whole table (or the lock) at once.
const BATCH_ROWS: i64 = 1000;

/// The result of [`Store::verify_audit`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditVerification {
    /// Rows examined, the broken one included.
    pub rows_checked: u64,
    /// Rows not there because retention removed them (network rows only), crossed through their
    /// recorded ranges.
    pub rows_pruned: u64,
    /// The `audit.prune` rows whose ranges were crossed.
    pub prune_anchors: u64,
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
    /// gaps other than recorded pruned ranges (crossed as the module doc says, and counted in
    /// `rows_pruned`), that each row's `prev_hash` is the previous row's `hash` (the first row's is
    /// [`GENESIS_HASH`]) and that each row's `hash` matches its contents. Stops at the first break.
    ///
    /// Rows appended while it runs are verified too. What a chain cannot show is the removal of its
    /// newest rows: anchor the latest hash elsewhere to catch that.
    pub fn verify_audit(&self) -> Result<AuditVerification, StoreError> {
        let mut v = AuditVerification {
            rows_checked: 0,
            rows_pruned: 0,
            prune_anchors: 0,
            first_broken: None,
        };
        let mut prev_seq = 0i64;
        let mut prev_hash = GENESIS_HASH.to_owned();
        let mut anchors = HashSet::new();
        loop {
            let batch = self.read_audit_batch(prev_seq)?;
            if batch.is_empty() {
                return Ok(v);
            }
            for row in batch {
                v.rows_checked += 1;
                let broken = |reason: String| BrokenRow {
                    // Seqs are positive: the column is an INTEGER PRIMARY KEY we only fill with 1,
                    // 2, ...; a forged negative one shows as 0.
                    seq: u64::try_from(row.seq).unwrap_or(0),
                    reason,
                };
                // Cross pruned ranges up to this row.
                while row.seq > prev_seq + 1 {
                    let Some((range, anchor)) = range_at(&self.conn(), prev_seq + 1)? else {
                        break;
                    };
                    if range.prev_hash != prev_hash {
                        v.first_broken = Some(broken(format!(
                            "pruned rows {} to {} do not follow seq {prev_seq}: their prev_hash {} is not its hash {prev_hash}",
                            range.first_seq, range.last_seq, range.prev_hash
                        )));
                        return Ok(v);
                    }
                    if !anchors.contains(&anchor) {
                        if let Some(reason) = self.check_anchor(anchor)? {
                            v.first_broken = Some(broken(format!(
                                "pruned rows {} to {}: {reason}",
                                range.first_seq, range.last_seq
                            )));
                            return Ok(v);
                        }
                        anchors.insert(anchor);
                        v.prune_anchors += 1;
                    }
                    v.rows_pruned += range.last_seq - range.first_seq + 1;
                    prev_seq = i64::try_from(range.last_seq).unwrap_or(i64::MAX);
                    prev_hash = range.last_hash;
                }
                if row.seq <= prev_seq {
                    v.first_broken = Some(broken(format!(
                        "seq {} lies inside pruned rows ending at seq {prev_seq}",
                        row.seq
                    )));
                    return Ok(v);
                }
                if let Some(reason) = check_row(&row, prev_seq, &prev_hash) {
                    v.first_broken = Some(broken(reason));
                    return Ok(v);
                }
                prev_seq = row.seq;
                prev_hash = row.hash;
            }
        }
    }

    /// Why the `audit.prune` row `anchor` does not vouch for the ranges recorded with it, if it
    /// does not. (Its own hash is checked when the walk reaches it.)
    fn check_anchor(&self, anchor: u64) -> Result<Option<String>, StoreError> {
        let conn = self.conn();
        let row = conn
            .query_row_cached(
                &format!("SELECT {AUDIT_COLUMNS} FROM audit WHERE seq = ?1"),
                [i64::try_from(anchor).unwrap_or(i64::MAX)],
                AuditRow::read,
            )
            .optional()
            .map_err(StoreError::read("an audit.prune row"))?;
        let Some(row) = row else {
            return Ok(Some(format!("their record, seq {anchor}, is missing")));
        };
        if row.action != PRUNE_ACTION {
            return Ok(Some(format!(
                "their record, seq {anchor}, is a {} row, not {PRUNE_ACTION}",
                row.action
            )));
        }
        let detail: serde_json::Value = serde_json::from_str(&row.detail_json).unwrap_or_default();
        let ranges = ranges_of_anchor(&conn, anchor)?;
        let digest = pruned_ranges_digest(&ranges);
        if detail["ranges_sha256"].as_str() != Some(digest.as_str())
            || detail["ranges"].as_u64() != Some(ranges.len() as u64)
        {
            return Ok(Some(format!(
                "the ranges recorded with {PRUNE_ACTION} seq {anchor} are not those it vouches for \
                 (their digest is {digest}, {} ranges)",
                ranges.len()
            )));
        }
        Ok(None)
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
