-- 0007: retention of network audit rows, keeping the chain verifiable.
--
-- The egress proxy's rows (`network.*`) are the only ones a sandbox can make many of, so they are the
-- only ones retention may remove. Removing rows breaks the hash chain where they were; each removed
-- run of consecutive seqs is therefore recorded here first, with the hashes that bridge it (the
-- `prev_hash` of its first row and the `hash` of its last), by an `audit.prune` row appended to the
-- chain in the same transaction. That row's detail carries a digest of its ranges, so the ranges
-- cannot be changed or added afterwards without breaking the chain; `verify` walks across a gap only
-- through a recorded range whose hashes link.

CREATE TABLE audit_pruned (
    first_seq  INTEGER PRIMARY KEY,
    last_seq   INTEGER NOT NULL CHECK (last_seq >= first_seq),
    -- The `prev_hash` of row `first_seq`: the hash of the row before the range.
    prev_hash  TEXT NOT NULL,
    -- The `hash` of row `last_seq`: the `prev_hash` of the row after the range.
    last_hash  TEXT NOT NULL,
    -- The `audit.prune` row that recorded the range (always later than the range).
    anchor_seq INTEGER NOT NULL
) STRICT;

CREATE INDEX audit_pruned_anchor ON audit_pruned(anchor_seq, first_seq);

-- A range is recorded by an `audit.prune` row that follows it.
CREATE TRIGGER audit_pruned_anchored BEFORE INSERT ON audit_pruned
WHEN NEW.last_seq >= NEW.anchor_seq
  OR NOT EXISTS (SELECT 1 FROM audit WHERE seq = NEW.anchor_seq AND action = 'audit.prune')
BEGIN
    SELECT RAISE(ABORT, 'a pruned audit range must be recorded by a later audit.prune row');
END;

CREATE TRIGGER audit_pruned_no_update BEFORE UPDATE ON audit_pruned
BEGIN
    SELECT RAISE(ABORT, 'pruned audit ranges are append-only');
END;

CREATE TRIGGER audit_pruned_no_delete BEFORE DELETE ON audit_pruned
BEGIN
    SELECT RAISE(ABORT, 'pruned audit ranges are append-only');
END;

-- Audit rows stay undeletable, except a `network.*` row inside a recorded range. (A NULL from the
-- subquery, no range at all, must refuse too: hence the COALESCE.)
DROP TRIGGER audit_no_delete;

CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
WHEN NOT (
    OLD.action >= 'network.' AND OLD.action < 'network/'
    AND COALESCE(
        (SELECT last_seq FROM audit_pruned WHERE first_seq <= OLD.seq ORDER BY first_seq DESC LIMIT 1),
        0
    ) >= OLD.seq
)
BEGIN
    SELECT RAISE(ABORT, 'audit log is append-only');
END;

-- Retention looks network rows up by age.
CREATE INDEX audit_action_ts ON audit(action, ts_ms);
