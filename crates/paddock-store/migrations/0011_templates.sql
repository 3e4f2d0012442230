-- 0011: templates built from images.
--
-- A template's files live in the pool (`<pool>/images/<id>`); this row is what its tenant sees and
-- what garbage collection trusts. A row is written `building` before the build starts (reserving
-- its name) and becomes `ready` when the build's files are in place; a failed build's row is
-- removed, and so is a `building` row found at startup (the build died with the server; gc
-- removes its staging files). Sandboxes name the template they were made from in their spec.
CREATE TABLE templates (
    id            TEXT PRIMARY KEY NOT NULL,
    tenant        TEXT NOT NULL REFERENCES tenants(name),
    name          TEXT NOT NULL,
    -- what it was built from, as given (an image reference)
    source        TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('building', 'ready')),
    -- ready: the image's digest, process defaults and layers
    detail_json   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(detail_json)),
    created_at_ms INTEGER NOT NULL,
    deleted_at_ms INTEGER
) STRICT;

-- A name is unique among a tenant's existing templates (a deleted template's name can be reused).
CREATE UNIQUE INDEX templates_tenant_name ON templates(tenant, name) WHERE deleted_at_ms IS NULL;
