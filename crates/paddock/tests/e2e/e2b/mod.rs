//! E2B compatibility: E2B's official SDKs, unchanged and from their registries (pinned in
//! `crates/paddock/tests/e2b_clients/`, installed by `scripts/install-e2b-clients.sh`), drive a real
//! `paddock serve` through its E2B front-end: the Python SDK at its newest 2.x and at 2.45.x, the
//! JavaScript SDK at its newest 2.x. Each suite is a file of the client's own test runner; this
//! module starts the server, makes two tenants' keys and runs it.

mod sdk;
mod tls;
