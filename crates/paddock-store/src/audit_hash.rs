//! The audit chain's hash: a pure function of one row's fields and the previous row's hash.

use sha2::{Digest, Sha256};

/// The `prev_hash` of the first audit row.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Domain separation and format version: changing the encoding means a new tag.
const TAG: &str = "paddock-audit-v1";

/// The fields of one audit row that its hash covers (everything but the hash itself), as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditFields<'a> {
    pub seq: u64,
    pub ts_ms: i64,
    pub tenant: Option<&'a str>,
    pub key_id: Option<&'a str>,
    pub action: &'a str,
    pub sandbox_id: Option<&'a str>,
    pub outcome: &'a str,
    /// The row's `detail_json` text exactly as stored (the hash covers these bytes, not a re-encoding).
    pub detail_json: &'a str,
    /// The previous row's `hash`, or [`GENESIS_HASH`] for the first row.
    pub prev_hash: &'a str,
}

/// `hex(SHA-256(canonical bytes))`, lowercase: the `hash` column of the row with these fields.
///
/// The canonical bytes are the concatenation of, in this order:
///
/// | field        | encoding                   |
/// |--------------|----------------------------|
/// | tag          | str `"paddock-audit-v1"`   |
/// | `seq`        | u64, 8 bytes big-endian    |
/// | `ts_ms`      | i64, 8 bytes big-endian (two's complement) |
/// | `tenant`     | opt-str                    |
/// | `key_id`     | opt-str                    |
/// | `action`     | str                        |
/// | `sandbox_id` | opt-str                    |
/// | `outcome`    | str                        |
/// | `detail_json`| str                        |
/// | `prev_hash`  | str (64 lowercase hex characters) |
///
/// where *str* is the UTF-8 byte length as a u64 (8 bytes big-endian) followed by the bytes, and
/// *opt-str* is one byte `0x00` for NULL, or one byte `0x01` followed by a *str*. The length prefixes
/// and presence bytes make the encoding injective: no two different rows share canonical bytes (so
/// moving text between fields, or NULL versus empty, always changes the hash).
///
/// This format is frozen by a golden test: changing it breaks every stored chain.
pub fn audit_hash(fields: &AuditFields<'_>) -> String {
    let mut hasher = Sha256::new();
    put_str(&mut hasher, TAG);
    hasher.update(fields.seq.to_be_bytes());
    hasher.update(fields.ts_ms.to_be_bytes());
    put_opt_str(&mut hasher, fields.tenant);
    put_opt_str(&mut hasher, fields.key_id);
    put_str(&mut hasher, fields.action);
    put_opt_str(&mut hasher, fields.sandbox_id);
    put_str(&mut hasher, fields.outcome);
    put_str(&mut hasher, fields.detail_json);
    put_str(&mut hasher, fields.prev_hash);
    hex::encode(hasher.finalize())
}

fn put_str(hasher: &mut Sha256, s: &str) {
    // usize is at most 64 bits on every target Rust supports.
    hasher.update((s.len() as u64).to_be_bytes());
    hasher.update(s.as_bytes());
}

fn put_opt_str(hasher: &mut Sha256, s: Option<&str>) {
    match s {
        None => hasher.update([0u8]),
        Some(s) => {
            hasher.update([1u8]);
            put_str(hasher, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AuditFields<'static> {
        AuditFields {
            seq: 7,
            ts_ms: 1_700_000_000_123,
            tenant: Some("acme"),
            key_id: Some("0123456789ab"),
            action: "sandbox.create",
            sandbox_id: Some("sb-1"),
            outcome: "ok",
            detail_json: r#"{"memory_bytes":268435456,"profile":"default"}"#,
            prev_hash: GENESIS_HASH,
        }
    }

    /// Freezes the encoding: if this fails, every audit chain already written stops verifying. The
    /// expected values were computed independently of this code, from the format in the doc comment
    /// (Python's hashlib over hand-built bytes).
    #[test]
    fn golden_hash() {
        assert_eq!(
            audit_hash(&sample()),
            "ccc18cc4989e77f3b6aac16d73bef7b81197d3c5a41c3f9be950e20568fa414a"
        );
        let anonymous = AuditFields {
            seq: 1,
            ts_ms: 0,
            tenant: None,
            key_id: None,
            action: "server.start",
            sandbox_id: None,
            outcome: "ok",
            detail_json: "{}",
            prev_hash: GENESIS_HASH,
        };
        assert_eq!(
            audit_hash(&anonymous),
            "a3b43b823d7f9c545a2a6b4dd3c8e3a3f51651e305cdcd35bfbb710c83ee4675"
        );
    }

    #[test]
    fn every_field_is_covered_and_null_differs_from_empty() {
        let base = sample();
        let base_hash = audit_hash(&base);
        let variants = [
            AuditFields { seq: 8, ..base },
            AuditFields { ts_ms: 1, ..base },
            AuditFields { tenant: None, ..base },
            AuditFields {
                tenant: Some(""),
                ..base
            },
            AuditFields { key_id: None, ..base },
            AuditFields {
                action: "sandbox.destroy",
                ..base
            },
            AuditFields {
                sandbox_id: None,
                ..base
            },
            AuditFields {
                outcome: "denied",
                ..base
            },
            AuditFields {
                detail_json: "{}",
                ..base
            },
            AuditFields {
                prev_hash: "1",
                ..base
            },
            // Moving bytes between adjacent fields must change the hash too.
            AuditFields {
                tenant: Some("acme0123456789ab"),
                key_id: Some(""),
                ..base
            },
        ];
        for variant in variants {
            assert_ne!(
                audit_hash(&variant),
                base_hash,
                "{variant:?} hashes like the base row"
            );
        }
    }
}
