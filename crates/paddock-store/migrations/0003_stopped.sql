-- 0003: a resumable `stopped` state (the sandbox's files kept, no processes); the ended state for a
-- sandbox killed on request, formerly `stopped`, is now `killed`.
--
-- SQLite cannot change a CHECK constraint in place: the table is rebuilt with the same columns (no
-- other table references it, so the rebuild needs no foreign-key juggling).

CREATE TABLE sandboxes_new (
    id            TEXT PRIMARY KEY NOT NULL,
    -- NULL while the sandbox sits in a warm pool
    tenant        TEXT REFERENCES tenants(name),
    -- stopped: files kept in the pool, no processes, no cgroups; resumable, and not ended
    state         TEXT NOT NULL
                  CHECK (state IN ('warm', 'creating', 'running', 'stopped', 'killed', 'expired', 'failed')),
    profile       TEXT NOT NULL,
    spec_json     TEXT NOT NULL CHECK (json_valid(spec_json)),
    labels_json   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(labels_json)),
    memory_bytes  INTEGER NOT NULL CHECK (memory_bytes >= 0),
    cpu_millis    INTEGER NOT NULL CHECK (cpu_millis >= 0),
    created_at_ms INTEGER NOT NULL,
    claimed_at_ms INTEGER,
    expires_at_ms INTEGER,
    ended_at_ms   INTEGER,
    end_reason    TEXT,
    paused        INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    -- a warm sandbox belongs to nobody yet
    CHECK (state <> 'warm' OR tenant IS NULL)
) STRICT;

INSERT INTO sandboxes_new (id, tenant, state, profile, spec_json, labels_json, memory_bytes, cpu_millis,
                           created_at_ms, claimed_at_ms, expires_at_ms, ended_at_ms, end_reason, paused)
SELECT id, tenant, CASE state WHEN 'stopped' THEN 'killed' ELSE state END, profile, spec_json,
       labels_json, memory_bytes, cpu_millis, created_at_ms, claimed_at_ms, expires_at_ms, ended_at_ms,
       end_reason, paused
FROM sandboxes;

DROP TABLE sandboxes;
ALTER TABLE sandboxes_new RENAME TO sandboxes;

CREATE INDEX sandboxes_tenant_state ON sandboxes(tenant, state);
CREATE INDEX sandboxes_state_expires ON sandboxes(state, expires_at_ms);
CREATE INDEX sandboxes_warm ON sandboxes(profile, created_at_ms) WHERE state = 'warm';
