-- 0001: the initial schema. Migrations are forward-only: never edit this file once released, add 0002.
-- Every table is STRICT so a value of the wrong type is refused instead of silently stored.

CREATE TABLE tenants (
    name             TEXT PRIMARY KEY NOT NULL,
    -- NULL = unlimited
    max_sandboxes    INTEGER CHECK (max_sandboxes IS NULL OR max_sandboxes >= 0),
    max_memory_bytes INTEGER CHECK (max_memory_bytes IS NULL OR max_memory_bytes >= 0),
    max_cpu_millis   INTEGER CHECK (max_cpu_millis IS NULL OR max_cpu_millis >= 0),
    created_at_ms    INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
    id              TEXT PRIMARY KEY NOT NULL,
    tenant          TEXT NOT NULL REFERENCES tenants(name),
    name            TEXT NOT NULL,
    admin           INTEGER NOT NULL CHECK (admin IN (0, 1)),
    -- SHA-256 of the key's secret; the secret itself is never stored
    secret_hash     BLOB NOT NULL CHECK (length(secret_hash) = 32),
    created_at_ms   INTEGER NOT NULL,
    revoked_at_ms   INTEGER,
    last_used_at_ms INTEGER
) STRICT;

CREATE INDEX api_keys_tenant ON api_keys(tenant);

CREATE TABLE sandboxes (
    id            TEXT PRIMARY KEY NOT NULL,
    -- NULL while the sandbox sits in a warm pool
    tenant        TEXT REFERENCES tenants(name),
    state         TEXT NOT NULL
                  CHECK (state IN ('warm', 'creating', 'running', 'stopped', 'expired', 'failed')),
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
    -- a warm sandbox belongs to nobody yet
    CHECK (state <> 'warm' OR tenant IS NULL)
) STRICT;

CREATE INDEX sandboxes_tenant_state ON sandboxes(tenant, state);
CREATE INDEX sandboxes_state_expires ON sandboxes(state, expires_at_ms);
CREATE INDEX sandboxes_warm ON sandboxes(profile, created_at_ms) WHERE state = 'warm';

-- The audit log: append-only and hash-chained (see audit_hash in src/audit_hash.rs for the row encoding).
-- No foreign keys: an audit row outlives the tenant, key and sandbox it names.
CREATE TABLE audit (
    seq         INTEGER PRIMARY KEY,
    ts_ms       INTEGER NOT NULL,
    tenant      TEXT,
    key_id      TEXT,
    action      TEXT NOT NULL,
    sandbox_id  TEXT,
    outcome     TEXT NOT NULL,
    detail_json TEXT NOT NULL CHECK (json_valid(detail_json)),
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL
) STRICT;

CREATE INDEX audit_tenant ON audit(tenant, seq);
CREATE INDEX audit_sandbox ON audit(sandbox_id, seq);
CREATE INDEX audit_action ON audit(action, seq);
CREATE INDEX audit_ts ON audit(ts_ms);

CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN
    SELECT RAISE(ABORT, 'audit log is append-only');
END;

CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN
    SELECT RAISE(ABORT, 'audit log is append-only');
END;

-- Rows are appended with the next seq only: this also stops INSERT OR REPLACE from overwriting a row
-- (REPLACE deletes without firing the delete trigger).
CREATE TRIGGER audit_append_in_order BEFORE INSERT ON audit
WHEN NEW.seq IS NOT (SELECT COALESCE(MAX(seq), 0) + 1 FROM audit)
BEGIN
    SELECT RAISE(ABORT, 'audit rows are appended in seq order');
END;
