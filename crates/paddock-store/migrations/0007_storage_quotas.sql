-- 0007: quotas on what a tenant stores (sandboxes that exist, stopped ones included; snapshots;
-- volumes; bytes of the pool) and what each stored thing is charged against the storage quota.

-- NULL = the server's default (`[quotas]`), unlimited when that is unset too.
ALTER TABLE tenants ADD COLUMN max_snapshots INTEGER CHECK (max_snapshots IS NULL OR max_snapshots >= 0);
ALTER TABLE tenants ADD COLUMN max_volumes INTEGER CHECK (max_volumes IS NULL OR max_volumes >= 0);
ALTER TABLE tenants ADD COLUMN max_storage_bytes INTEGER CHECK (max_storage_bytes IS NULL OR max_storage_bytes >= 0);

-- A sandbox holds at most its disk limit of its own writes (the pool's simple quotas charge every
-- extent to the subvolume that wrote it, for as long as it exists) plus what it started from: the
-- charge of the snapshot it was made from (a fork, a creation from a snapshot, a rollback), 0 for
-- the template. It is charged both while it exists (creating, running, stopped).
ALTER TABLE sandboxes ADD COLUMN disk_bytes INTEGER NOT NULL DEFAULT 0 CHECK (disk_bytes >= 0);
ALTER TABLE sandboxes ADD COLUMN base_bytes INTEGER NOT NULL DEFAULT 0 CHECK (base_bytes >= 0);

-- A snapshot is charged what it can keep alive on its own: its sandbox's base plus the bytes the
-- sandbox had written when it was taken (an import: the archive's size).
ALTER TABLE snapshots ADD COLUMN storage_bytes INTEGER NOT NULL DEFAULT 0 CHECK (storage_bytes >= 0);

-- Existing sandboxes: their disk limit from the stored spec (their base is unknown: 0).
UPDATE sandboxes
SET disk_bytes = COALESCE(CAST(json_extract(spec_json, '$.limits.disk') AS INTEGER), 0)
WHERE CAST(json_extract(spec_json, '$.limits.disk') AS INTEGER) > 0;

-- Existing snapshots: their sandbox's disk limit when its row is still there (an upper bound of what
-- it wrote), else nothing is known.
UPDATE snapshots
SET storage_bytes = (SELECT s.disk_bytes FROM sandboxes s WHERE s.id = snapshots.sandbox_id)
WHERE EXISTS (SELECT 1 FROM sandboxes s WHERE s.id = snapshots.sandbox_id);
