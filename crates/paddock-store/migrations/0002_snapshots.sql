-- 0002: snapshots (named snapshots and per-step checkpoints) and paused sandboxes.

-- A read-only capture of a sandbox's writable file system. Its storage lives in the pool
-- (`<pool>/snapshots/<id>`); this row is what a tenant sees and what garbage collection trusts.
CREATE TABLE snapshots (
    id            TEXT PRIMARY KEY NOT NULL,
    tenant        TEXT NOT NULL REFERENCES tenants(name),
    -- the sandbox it was taken of (no foreign key: a snapshot outlives its sandbox's row purge)
    sandbox_id    TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('snapshot', 'checkpoint')),
    name          TEXT,
    labels_json   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels_json)),
    created_at_ms INTEGER NOT NULL,
    deleted_at_ms INTEGER
) STRICT;

CREATE INDEX snapshots_tenant ON snapshots(tenant, id) WHERE deleted_at_ms IS NULL;
CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id, created_at_ms) WHERE deleted_at_ms IS NULL;

-- A paused sandbox keeps its state `running` (it holds its resources) with every process frozen.
ALTER TABLE sandboxes ADD COLUMN paused INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1));
