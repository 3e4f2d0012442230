//! Floor 1, planning: turning a request into what to create (limits, template, user, environment,
//! network policy and secrets, volume mounts, labels), checked against the configuration and the
//! store.
//!
//! It boots nothing and changes nothing: a plan is data that `lifecycle` and `ops` act on. It uses
//! only `core`.

pub(crate) mod code;
pub(crate) mod create;
pub(crate) mod labels;
pub(crate) mod network;
pub(crate) mod template;
pub(crate) mod volumes;
pub(crate) mod warm;
