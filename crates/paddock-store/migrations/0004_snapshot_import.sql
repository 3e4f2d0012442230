-- 0004: snapshots imported from an archive belong to no sandbox: `sandbox_id` becomes optional
-- (checkpoints still always have one). SQLite cannot drop a NOT NULL constraint in place, so the
-- table is rebuilt with its rows and indexes.

CREATE TABLE snapshots_new (
    id            TEXT PRIMARY KEY NOT NULL,
    tenant        TEXT NOT NULL REFERENCES tenants(name),
    -- the sandbox it was taken of (no foreign key: a snapshot outlives its sandbox's row purge);
    -- NULL for a snapshot imported from an archive
    sandbox_id    TEXT,
    kind          TEXT NOT NULL CHECK (kind IN ('snapshot', 'checkpoint')),
    name          TEXT,
    labels_json   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels_json)),
    created_at_ms INTEGER NOT NULL,
    deleted_at_ms INTEGER,
    CHECK (sandbox_id IS NOT NULL OR kind = 'snapshot')
) STRICT;

INSERT INTO snapshots_new (id, tenant, sandbox_id, kind, name, labels_json, created_at_ms, deleted_at_ms)
    SELECT id, tenant, sandbox_id, kind, name, labels_json, created_at_ms, deleted_at_ms FROM snapshots;
DROP TABLE snapshots;
ALTER TABLE snapshots_new RENAME TO snapshots;

CREATE INDEX snapshots_tenant ON snapshots(tenant, id) WHERE deleted_at_ms IS NULL;
CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id, created_at_ms) WHERE deleted_at_ms IS NULL;
