-- 0013: a per-key permission to change a live sandbox's network policy and injected secrets after
-- creation (`PUT /v1/sandboxes/{id}/network`). Every key made before, and every key made without
-- saying otherwise, may (1): the permission is only ever taken away, when a key is made.
ALTER TABLE api_keys ADD COLUMN change_network INTEGER NOT NULL DEFAULT 1 CHECK (change_network IN (0, 1));
