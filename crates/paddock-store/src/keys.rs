//! API keys: `pdk_<id>_<secret>`, of which only SHA-256(secret) is stored. The same key has a second
//! spelling for E2B's SDKs, `e2b_<id><secret>` (E2B's own keys are `e2b_` and lowercase hex, which
//! older SDKs check on the client), so one key serves both doors.

use rand::RngCore;
use rusqlite::{Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::cached::Cached;
use crate::error::{violation, Violation};
use crate::tenants::ensure_tenant;
use crate::{Store, StoreError, StoreTx};

const KEY_PREFIX: &str = "pdk_";
/// The prefix of a key's E2B spelling.
const E2B_KEY_PREFIX: &str = "e2b_";
/// Bytes of randomness in a key id (shown as twice as many hex digits).
const ID_BYTES: usize = 6;
/// Bytes of randomness in a key secret.
const SECRET_BYTES: usize = 32;
/// `authenticate` records a key's use at most this often, so that a busy key does not cost a write per
/// request.
const LAST_USED_RESOLUTION_MS: i64 = 60_000;
/// A freshly drawn 48-bit id colliding with an existing one is all but impossible; retrying a few times
/// makes it a non-event instead of a spurious error.
const ID_ATTEMPTS: usize = 4;

/// A stored API key. Holds neither the secret nor its hash: those never leave this module.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiKeyRecord {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub admin: bool,
    /// May change a live sandbox's network policy and secrets (`set_network`).
    pub change_network: bool,
    /// May set and delete its tenant's approval policies (admin keys are made with it).
    pub approver: bool,
    pub created_at_ms: i64,
    pub revoked_at_ms: Option<i64>,
    pub last_used_at_ms: Option<i64>,
}

impl ApiKeyRecord {
    pub fn is_revoked(&self) -> bool {
        self.revoked_at_ms.is_some()
    }
}

const KEY_COLUMNS: &str =
    "id, tenant, name, admin, created_at_ms, revoked_at_ms, last_used_at_ms, change_network, approver";

/// What a key may do beyond its tenant's sandboxes: the permissions chosen when it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPermissions {
    /// Manage keys and tenants, read every tenant's audit log.
    pub admin: bool,
    /// Change a live sandbox's network policy and secrets.
    pub change_network: bool,
    /// Set and delete the tenant's approval policies.
    pub approver: bool,
}

impl KeyPermissions {
    /// A tenant's key with today's defaults (`change_network` allowed; `approver` only for an
    /// admin key), admin or not.
    pub fn with_admin(admin: bool) -> Self {
        Self {
            admin,
            change_network: true,
            approver: admin,
        }
    }
}

impl Store {
    /// Creates a key for `tenant` (creating the tenant if needed). Returns the record and the full key
    /// text, which exists nowhere else: show it once.
    pub fn create_api_key(
        &self,
        tenant: &str,
        name: &str,
        admin: bool,
        now_ms: i64,
    ) -> Result<(ApiKeyRecord, String), StoreError> {
        self.create_api_key_with(tenant, name, KeyPermissions::with_admin(admin), now_ms)
    }

    /// [`Store::create_api_key`] with every permission chosen.
    pub fn create_api_key_with(
        &self,
        tenant: &str,
        name: &str,
        permissions: KeyPermissions,
        now_ms: i64,
    ) -> Result<(ApiKeyRecord, String), StoreError> {
        self.write("create api key", |conn| {
            create_api_key(conn, tenant, name, permissions, now_ms)
        })
    }

    /// The active key whose text is `key_text`, or `None` when it is malformed, unknown, wrong or
    /// revoked (deliberately indistinguishable to the caller). Records the use at `now_ms`, at most
    /// once a minute per key.
    pub fn authenticate(&self, key_text: &str, now_ms: i64) -> Result<Option<ApiKeyRecord>, StoreError> {
        let Some((id, secret)) = parse_key(key_text) else {
            return Ok(None);
        };
        let conn = self.conn();
        let found = conn
            .query_row_cached(
                &format!("SELECT {KEY_COLUMNS}, secret_hash FROM api_keys WHERE id = ?1"),
                [id],
                |row| Ok((read_key_row(row)?, row.get::<_, Vec<u8>>(9)?)),
            )
            .optional()
            .map_err(StoreError::read("api key"))?;
        let Some((mut record, stored_hash)) = found else {
            return Ok(None);
        };
        let presented_hash = Sha256::digest(secret);
        // Constant time, so that response timing does not reveal how many leading bytes matched.
        if !bool::from(presented_hash.as_slice().ct_eq(&stored_hash)) || record.is_revoked() {
            return Ok(None);
        }
        let stale = record
            .last_used_at_ms
            .is_none_or(|last| now_ms.saturating_sub(last) >= LAST_USED_RESOLUTION_MS);
        if stale {
            conn.execute_cached(
                "UPDATE api_keys SET last_used_at_ms = ?2 WHERE id = ?1",
                (&record.id, now_ms),
            )
            .map_err(StoreError::write("api key last use"))?;
            record.last_used_at_ms = Some(now_ms);
        }
        Ok(Some(record))
    }

    /// Keys of one tenant, or of all tenants, revoked ones included, oldest first.
    pub fn list_api_keys(&self, tenant: Option<&str>) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {KEY_COLUMNS} FROM api_keys
                 WHERE ?1 IS NULL OR tenant = ?1
                 ORDER BY created_at_ms, id"
            ))
            .map_err(StoreError::read("api keys"))?;
        let rows = stmt
            .query_map([tenant], read_key_row)
            .map_err(StoreError::read("api keys"))?;
        rows.map(|row| row.map_err(StoreError::read("api keys")))
            .collect()
    }

    /// Revokes key `id` at `now_ms`. `false` if there is no such key or it was already revoked.
    pub fn revoke_api_key(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        revoke_api_key(&self.conn(), id, now_ms)
    }

    /// How many active (unrevoked) admin keys exist: the control plane refuses to revoke the last one.
    pub fn count_admin_keys(&self) -> Result<u64, StoreError> {
        count_admin_keys(&self.conn())
    }
}

fn count_admin_keys(conn: &Connection) -> Result<u64, StoreError> {
    let count: i64 = conn
        .query_row_cached(
            "SELECT COUNT(*) FROM api_keys WHERE admin = 1 AND revoked_at_ms IS NULL",
            [],
            |row| row.get(0),
        )
        .map_err(StoreError::read("admin key count"))?;
    crate::error::from_i64("admin key count", count)
}

/// A key's E2B spelling: `e2b_` followed by its id and secret, all lowercase hex.
pub fn e2b_spelling(key_text: &str) -> Option<String> {
    let rest = key_text.strip_prefix(KEY_PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    Some(format!("{E2B_KEY_PREFIX}{id}{secret}"))
}

/// Splits `pdk_<12 lowercase hex>_<64 lowercase hex>`, or its E2B spelling
/// `e2b_<12 lowercase hex><64 lowercase hex>`, into the id and the decoded secret. Anything else
/// (including upper-case hex, so that each key has exactly these two spellings) is `None`.
fn parse_key(key_text: &str) -> Option<(&str, [u8; SECRET_BYTES])> {
    let (id, secret_hex) = match key_text.strip_prefix(KEY_PREFIX) {
        Some(rest) => rest.split_once('_')?,
        None => {
            let rest = key_text.strip_prefix(E2B_KEY_PREFIX)?;
            if !rest.is_char_boundary(ID_BYTES * 2) {
                return None;
            }
            rest.split_at(ID_BYTES * 2)
        }
    };
    if !is_lower_hex(id, ID_BYTES * 2) || !is_lower_hex(secret_hex, SECRET_BYTES * 2) {
        return None;
    }
    let mut secret = [0u8; SECRET_BYTES];
    hex::decode_to_slice(secret_hex, &mut secret).ok()?;
    Some((id, secret))
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn read_key_row(row: &Row<'_>) -> rusqlite::Result<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        name: row.get(2)?,
        admin: row.get(3)?,
        created_at_ms: row.get(4)?,
        revoked_at_ms: row.get(5)?,
        last_used_at_ms: row.get(6)?,
        change_network: row.get(7)?,
        approver: row.get(8)?,
    })
}

impl StoreTx<'_> {
    /// [`Store::create_api_key`] inside this transaction (with the audit row that records it).
    pub fn create_api_key(
        &self,
        tenant: &str,
        name: &str,
        admin: bool,
        now_ms: i64,
    ) -> Result<(ApiKeyRecord, String), StoreError> {
        create_api_key(&self.tx, tenant, name, KeyPermissions::with_admin(admin), now_ms)
    }

    /// [`Store::create_api_key_with`] inside this transaction.
    pub fn create_api_key_with(
        &self,
        tenant: &str,
        name: &str,
        permissions: KeyPermissions,
        now_ms: i64,
    ) -> Result<(ApiKeyRecord, String), StoreError> {
        create_api_key(&self.tx, tenant, name, permissions, now_ms)
    }

    /// [`Store::count_admin_keys`] inside this transaction.
    pub fn count_admin_keys(&self) -> Result<u64, StoreError> {
        count_admin_keys(&self.tx)
    }

    /// [`Store::revoke_api_key`] inside this transaction.
    pub fn revoke_api_key(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        revoke_api_key(&self.tx, id, now_ms)
    }
}

fn create_api_key(
    conn: &Connection,
    tenant: &str,
    name: &str,
    permissions: KeyPermissions,
    now_ms: i64,
) -> Result<(ApiKeyRecord, String), StoreError> {
    let KeyPermissions {
        admin,
        change_network,
        approver,
    } = permissions;
    let mut rng = rand::rng(); // ThreadRng: a CSPRNG seeded from the OS
    let mut secret = [0u8; SECRET_BYTES];
    rng.fill_bytes(&mut secret);
    let secret_hash = Sha256::digest(secret);
    ensure_tenant(conn, tenant, now_ms)?;
    for _ in 0..ID_ATTEMPTS {
        let mut id_bytes = [0u8; ID_BYTES];
        rng.fill_bytes(&mut id_bytes);
        let id = hex::encode(id_bytes);
        let inserted = conn.execute_cached(
            "INSERT INTO api_keys
               (id, tenant, name, admin, secret_hash, created_at_ms, change_network, approver)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            (
                &id,
                tenant,
                name,
                admin,
                secret_hash.as_slice(),
                now_ms,
                change_network,
                approver,
            ),
        );
        match inserted {
            Ok(_) => {
                let key = format!("{KEY_PREFIX}{id}_{}", hex::encode(secret));
                let record = ApiKeyRecord {
                    id,
                    tenant: tenant.to_owned(),
                    name: name.to_owned(),
                    admin,
                    change_network,
                    approver,
                    created_at_ms: now_ms,
                    revoked_at_ms: None,
                    last_used_at_ms: None,
                };
                return Ok((record, key));
            }
            Err(e) if violation(&e) == Some(Violation::PrimaryKey) => continue,
            Err(e) => return Err(StoreError::write("api key")(e)),
        }
    }
    Err(StoreError::Conflict {
        what: "api key id",
        id: format!("(after {ID_ATTEMPTS} random draws)"),
    })
}

fn revoke_api_key(conn: &Connection, id: &str, now_ms: i64) -> Result<bool, StoreError> {
    let changed = conn
        .execute_cached(
            "UPDATE api_keys SET revoked_at_ms = ?2 WHERE id = ?1 AND revoked_at_ms IS NULL",
            (id, now_ms),
        )
        .map_err(StoreError::write("api key revocation"))?;
    Ok(changed == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_key_accepts_only_the_canonical_format() {
        let secret = "ab".repeat(32);
        let good = format!("pdk_0123456789ab_{secret}");
        let (id, bytes) = parse_key(&good).expect("canonical key parses");
        assert_eq!(id, "0123456789ab");
        assert_eq!(bytes, [0xab; 32]);
        let e2b = e2b_spelling(&good).expect("a canonical key has an E2B spelling");
        assert_eq!(e2b, format!("e2b_0123456789ab{secret}"));
        assert_eq!(parse_key(&e2b), Some(("0123456789ab", [0xab; 32])));
        for bad in [
            format!("e2b_0123456789ab_{secret}"),
            format!("e2b_0123456789a{secret}"),
            format!("e2b_0123456789ab{secret}0"),
            format!("e2b_0123456789AB{secret}"),
            "e2b_".to_owned(),
            "e2b_é".to_owned(),
        ] {
            assert_eq!(parse_key(&bad), None, "{bad:?} must not parse");
        }

        for bad in [
            String::new(),
            "pdk_".to_owned(),
            format!("pdk_0123456789a_{secret}"),              // short id
            format!("pdk_0123456789abc_{secret}"),            // long id
            format!("pdk_0123456789AB_{secret}"),             // upper-case id
            format!("pdk_0123456789ab_{}", "AB".repeat(32)),  // upper-case secret
            format!("pdk_0123456789ab_{}", "ab".repeat(31)),  // short secret
            format!("pdk_0123456789ab_{secret}00"),           // long secret
            format!("pdk_0123456789ab_{secret}_"),            // trailing part
            format!("xyz_0123456789ab_{secret}"),             // prefix
            format!(" pdk_0123456789ab_{secret}"),            // whitespace
            format!("pdk_0123456789ag_{secret}"),             // not hex
            format!("pdk_0123456789ab_{}é", "ab".repeat(31)), // non-ASCII
        ] {
            assert!(parse_key(&bad).is_none(), "{bad:?} should be refused");
        }
    }
}
