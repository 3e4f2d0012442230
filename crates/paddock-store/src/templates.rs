//! Template records: who owns which template built from an image, under which name, and which
//! sandboxes were made from it. The files live in the pool.

use rusqlite::{Connection, OptionalExtension, Row};

use crate::cached::Cached;
use crate::error::{to_i64, violation, Violation};
use crate::quota::{check_quota, QuotaRequest};
use crate::{QuotaDefaults, Store, StoreError, StoreTx};

/// A template to record, `building`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTemplate {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub source: String,
    pub created_at_ms: i64,
    /// What it is charged against the storage quota while it is built: the most its build may
    /// write.
    pub storage_bytes: u64,
}

/// A stored template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecord {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub source: String,
    /// Whether its build finished (else it is `building`).
    pub ready: bool,
    /// The build's result (JSON), `{}` while building.
    pub detail_json: String,
    pub created_at_ms: i64,
    /// What it is charged against the storage quota (see `0012_template_quotas.sql`).
    pub storage_bytes: u64,
}

/// What [`Store::delete_template_unless_used`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateDeletion {
    /// Marked deleted.
    Deleted,
    /// It was absent or deleted already.
    Absent,
    /// Kept: these sandboxes (live or stopped) and snapshots were made from it, in id order.
    InUse(Vec<String>),
}

const COLUMNS: &str = "id, tenant, name, source, state, detail_json, created_at_ms, storage_bytes";

/// States of a sandbox that holds its template's files: as for volumes, live and stopped ones.
const HOLDING: &str = "('warm', 'creating', 'running', 'stopped')";

impl Store {
    /// Records a template being built. A name the tenant already uses is
    /// [`StoreError::Conflict`] (`what` = `"template name"`).
    pub fn insert_template(&self, t: &NewTemplate) -> Result<(), StoreError> {
        self.write("insert template", |conn| insert_template(conn, t))
    }

    /// [`Self::insert_template`] if the tenant's quota allows one more template and its
    /// reservation (`t.storage_bytes`); else [`StoreError::QuotaExceeded`].
    pub fn insert_template_checked(
        &self,
        t: &NewTemplate,
        defaults: &QuotaDefaults,
    ) -> Result<(), StoreError> {
        self.write("insert template", |conn| {
            let request = QuotaRequest {
                templates: 1,
                storage_bytes: t.storage_bytes,
                ..QuotaRequest::default()
            };
            check_quota(conn, &t.tenant, &request, defaults)?;
            insert_template(conn, t)
        })
    }

    /// Removes the row of a template whose build failed (nothing references it).
    pub fn forget_template(&self, id: &str) -> Result<(), StoreError> {
        self.write("forget template", |conn| {
            conn.execute_cached("DELETE FROM templates WHERE id = ?1 AND state = 'building'", [id])
                .map_err(StoreError::write("template"))?;
            Ok(())
        })
    }

    /// Removes every `building` row (at startup: their builds died with the previous server);
    /// returns their ids.
    pub fn forget_unfinished_templates(&self) -> Result<Vec<String>, StoreError> {
        self.write("forget unfinished templates", |conn| {
            let ids = ids(
                conn,
                "SELECT id FROM templates WHERE state = 'building' ORDER BY id",
            )?;
            conn.execute_cached("DELETE FROM templates WHERE state = 'building'", [])
                .map_err(StoreError::write("templates"))?;
            Ok(ids)
        })
    }

    /// Marks a template deleted at `now_ms`, unless a sandbox made from it holds it (then nothing
    /// changes).
    pub fn delete_template_unless_used(&self, id: &str, now_ms: i64) -> Result<TemplateDeletion, StoreError> {
        self.write("delete template", |conn| {
            let users = template_users(conn, id)?;
            if !users.is_empty() {
                return Ok(TemplateDeletion::InUse(users));
            }
            let changed = conn
                .execute_cached(
                    "UPDATE templates SET deleted_at_ms = ?2 WHERE id = ?1 AND deleted_at_ms IS NULL",
                    (id, now_ms),
                )
                .map_err(StoreError::write("template deletion"))?;
            Ok(if changed == 1 {
                TemplateDeletion::Deleted
            } else {
                TemplateDeletion::Absent
            })
        })
    }

    /// The tenant's existing template whose id or name is `id_or_name` (ready or building).
    pub fn find_template(
        &self,
        tenant: &str,
        id_or_name: &str,
    ) -> Result<Option<TemplateRecord>, StoreError> {
        self.conn()
            .query_row_cached(
                &format!(
                    "SELECT {COLUMNS} FROM templates
                     WHERE tenant = ?1 AND (id = ?2 OR name = ?2) AND deleted_at_ms IS NULL
                     ORDER BY id = ?2 DESC LIMIT 1"
                ),
                [tenant, id_or_name],
                read_row,
            )
            .optional()
            .map_err(StoreError::read("template"))
    }

    /// The tenant's existing templates (ready or building), by name.
    pub fn list_templates(&self, tenant: &str) -> Result<Vec<TemplateRecord>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM templates WHERE tenant = ?1 AND deleted_at_ms IS NULL ORDER BY name"
            ))
            .map_err(StoreError::read("templates"))?;
        let rows = stmt
            .query_map([tenant], read_row)
            .map_err(StoreError::read("templates"))?;
        rows.map(|r| r.map_err(StoreError::read("templates"))).collect()
    }

    /// Ids of the sandboxes (live or stopped) and snapshots made from template `id`, in id order.
    pub fn template_users(&self, id: &str) -> Result<Vec<String>, StoreError> {
        template_users(&self.conn(), id)
    }

    /// Ids of ready templates charged nothing: recorded before migration 0012 kept what they hold.
    pub fn uncharged_templates(&self) -> Result<Vec<String>, StoreError> {
        ids(
            &self.conn(),
            "SELECT id FROM templates
             WHERE state = 'ready' AND storage_bytes = 0 AND deleted_at_ms IS NULL ORDER BY id",
        )
    }

    /// Sets what ready template `id` is charged (a measurement of one recorded without it).
    pub fn set_template_storage(&self, id: &str, storage_bytes: u64) -> Result<(), StoreError> {
        let bytes = to_i64("storage_bytes", storage_bytes)?;
        self.conn()
            .execute_cached(
                "UPDATE templates SET storage_bytes = ?2 WHERE id = ?1 AND state = 'ready'",
                (id, bytes),
            )
            .map_err(StoreError::write("template storage"))?;
        Ok(())
    }

    /// Ids of every template whose files must exist (ready or building), for garbage collection of
    /// the pool.
    pub fn existing_template_ids(&self) -> Result<Vec<String>, StoreError> {
        ids(
            &self.conn(),
            "SELECT id FROM templates WHERE deleted_at_ms IS NULL ORDER BY id",
        )
    }
}

impl StoreTx<'_> {
    /// Marks a template built, with its build's result, inside this transaction (with its audit
    /// row), now charged `storage_bytes` (what it holds, in place of its reservation). With
    /// `defaults`, refused ([`StoreError::QuotaExceeded`], nothing changed) if that takes its tenant
    /// over its storage quota; `None`: not checked (the operator's own templates).
    pub fn finish_template(
        &self,
        id: &str,
        detail_json: &str,
        storage_bytes: u64,
        defaults: Option<&QuotaDefaults>,
    ) -> Result<(), StoreError> {
        let bytes = to_i64("storage_bytes", storage_bytes)?;
        let tenant: String = self
            .tx
            .query_row_cached(
                "UPDATE templates SET storage_bytes = 0 WHERE id = ?1 AND state = 'building' RETURNING tenant",
                [id],
                |row| row.get(0),
            )
            .optional()
            .map_err(StoreError::write("template"))?
            .ok_or_else(|| StoreError::Corrupt {
                what: "template",
                detail: format!("{id} is not being built"),
            })?;
        if let Some(defaults) = defaults {
            // Its reservation is out of the usage now: this checks what it really holds.
            let request = QuotaRequest {
                storage_bytes,
                ..QuotaRequest::default()
            };
            check_quota(&self.tx, &tenant, &request, defaults)?;
        }
        self.tx
            .execute_cached(
                "UPDATE templates SET state = 'ready', detail_json = ?2, storage_bytes = ?3 WHERE id = ?1",
                (id, detail_json, bytes),
            )
            .map_err(StoreError::write("template"))?;
        Ok(())
    }
}

fn ids(conn: &Connection, sql: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn
        .prepare_cached(sql)
        .map_err(StoreError::read("template ids"))?;
    let rows = stmt
        .query_map([], |row| row.get::<_, String>(0))
        .map_err(StoreError::read("template ids"))?;
    rows.map(|r| r.map_err(StoreError::read("template ids")))
        .collect()
}

fn insert_template(conn: &Connection, t: &NewTemplate) -> Result<(), StoreError> {
    let conflict = || StoreError::Conflict {
        what: "template name",
        id: t.name.clone(),
    };
    let bytes = to_i64("storage_bytes", t.storage_bytes)?;
    let inserted = conn.execute_cached(
        "INSERT INTO templates (id, tenant, name, source, state, created_at_ms, storage_bytes)
         VALUES (?1, ?2, ?3, ?4, 'building', ?5, ?6)",
        (&t.id, &t.tenant, &t.name, &t.source, t.created_at_ms, bytes),
    );
    match inserted {
        Ok(_) => Ok(()),
        Err(e) if violation(&e) == Some(Violation::PrimaryKey) => Err(conflict()),
        Err(e) => Err(StoreError::write("template")(e)),
    }
}

fn template_users(conn: &Connection, id: &str) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT id FROM sandboxes
             WHERE state IN {HOLDING} AND json_extract(spec_json, '$.template_id') = ?1
             UNION ALL
             SELECT id FROM snapshots WHERE template_id = ?1 AND deleted_at_ms IS NULL
             ORDER BY id"
        ))
        .map_err(StoreError::read("template users"))?;
    let rows = stmt
        .query_map([id], |row| row.get::<_, String>(0))
        .map_err(StoreError::read("template users"))?;
    rows.map(|r| r.map_err(StoreError::read("template users")))
        .collect()
}

fn read_row(row: &Row<'_>) -> rusqlite::Result<TemplateRecord> {
    Ok(TemplateRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        name: row.get(2)?,
        source: row.get(3)?,
        ready: row.get::<_, String>(4)? == "ready",
        detail_json: row.get(5)?,
        created_at_ms: row.get(6)?,
        // (Never negative: the column's CHECK.)
        storage_bytes: row.get::<_, i64>(7)?.max(0).unsigned_abs(),
    })
}
