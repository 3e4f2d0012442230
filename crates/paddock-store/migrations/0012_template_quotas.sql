-- 0012: templates count against their tenant's quotas: how many it may keep (`max_templates`) and
-- the bytes of the pool each holds (against `max_storage`).

-- NULL = the server's default (`[quotas]`), unlimited when that is unset too.
ALTER TABLE tenants ADD COLUMN max_templates INTEGER CHECK (max_templates IS NULL OR max_templates >= 0);

-- What a template is charged against the storage quota: while `building`, the most its build may
-- write (its reservation); once `ready`, the bytes its tree can hold in the pool (what it started
-- from in the layer cache plus what its build wrote, measured when the build ended).
ALTER TABLE templates ADD COLUMN storage_bytes INTEGER NOT NULL DEFAULT 0 CHECK (storage_bytes >= 0);
