-- 0015: the approvals queue (issue 17).
--
-- One row per request an approval policy said `ask` about. `request` is the exact request as the
-- API received it (JSON) and `request_sha256` its canonical hash: an approved row lets a request
-- with that hash run once (`used_at_ms`). Rows never go back to `pending`; a decided row is only
-- ever marked used. The control plane bounds the pending rows and keeps a bounded number of
-- decided ones per tenant.
CREATE TABLE approvals (
    id             TEXT PRIMARY KEY,
    tenant         TEXT NOT NULL REFERENCES tenants(name),
    sandbox_id     TEXT,
    kind           TEXT NOT NULL CHECK (kind IN ('exec', 'file', 'network', 'execution')),
    summary        TEXT NOT NULL,
    request        TEXT NOT NULL CHECK (json_valid(request)),
    request_sha256 TEXT NOT NULL,
    policy_scope   TEXT NOT NULL CHECK (policy_scope IN ('tenant', 'sandbox')),
    rule           INTEGER,
    reason         TEXT,
    requested_by   TEXT NOT NULL,
    state          TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'rejected', 'expired')),
    created_at_ms  INTEGER NOT NULL,
    expires_at_ms  INTEGER NOT NULL,
    decided_at_ms  INTEGER,
    decided_by     TEXT,
    note           TEXT,
    used_at_ms     INTEGER
) STRICT;

CREATE INDEX approvals_by_tenant ON approvals (tenant, created_at_ms);
CREATE INDEX approvals_open ON approvals (state, expires_at_ms) WHERE state IN ('pending', 'approved');
