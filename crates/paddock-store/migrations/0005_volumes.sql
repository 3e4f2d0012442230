-- 0003: named volumes and the sandboxes that mount them.

-- Persistent storage that outlives sandboxes. Its storage lives in the pool (`<pool>/volumes/<id>`);
-- this row is what a tenant sees and what garbage collection trusts.
CREATE TABLE volumes (
    id            TEXT PRIMARY KEY NOT NULL,
    tenant        TEXT NOT NULL REFERENCES tenants(name),
    name          TEXT NOT NULL,
    labels_json   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels_json)),
    size_bytes    INTEGER CHECK (size_bytes IS NULL OR size_bytes > 0),
    created_at_ms INTEGER NOT NULL,
    deleted_at_ms INTEGER
) STRICT;

-- A name is unique among a tenant's existing volumes (a deleted volume's name can be reused).
CREATE UNIQUE INDEX volumes_tenant_name ON volumes(tenant, name) WHERE deleted_at_ms IS NULL;

-- Which sandbox mounts which volume where, written with the sandbox's row. A volume is in use while
-- a live (warm, creating, running) sandbox mounts it; the rows go when the sandbox's row is purged.
CREATE TABLE volume_mounts (
    sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
    volume_id  TEXT NOT NULL REFERENCES volumes(id),
    path       TEXT NOT NULL,
    read_only  INTEGER NOT NULL CHECK (read_only IN (0, 1)),
    PRIMARY KEY (sandbox_id, path)
) STRICT;

CREATE INDEX volume_mounts_volume ON volume_mounts(volume_id);
