-- 0006: egress policies, the per-sandbox egress CA, and secrets injected by the egress proxy.

-- A networked sandbox's egress state, written with the sandbox's row and changed live. Absent for a
-- sandbox with loopback only. The CA's private key stays on the host (the sandbox trusts the
-- certificate); a restarted server serves the sandbox under the same CA.
CREATE TABLE sandbox_networks (
    sandbox_id    TEXT PRIMARY KEY NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
    policy_json   TEXT NOT NULL CHECK (json_valid(policy_json)),
    -- Names of the tenant's secrets injected for this sandbox, a JSON array.
    secrets_json  TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(secrets_json)),
    ca_cert_pem   TEXT NOT NULL,
    ca_key_pem    TEXT NOT NULL,
    updated_at_ms INTEGER NOT NULL
) STRICT;

-- A tenant's secrets. Values are only ever read by the egress proxy's owner, never returned by the
-- API or written to the audit log. `hosts_json` is the JSON array of host patterns a value may be
-- sent to.
CREATE TABLE secrets (
    tenant        TEXT NOT NULL REFERENCES tenants(name),
    name          TEXT NOT NULL,
    value         BLOB NOT NULL,
    hosts_json    TEXT NOT NULL CHECK (json_valid(hosts_json)),
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (tenant, name)
) STRICT;
