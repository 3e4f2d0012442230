//! Egress state: each networked sandbox's policy, secret names and egress CA, and each tenant's
//! secrets. The store does not interpret a policy (the caller's JSON); secret values are only
//! returned by [`Store::secret_values`], for the egress proxy's owner.

use rusqlite::{Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::cached::Cached;
use crate::{Store, StoreError, StoreTx};

/// A networked sandbox's egress state.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxNetworkRecord {
    pub sandbox_id: String,
    /// The policy, as the caller's JSON.
    pub policy: serde_json::Value,
    /// Names of the tenant's secrets injected for the sandbox.
    pub secrets: Vec<String>,
    pub ca_cert_pem: String,
    /// The CA's private key (PEM). Never leaves the host.
    pub ca_key_pem: String,
    pub updated_at_ms: i64,
}

impl std::fmt::Debug for SandboxNetworkRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxNetworkRecord")
            .field("sandbox_id", &self.sandbox_id)
            .field("policy", &self.policy)
            .field("secrets", &self.secrets)
            .field("updated_at_ms", &self.updated_at_ms)
            .finish_non_exhaustive()
    }
}

/// A secret without its value: what listing shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    pub tenant: String,
    pub name: String,
    /// Host patterns the value may be sent to.
    pub hosts: Vec<String>,
    /// Header field names (lowercase) the value may be substituted into.
    pub headers: Vec<String>,
    /// Whether the value may be substituted into query strings too.
    pub query: bool,
    pub created_at_ms: i64,
}

/// A secret with its value, for the egress proxy's owner only.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretRecord {
    pub info: SecretInfo,
    pub value: Vec<u8>,
}

impl std::fmt::Debug for SecretRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretRecord")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

fn json<T: Serialize>(what: &'static str, v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|source| StoreError::EncodeJson { what, source })
}

fn from_json<T: for<'de> Deserialize<'de>>(what: &'static str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt {
        what,
        detail: e.to_string(),
    })
}

/// The columns of a secret row but its value, in [`INFO_COLUMNS`] order.
struct InfoColumns(String, String, String, i64, String, bool);

/// What [`InfoColumns::read`] reads, first in a `SELECT`.
const INFO_COLUMNS: &str = "tenant, name, hosts_json, created_at_ms, headers_json, query";

impl InfoColumns {
    fn read(row: &rusqlite::Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self(
            row.get(0)?,
            row.get(1)?,
            row.get(2)?,
            row.get(3)?,
            row.get(4)?,
            row.get(5)?,
        ))
    }

    fn into_info(self) -> Result<SecretInfo, StoreError> {
        Ok(SecretInfo {
            tenant: self.0,
            name: self.1,
            hosts: from_json("secret hosts", &self.2)?,
            created_at_ms: self.3,
            headers: from_json("secret headers", &self.4)?,
            query: self.5,
        })
    }
}

impl Store {
    /// The egress state of sandbox `id`, if it is networked.
    pub fn get_sandbox_network(&self, id: &str) -> Result<Option<SandboxNetworkRecord>, StoreError> {
        get_sandbox_network(&self.conn(), id)
    }

    /// The tenant's secrets, in name order, without values.
    pub fn list_secrets(&self, tenant: &str) -> Result<Vec<SecretInfo>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {INFO_COLUMNS} FROM secrets WHERE tenant = ?1 ORDER BY name"
            ))
            .map_err(StoreError::read("secrets"))?;
        let rows = stmt
            .query_map([tenant], InfoColumns::read)
            .map_err(StoreError::read("secrets"))?;
        rows.map(|r| r.map_err(StoreError::read("secrets"))?.into_info())
            .collect()
    }

    /// The tenant's secrets named in `names` that exist, with their values, in name order.
    pub fn secret_values(&self, tenant: &str, names: &[String]) -> Result<Vec<SecretRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {INFO_COLUMNS}, value FROM secrets WHERE tenant = ?1 AND name = ?2"
            ))
            .map_err(StoreError::read("secrets"))?;
        let mut out = Vec::new();
        let mut names: Vec<&String> = names.iter().collect();
        names.sort();
        names.dedup();
        for name in names {
            let row = stmt
                .query_row((tenant, name), |row| {
                    Ok((InfoColumns::read(row)?, row.get::<_, Vec<u8>>(6)?))
                })
                .optional()
                .map_err(StoreError::read("secret"))?;
            if let Some((info, value)) = row {
                out.push(SecretRecord {
                    info: info.into_info()?,
                    value,
                });
            }
        }
        Ok(out)
    }
}

impl StoreTx<'_> {
    /// Records a networked sandbox's egress state (with the sandbox's row, or replacing it).
    pub fn put_sandbox_network(&self, record: &SandboxNetworkRecord) -> Result<(), StoreError> {
        self.tx
            .execute_cached(
                "INSERT INTO sandbox_networks
                   (sandbox_id, policy_json, secrets_json, ca_cert_pem, ca_key_pem, updated_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (sandbox_id) DO UPDATE SET policy_json = excluded.policy_json,
                   secrets_json = excluded.secrets_json, ca_cert_pem = excluded.ca_cert_pem,
                   ca_key_pem = excluded.ca_key_pem, updated_at_ms = excluded.updated_at_ms",
                (
                    &record.sandbox_id,
                    json("network policy", &record.policy)?,
                    json("secret names", &record.secrets)?,
                    &record.ca_cert_pem,
                    &record.ca_key_pem,
                    record.updated_at_ms,
                ),
            )
            .map_err(StoreError::write("sandbox network"))?;
        Ok(())
    }

    /// [`Store::get_sandbox_network`] inside this transaction.
    pub fn get_sandbox_network(&self, id: &str) -> Result<Option<SandboxNetworkRecord>, StoreError> {
        get_sandbox_network(&self.tx, id)
    }

    /// Records a secret. A name the tenant already uses is [`StoreError::Conflict`].
    pub fn insert_secret(&self, info: &SecretInfo, value: &[u8]) -> Result<(), StoreError> {
        let taken = self
            .tx
            .query_row_cached(
                "SELECT 1 FROM secrets WHERE tenant = ?1 AND name = ?2",
                (&info.tenant, &info.name),
                |_| Ok(()),
            )
            .optional()
            .map_err(StoreError::read("secret"))?
            .is_some();
        if taken {
            return Err(StoreError::Conflict {
                what: "secret name",
                id: info.name.clone(),
            });
        }
        self.tx
            .execute_cached(
                "INSERT INTO secrets (tenant, name, value, hosts_json, created_at_ms, headers_json, query)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                (
                    &info.tenant,
                    &info.name,
                    value,
                    json("secret hosts", &info.hosts)?,
                    info.created_at_ms,
                    json("secret headers", &info.headers)?,
                    info.query,
                ),
            )
            .map_err(StoreError::write("secret"))?;
        Ok(())
    }

    /// Deletes the tenant's secret; `false` if there was none.
    pub fn delete_secret(&self, tenant: &str, name: &str) -> Result<bool, StoreError> {
        let n = self
            .tx
            .execute_cached(
                "DELETE FROM secrets WHERE tenant = ?1 AND name = ?2",
                (tenant, name),
            )
            .map_err(StoreError::write("secret"))?;
        Ok(n > 0)
    }
}

fn get_sandbox_network(conn: &Connection, id: &str) -> Result<Option<SandboxNetworkRecord>, StoreError> {
    let row = conn
        .query_row_cached(
            "SELECT sandbox_id, policy_json, secrets_json, ca_cert_pem, ca_key_pem, updated_at_ms
             FROM sandbox_networks WHERE sandbox_id = ?1",
            [id],
            |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, String>(3)?,
                    row.get::<_, String>(4)?,
                    row.get::<_, i64>(5)?,
                ))
            },
        )
        .optional()
        .map_err(StoreError::read("sandbox network"))?;
    row.map(
        |(sandbox_id, policy, secrets, ca_cert_pem, ca_key_pem, updated_at_ms)| {
            Ok(SandboxNetworkRecord {
                sandbox_id,
                policy: from_json("network policy", &policy)?,
                secrets: from_json("secret names", &secrets)?,
                ca_cert_pem,
                ca_key_pem,
                updated_at_ms,
            })
        },
    )
    .transpose()
}
