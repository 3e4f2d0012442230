//! Floor 3, the operations: one module per area of the API (sandboxes, exec, environment, files,
//! snapshots, steps, fork, diff, transfer, volumes, network, secrets, approval policies, the approvals queue, admin), and the record of a
//! front-end's calls (`calls`). Each uses the floors
//! below and never another operation's module (`tests/layers.rs` checks both).
//!
//! Shared steps do not live here: when two operations need the same step, it moves down a floor.

pub(crate) mod admin;
pub(crate) mod approvals;
pub(crate) mod calls;
pub(crate) mod code;
pub(crate) mod diff;
pub(crate) mod environment;
pub(crate) mod exec;
pub(crate) mod executions;
pub(crate) mod files;
pub(crate) mod fork;
pub(crate) mod network;
pub(crate) mod policies;
pub(crate) mod ports;
pub(crate) mod sandboxes;
pub(crate) mod secrets;
pub(crate) mod snapshots;
pub(crate) mod steps;
pub(crate) mod templates;
pub(crate) mod transfer;
pub(crate) mod volumes;
