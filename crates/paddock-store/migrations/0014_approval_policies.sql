-- 0014: human approval (issue 17), first slice.
--
-- A per-key permission to set and delete the tenant's approval policies (and, later, to approve
-- held requests). Keys made before it existed may not (0); admin keys are made with it.
ALTER TABLE api_keys ADD COLUMN approver INTEGER NOT NULL DEFAULT 0 CHECK (approver IN (0, 1));

-- Approval policies: one per tenant (`sandbox_id` empty) and one per sandbox of the tenant. `spec`
-- is the policy's JSON as the control plane compiled and normalized it; the store does not read it.
CREATE TABLE approval_policies (
    tenant        TEXT NOT NULL REFERENCES tenants(name),
    sandbox_id    TEXT NOT NULL DEFAULT '',
    spec          TEXT NOT NULL CHECK (json_valid(spec)),
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, sandbox_id)
) STRICT;
