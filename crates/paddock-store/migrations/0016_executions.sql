-- 0016: approved executions (issue 17).
--
-- One row per `POST /v1/executions`: what to run (`spec`, the request's JSON), the approval it
-- waits on, and what became of it. `state` moves only forward: pending_approval, then rejected or
-- running (or cancelled), then succeeded, failed, timed_out or cancelled. `client_id` is the
-- caller's own id, unique per tenant, so a retried request does not make a second execution.
CREATE TABLE executions (
    id             TEXT PRIMARY KEY,
    tenant         TEXT NOT NULL REFERENCES tenants(name),
    client_id      TEXT,
    session_id     TEXT,
    task_id        TEXT,
    description    TEXT NOT NULL,
    spec           TEXT NOT NULL CHECK (json_valid(spec)),
    executor       TEXT NOT NULL,
    approval_id    TEXT NOT NULL,
    requested_by   TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('pending_approval', 'rejected', 'running',
                                                  'succeeded', 'failed', 'timed_out', 'cancelled')),
    object         TEXT,
    exit_code      INTEGER,
    logs           BLOB,
    logs_truncated INTEGER NOT NULL DEFAULT 0 CHECK (logs_truncated IN (0, 1)),
    message        TEXT,
    approved_by    TEXT,
    created_at_ms  INTEGER NOT NULL,
    started_at_ms  INTEGER,
    finished_at_ms INTEGER,
    UNIQUE (tenant, client_id)
) STRICT;

CREATE INDEX executions_by_tenant ON executions (tenant, created_at_ms);
CREATE INDEX executions_by_approval ON executions (approval_id);
CREATE INDEX executions_open ON executions (state) WHERE state IN ('pending_approval', 'running');
