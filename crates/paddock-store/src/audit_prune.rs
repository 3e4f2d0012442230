//! Retention of network audit rows (`network.*`, the egress proxy's), the only rows that may ever be
//! removed, without losing the chain's verifiability.
//!
//! One prune is one transaction: choose the rows (older than a time, or a tenant's oldest beyond a
//! count), group them into runs of consecutive seqs, append an `audit.prune` row whose detail carries
//! a digest of those runs, record each run in `audit_pruned` (its first and last seq, the `prev_hash`
//! of its first row, the `hash` of its last), then delete the rows. The triggers of migration 0007
//! refuse to delete any row that is not a network row inside a recorded run, and refuse to record a
//! run no later `audit.prune` row vouches for; `verify_audit` crosses a gap only through a recorded
//! run whose hashes link and whose anchor's digest matches.
//!
//! It does not decide when to prune or how much to keep (the caller's configuration), and never
//! touches a row of any other action.

use rusqlite::{Connection, OptionalExtension};
use sha2::{Digest, Sha256};

use crate::audit::{append_audit, NewAuditEntry};
use crate::cached::Cached;
use crate::error::{from_i64, to_i64};
use crate::{Store, StoreError};

/// The action of the row recording a prune.
pub const PRUNE_ACTION: &str = "audit.prune";

/// Domain separation of the ranges digest.
const RANGES_TAG: &str = "paddock-audit-pruned-v1";

/// Which network rows a prune removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkRetention {
    /// Rows with `ts_ms` before this.
    pub older_than_ms: Option<i64>,
    /// Per tenant (rows without one count as one more tenant), the oldest rows beyond this many.
    pub max_rows_per_tenant: Option<u64>,
    /// Most rows removed by one call (one transaction, so the write lock is short).
    pub batch: u32,
}

/// What one prune did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Rows removed.
    pub rows: u64,
    /// Runs of consecutive seqs they formed.
    pub ranges: u64,
    /// The `audit.prune` row recording them (`None` when nothing was removed).
    pub anchor_seq: Option<u64>,
}

/// A run of consecutive removed seqs and the hashes that bridge it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrunedRange {
    pub first_seq: u64,
    pub last_seq: u64,
    /// The `prev_hash` of row `first_seq`.
    pub prev_hash: String,
    /// The `hash` of row `last_seq`.
    pub last_hash: String,
}

/// `hex(SHA-256)` over the ranges in order: a tag, then per range `first_seq` and `last_seq` (u64
/// big-endian) and the two hashes (length-prefixed, as in `audit_hash`). Carried by the
/// `audit.prune` row, so the recorded ranges are covered by the chain.
pub fn pruned_ranges_digest(ranges: &[PrunedRange]) -> String {
    let mut hasher = Sha256::new();
    let put_str = |h: &mut Sha256, s: &str| {
        h.update((s.len() as u64).to_be_bytes());
        h.update(s.as_bytes());
    };
    put_str(&mut hasher, RANGES_TAG);
    for r in ranges {
        hasher.update(r.first_seq.to_be_bytes());
        hasher.update(r.last_seq.to_be_bytes());
        put_str(&mut hasher, &r.prev_hash);
        put_str(&mut hasher, &r.last_hash);
    }
    hex::encode(hasher.finalize())
}

/// Groups rows `(seq, prev_hash, hash)`, sorted by seq, into runs of consecutive seqs.
pub(crate) fn ranges_of(rows: &[(u64, String, String)]) -> Vec<PrunedRange> {
    let mut ranges: Vec<PrunedRange> = Vec::new();
    for (seq, prev_hash, hash) in rows {
        match ranges.last_mut() {
            Some(r) if r.last_seq + 1 == *seq => {
                r.last_seq = *seq;
                r.last_hash = hash.clone();
            }
            _ => ranges.push(PrunedRange {
                first_seq: *seq,
                last_seq: *seq,
                prev_hash: prev_hash.clone(),
                last_hash: hash.clone(),
            }),
        }
    }
    ranges
}

/// The `WHERE` fragment matching network rows (a range the `audit_action` index serves).
const NETWORK_ROWS: &str = "action >= 'network.' AND action < 'network/'";

impl Store {
    /// Removes network rows as `rule` says, at most `rule.batch` of them, recording them with an
    /// `audit.prune` row stamped `now_ms`. Call again while it removes a whole batch.
    pub fn prune_network_audit(
        &self,
        rule: &NetworkRetention,
        now_ms: i64,
    ) -> Result<PruneReport, StoreError> {
        self.write("prune network audit rows", |conn| prune(conn, rule, now_ms))
    }

    /// The ranges recorded by the `audit.prune` row `anchor_seq`, in seq order.
    pub fn pruned_ranges(&self, anchor_seq: u64) -> Result<Vec<PrunedRange>, StoreError> {
        ranges_of_anchor(&self.conn(), anchor_seq)
    }
}

fn prune(conn: &Connection, rule: &NetworkRetention, now_ms: i64) -> Result<PruneReport, StoreError> {
    let batch = i64::from(rule.batch);
    let mut seqs: Vec<i64> = Vec::new();
    if let Some(before) = rule.older_than_ms {
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT seq FROM audit WHERE {NETWORK_ROWS} AND ts_ms < ?1 ORDER BY seq LIMIT ?2"
            ))
            .map_err(StoreError::read("old network audit rows"))?;
        let rows = stmt
            .query_map((before, batch), |r| r.get::<_, i64>(0))
            .map_err(StoreError::read("old network audit rows"))?;
        for seq in rows {
            seqs.push(seq.map_err(StoreError::read("old network audit rows"))?);
        }
    }
    if let Some(max) = rule.max_rows_per_tenant {
        let max = to_i64("retained network rows", max)?;
        let over: Vec<(Option<String>, i64)> = {
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT tenant, COUNT(*) FROM audit WHERE {NETWORK_ROWS} GROUP BY tenant HAVING COUNT(*) > ?1"
                ))
                .map_err(StoreError::read("network audit rows per tenant"))?;
            let rows = stmt
                .query_map([max], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(StoreError::read("network audit rows per tenant"))?;
            rows.collect::<Result<_, _>>()
                .map_err(StoreError::read("network audit rows per tenant"))?
        };
        for (tenant, count) in over {
            let excess = (count - max).min(batch);
            let mut stmt = conn
                .prepare_cached(&format!(
                    "SELECT seq FROM audit WHERE tenant IS ?1 AND {NETWORK_ROWS} ORDER BY seq LIMIT ?2"
                ))
                .map_err(StoreError::read("a tenant's oldest network audit rows"))?;
            let rows = stmt
                .query_map((&tenant, excess), |r| r.get::<_, i64>(0))
                .map_err(StoreError::read("a tenant's oldest network audit rows"))?;
            for seq in rows {
                seqs.push(seq.map_err(StoreError::read("a tenant's oldest network audit rows"))?);
            }
        }
    }
    seqs.sort_unstable();
    seqs.dedup();
    seqs.truncate(usize::try_from(rule.batch).unwrap_or(usize::MAX));
    if seqs.is_empty() {
        return Ok(PruneReport::default());
    }
    let mut rows = Vec::with_capacity(seqs.len());
    {
        let mut stmt = conn
            .prepare_cached("SELECT prev_hash, hash FROM audit WHERE seq = ?1")
            .map_err(StoreError::read("network audit rows to prune"))?;
        for &seq in &seqs {
            let (prev_hash, hash): (String, String) =
                stmt.query_row([seq], |r| Ok((r.get(0)?, r.get(1)?)))
                    .map_err(StoreError::read("network audit rows to prune"))?;
            rows.push((from_i64::<u64>("audit seq", seq)?, prev_hash, hash));
        }
    }
    let ranges = ranges_of(&rows);
    let anchor = append_audit(
        conn,
        &NewAuditEntry {
            ts_ms: now_ms,
            tenant: None,
            key_id: None,
            action: PRUNE_ACTION.to_owned(),
            sandbox_id: None,
            outcome: "ok".to_owned(),
            detail: serde_json::json!({
                "reason": "retention of network rows",
                "older_than_ms": rule.older_than_ms,
                "max_rows_per_tenant": rule.max_rows_per_tenant,
                "rows": rows.len(),
                "ranges": ranges.len(),
                "first_seq": rows.first().map(|r| r.0),
                "last_seq": rows.last().map(|r| r.0),
                "ranges_sha256": pruned_ranges_digest(&ranges),
            }),
        },
    )?;
    let anchor_seq = to_i64("audit seq", anchor.seq)?;
    {
        let mut stmt = conn
            .prepare_cached(
                "INSERT INTO audit_pruned (first_seq, last_seq, prev_hash, last_hash, anchor_seq) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .map_err(StoreError::write("a pruned audit range"))?;
        for r in &ranges {
            stmt.execute((
                to_i64("audit seq", r.first_seq)?,
                to_i64("audit seq", r.last_seq)?,
                &r.prev_hash,
                &r.last_hash,
                anchor_seq,
            ))
            .map_err(StoreError::write("a pruned audit range"))?;
        }
    }
    {
        // The one statement that removes audit rows; the trigger lets it through only for network
        // rows inside a range recorded just above.
        let mut stmt = conn
            .prepare_cached("DELETE FROM audit WHERE seq = ?1")
            .map_err(StoreError::write("pruned network audit rows"))?;
        for &seq in &seqs {
            stmt.execute([seq])
                .map_err(StoreError::write("pruned network audit rows"))?;
        }
    }
    Ok(PruneReport {
        rows: rows.len() as u64,
        ranges: ranges.len() as u64,
        anchor_seq: Some(anchor.seq),
    })
}

/// The ranges recorded by anchor `anchor_seq`, in seq order.
pub(crate) fn ranges_of_anchor(conn: &Connection, anchor_seq: u64) -> Result<Vec<PrunedRange>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT first_seq, last_seq, prev_hash, last_hash FROM audit_pruned \
             WHERE anchor_seq = ?1 ORDER BY first_seq",
        )
        .map_err(StoreError::read("pruned audit ranges"))?;
    let rows = stmt
        .query_map([to_i64("audit seq", anchor_seq)?], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
            ))
        })
        .map_err(StoreError::read("pruned audit ranges"))?;
    let mut out = Vec::new();
    for row in rows {
        let (first, last, prev_hash, last_hash) = row.map_err(StoreError::read("pruned audit ranges"))?;
        out.push(PrunedRange {
            first_seq: from_i64("audit seq", first)?,
            last_seq: from_i64("audit seq", last)?,
            prev_hash,
            last_hash,
        });
    }
    Ok(out)
}

/// The recorded range starting at `first_seq`, with its anchor.
pub(crate) fn range_at(conn: &Connection, first_seq: i64) -> Result<Option<(PrunedRange, u64)>, StoreError> {
    let row = conn
        .query_row_cached(
            "SELECT first_seq, last_seq, prev_hash, last_hash, anchor_seq FROM audit_pruned WHERE first_seq = ?1",
            [first_seq],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            },
        )
        .optional()
        .map_err(StoreError::read("a pruned audit range"))?;
    row.map(|(first, last, prev_hash, last_hash, anchor)| {
        Ok((
            PrunedRange {
                first_seq: from_i64("audit seq", first)?,
                last_seq: from_i64("audit seq", last)?,
                prev_hash,
                last_hash,
            },
            from_i64("audit seq", anchor)?,
        ))
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: u64) -> (u64, String, String) {
        (seq, format!("p{seq}"), format!("h{seq}"))
    }

    #[test]
    fn consecutive_seqs_make_one_range() {
        let rows: Vec<_> = [3, 4, 5, 8, 10, 11].into_iter().map(row).collect();
        let ranges = ranges_of(&rows);
        let spans: Vec<_> = ranges
            .iter()
            .map(|r| {
                (
                    r.first_seq,
                    r.last_seq,
                    r.prev_hash.as_str(),
                    r.last_hash.as_str(),
                )
            })
            .collect();
        assert_eq!(
            spans,
            [(3, 5, "p3", "h5"), (8, 8, "p8", "h8"), (10, 11, "p10", "h11")]
        );
        assert!(ranges_of(&[]).is_empty());
    }

    #[test]
    fn the_digest_covers_every_field() {
        let base = ranges_of(&[row(3), row(4), row(9)]);
        let d = pruned_ranges_digest(&base);
        let mut variants = Vec::new();
        for i in 0..4 {
            let mut v = base.clone();
            match i {
                0 => v[0].first_seq = 2,
                1 => v[0].last_seq = 5,
                2 => v[1].prev_hash = "x".into(),
                _ => v[1].last_hash = "x".into(),
            }
            variants.push(v);
        }
        variants.push(base[..1].to_vec());
        for v in variants {
            assert_ne!(pruned_ranges_digest(&v), d, "{v:?}");
        }
    }
}
