-- 0012: templates count against their tenant's quotas: how many it may keep (`max_templates`) and
-- the bytes of the pool each holds (against `max_storage`); snapshots name the image template their
-- files were made from.

-- NULL = the server's default (`[quotas]`), unlimited when that is unset too.
ALTER TABLE tenants ADD COLUMN max_templates INTEGER CHECK (max_templates IS NULL OR max_templates >= 0);

-- What a template is charged against the storage quota: while `building`, the most its build may
-- write (its reservation); once `ready`, the bytes its tree can hold in the pool (what it started
-- from in the layer cache plus what its build wrote, measured when the build ended).
ALTER TABLE templates ADD COLUMN storage_bytes INTEGER NOT NULL DEFAULT 0 CHECK (storage_bytes >= 0);

-- The image template a snapshot's files were made from (NULL: the host's tree, or an import): a
-- sandbox made from the snapshot starts on it, and it cannot be deleted while the snapshot exists.
-- Snapshots taken before this migration of a sandbox that still has its row get its template.
ALTER TABLE snapshots ADD COLUMN template_id TEXT;
UPDATE snapshots
SET template_id = (SELECT json_extract(s.spec_json, '$.template_id') FROM sandboxes s
                   WHERE s.id = snapshots.sandbox_id)
WHERE sandbox_id IS NOT NULL;
