-- 0010: intent records of multi-step sandbox operations.
--
-- An operation that changes a sandbox in several irreversible steps (rollback, stop, resume of a
-- stopped sandbox, fork) writes its intent here before its first step and removes it in the
-- transaction that records its outcome. A server that crashed in between finds the intent at its
-- next start and finishes or undoes the operation (see paddock-control's recovery). One sandbox has
-- at most one operation in flight of each kind that holds its operation lock; a fork holds none
-- (several may run), hence the surrogate key.
CREATE TABLE intents (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    sandbox_id    TEXT NOT NULL REFERENCES sandboxes(id),
    op            TEXT NOT NULL CHECK (op IN ('rollback', 'stop', 'resume', 'fork')),
    -- rollback: the snapshot it returns to; fork: the base snapshot its copies boot from
    snapshot_id   TEXT,
    -- rollback: whether it consumes its checkpoint; fork: the ids of the copies (JSON array)
    detail_json   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(detail_json)),
    created_at_ms INTEGER NOT NULL
) STRICT;

CREATE INDEX intents_sandbox ON intents(sandbox_id);
