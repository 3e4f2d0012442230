//! Floor 0, the core: the service's shared state and the one way to do each shared thing: store
//! access (`db`), audit rows, intents, backend work (`on_backend`), the live-sandbox registry, tenant
//! access checks, quotas, errors and configuration.
//!
//! It does not plan requests, drive a sandbox's lifecycle or implement an operation; nothing here
//! imports from the floors above (`plan`, `lifecycle`, `ops`).

pub(crate) mod access;
pub(crate) mod activity;
pub(crate) mod approval_state;
pub(crate) mod approvals;
pub(crate) mod audit;
pub(crate) mod backend;
pub(crate) mod config;
pub(crate) mod contexts;
pub(crate) mod error;
pub(crate) mod execution_state;
pub(crate) mod executor;
pub(crate) mod live;
pub(crate) mod metrics;
pub(crate) mod output;
pub(crate) mod paging;
pub(crate) mod ports;
pub(crate) mod principal;
pub(crate) mod quota;
pub(crate) mod service;
pub(crate) mod time;
