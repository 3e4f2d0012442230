-- 0007: where in a request a secret's value may go (issue 11, class 8: a value was substituted into
-- any header of a request to a bound host, so an endpoint echoing headers handed it back).

-- The lowercase header field names the value may be substituted into, a JSON array. Secrets stored
-- before this migration get `authorization` only, the default for new ones.
ALTER TABLE secrets ADD COLUMN headers_json TEXT NOT NULL DEFAULT '["authorization"]'
    CHECK (json_valid(headers_json));
-- Whether the value may also be substituted into the query string of a request to a bound host.
ALTER TABLE secrets ADD COLUMN query INTEGER NOT NULL DEFAULT 0 CHECK (query IN (0, 1));
