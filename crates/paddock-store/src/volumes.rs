//! Named volume records and the sandboxes that mount them. The storage itself lives in the pool;
//! these rows say who owns which volume, which still exist, and which live sandbox mounts which.

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};

use crate::cached::Cached;
use crate::error::{from_i64, to_i64, violation, Violation};
use crate::quota::{check_quota, QuotaRequest};
use crate::{QuotaDefaults, Store, StoreError, StoreTx};

/// A volume to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewVolume {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub size_bytes: Option<u64>,
    pub created_at_ms: i64,
}

/// A stored volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub size_bytes: Option<u64>,
    pub created_at_ms: i64,
    pub deleted_at_ms: Option<i64>,
}

/// A volume mounted by a sandbox, recorded with the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMountRecord {
    pub sandbox_id: String,
    pub volume_id: String,
    pub path: String,
    pub read_only: bool,
}

/// Which volumes [`Store::list_volumes`] returns (existing ones only), in id order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeFilter {
    pub tenant: Option<String>,
    /// Keyset cursor: only ids after this one.
    pub after_id: Option<String>,
    pub limit: u32,
}

const COLUMNS: &str = "id, tenant, name, labels_json, size_bytes, created_at_ms, deleted_at_ms";

/// States of a sandbox that holds its volumes: live ones, as in [`crate::SandboxState::is_live`], and
/// stopped ones (they mount them again when resumed).
const LIVE: &str = "('warm', 'creating', 'running', 'stopped')";

impl Store {
    /// Records a volume. A name the tenant already uses is [`StoreError::Conflict`] (`what` =
    /// `"volume name"`).
    pub fn insert_volume(&self, volume: &NewVolume) -> Result<(), StoreError> {
        self.write("insert volume", |conn| insert_volume(conn, volume))
    }

    /// A volume by id, deleted or not.
    pub fn get_volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        get_volume(&self.conn(), id)
    }

    /// The tenant's existing volume whose id or name is `id_or_name`.
    pub fn find_volume(&self, tenant: &str, id_or_name: &str) -> Result<Option<VolumeRecord>, StoreError> {
        find_volume(&self.conn(), tenant, id_or_name)
    }

    pub fn list_volumes(&self, filter: &VolumeFilter) -> Result<Vec<VolumeRecord>, StoreError> {
        let mut sql = format!("SELECT {COLUMNS} FROM volumes WHERE deleted_at_ms IS NULL");
        let mut args: Vec<Box<dyn rusqlite::ToSql>> = Vec::new();
        if let Some(t) = &filter.tenant {
            sql.push_str(" AND tenant = ?");
            args.push(Box::new(t.clone()));
        }
        if let Some(a) = &filter.after_id {
            sql.push_str(" AND id > ?");
            args.push(Box::new(a.clone()));
        }
        sql.push_str(" ORDER BY id LIMIT ?");
        args.push(Box::new(i64::from(filter.limit)));
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&sql).map_err(StoreError::read("volumes"))?;
        let rows = stmt
            .query_map(
                rusqlite::params_from_iter(args.iter().map(|a| a.as_ref())),
                read_row,
            )
            .map_err(StoreError::read("volumes"))?;
        rows.map(|r| r.map_err(StoreError::read("volumes")).and_then(into_record))
            .collect()
    }

    /// Ids of the live sandboxes that mount volume `id`, in id order.
    pub fn volume_users(&self, id: &str) -> Result<Vec<String>, StoreError> {
        volume_users(&self.conn(), id)
    }

    /// The volumes sandbox `sandbox_id` mounts, in path order.
    pub fn sandbox_volume_mounts(&self, sandbox_id: &str) -> Result<Vec<VolumeMountRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT sandbox_id, volume_id, path, read_only FROM volume_mounts
                 WHERE sandbox_id = ?1 ORDER BY path",
            )
            .map_err(StoreError::read("volume mounts"))?;
        let rows = stmt
            .query_map([sandbox_id], |row| {
                Ok(VolumeMountRecord {
                    sandbox_id: row.get(0)?,
                    volume_id: row.get(1)?,
                    path: row.get(2)?,
                    read_only: row.get::<_, i64>(3)? != 0,
                })
            })
            .map_err(StoreError::read("volume mounts"))?;
        rows.map(|r| r.map_err(StoreError::read("volume mounts")))
            .collect()
    }

    /// Ids of every existing volume (for garbage collection of the pool).
    pub fn existing_volume_ids(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached("SELECT id FROM volumes WHERE deleted_at_ms IS NULL ORDER BY id")
            .map_err(StoreError::read("volume ids"))?;
        let rows = stmt
            .query_map([], |row| row.get::<_, String>(0))
            .map_err(StoreError::read("volume ids"))?;
        rows.map(|r| r.map_err(StoreError::read("volume ids"))).collect()
    }

    /// Marks a volume deleted at `now_ms` (whether or not it is mounted). `false` if absent or
    /// already deleted.
    pub fn mark_volume_deleted(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        mark_volume_deleted(&self.conn(), id, now_ms)
    }
}

impl StoreTx<'_> {
    /// [`Store::insert_volume`] inside this transaction (with its audit row).
    pub fn insert_volume(&self, volume: &NewVolume) -> Result<(), StoreError> {
        insert_volume(&self.tx, volume)
    }

    /// Records a volume if its tenant's quota allows one more of its size
    /// ([`StoreError::QuotaExceeded`] otherwise), inside this transaction (with its audit row).
    pub fn insert_volume_checked(
        &self,
        volume: &NewVolume,
        defaults: &QuotaDefaults,
    ) -> Result<(), StoreError> {
        let request = QuotaRequest {
            volumes: 1,
            storage_bytes: volume.size_bytes.unwrap_or(defaults.unsized_volume_bytes),
            ..QuotaRequest::default()
        };
        check_quota(&self.tx, &volume.tenant, &request, defaults)?;
        insert_volume(&self.tx, volume)
    }

    /// Records that sandbox `mount.sandbox_id` (inserted in this transaction) mounts a volume, which
    /// must exist and belong to `tenant` ([`StoreError::Missing`] otherwise): checked in the same
    /// transaction, so a volume deleted concurrently is either refused here or refuses the delete.
    pub fn insert_volume_mount(&self, tenant: &str, mount: &VolumeMountRecord) -> Result<(), StoreError> {
        let owned = get_volume(&self.tx, &mount.volume_id)?
            .is_some_and(|v| v.tenant == tenant && v.deleted_at_ms.is_none());
        if !owned {
            return Err(StoreError::Missing {
                what: "volume",
                id: mount.volume_id.clone(),
            });
        }
        self.tx
            .execute_cached(
                "INSERT INTO volume_mounts (sandbox_id, volume_id, path, read_only) VALUES (?1, ?2, ?3, ?4)",
                (
                    &mount.sandbox_id,
                    &mount.volume_id,
                    &mount.path,
                    i64::from(mount.read_only),
                ),
            )
            .map_err(StoreError::write("volume mount"))?;
        Ok(())
    }

    /// [`Store::volume_users`] inside this transaction.
    pub fn volume_users(&self, id: &str) -> Result<Vec<String>, StoreError> {
        volume_users(&self.tx, id)
    }

    /// [`Store::mark_volume_deleted`] inside this transaction.
    pub fn mark_volume_deleted(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        mark_volume_deleted(&self.tx, id, now_ms)
    }
}

fn insert_volume(conn: &Connection, v: &NewVolume) -> Result<(), StoreError> {
    let labels = serde_json::to_string(&v.labels).map_err(|source| StoreError::EncodeJson {
        what: "volume labels",
        source,
    })?;
    let size = v.size_bytes.map(|s| to_i64("size_bytes", s)).transpose()?;
    let taken = conn
        .query_row_cached(
            "SELECT 1 FROM volumes WHERE tenant = ?1 AND name = ?2 AND deleted_at_ms IS NULL",
            (&v.tenant, &v.name),
            |_| Ok(()),
        )
        .optional()
        .map_err(StoreError::read("volume name"))?
        .is_some();
    let conflict = || StoreError::Conflict {
        what: "volume name",
        id: v.name.clone(),
    };
    if taken {
        return Err(conflict());
    }
    let inserted = conn.execute_cached(
        "INSERT INTO volumes (id, tenant, name, labels_json, size_bytes, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        (&v.id, &v.tenant, &v.name, labels, size, v.created_at_ms),
    );
    match inserted {
        Ok(_) => Ok(()),
        Err(e) if violation(&e) == Some(Violation::PrimaryKey) => Err(conflict()),
        Err(e) => Err(StoreError::write("volume")(e)),
    }
}

fn get_volume(conn: &Connection, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
    conn.query_row_cached(
        &format!("SELECT {COLUMNS} FROM volumes WHERE id = ?1"),
        [id],
        read_row,
    )
    .optional()
    .map_err(StoreError::read("volume"))?
    .map(into_record)
    .transpose()
}

fn find_volume(
    conn: &Connection,
    tenant: &str,
    id_or_name: &str,
) -> Result<Option<VolumeRecord>, StoreError> {
    conn.query_row_cached(
        &format!(
            "SELECT {COLUMNS} FROM volumes
             WHERE tenant = ?1 AND (id = ?2 OR name = ?2) AND deleted_at_ms IS NULL
             ORDER BY id = ?2 DESC LIMIT 1"
        ),
        [tenant, id_or_name],
        read_row,
    )
    .optional()
    .map_err(StoreError::read("volume"))?
    .map(into_record)
    .transpose()
}

fn volume_users(conn: &Connection, id: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT DISTINCT m.sandbox_id FROM volume_mounts m JOIN sandboxes s ON s.id = m.sandbox_id
             WHERE m.volume_id = ?1 AND s.state IN {LIVE} ORDER BY m.sandbox_id"
        ))
        .map_err(StoreError::read("volume users"))?;
    let rows = stmt
        .query_map([id], |row| row.get::<_, String>(0))
        .map_err(StoreError::read("volume users"))?;
    rows.map(|r| r.map_err(StoreError::read("volume users")))
        .collect()
}

fn mark_volume_deleted(conn: &Connection, id: &str, now_ms: i64) -> Result<bool, StoreError> {
    let changed = conn
        .execute_cached(
            "UPDATE volumes SET deleted_at_ms = ?2 WHERE id = ?1 AND deleted_at_ms IS NULL",
            (id, now_ms),
        )
        .map_err(StoreError::write("volume deletion"))?;
    Ok(changed == 1)
}

type RawRow = (String, String, String, String, Option<i64>, i64, Option<i64>);

fn read_row(row: &Row<'_>) -> rusqlite::Result<RawRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
    ))
}

fn into_record(r: RawRow) -> Result<VolumeRecord, StoreError> {
    let (id, tenant, name, labels_json, size, created_at_ms, deleted_at_ms) = r;
    let labels = serde_json::from_str(&labels_json).map_err(|e| StoreError::Corrupt {
        what: "volume labels",
        detail: format!("volume {id}: {e}"),
    })?;
    let size_bytes = size.map(|s| from_i64("volume size", s)).transpose()?;
    Ok(VolumeRecord {
        id,
        tenant,
        name,
        labels,
        size_bytes,
        created_at_ms,
        deleted_at_ms,
    })
}
