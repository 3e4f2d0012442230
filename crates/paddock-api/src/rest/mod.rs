//! The REST API's handlers, one module per area. Each handler authenticates, extracts and makes one
//! call into `SandboxService`; none holds a business rule.

pub(crate) mod admin;
pub(crate) mod approvals;
pub(crate) mod code;
pub(crate) mod executions;
pub(crate) mod files;
pub(crate) mod meta;
pub(crate) mod network;
pub(crate) mod policies;
pub(crate) mod ports;
pub(crate) mod processes;
pub(crate) mod sandboxes;
pub(crate) mod snapshot_transfer;
pub(crate) mod snapshots;
pub(crate) mod templates;
pub(crate) mod volumes;
pub(crate) mod ws;
