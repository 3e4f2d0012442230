//! Sandboxes themselves, through `paddock run` or the native backend driven directly: isolation,
//! limits, teardown, adoption after a restart, snapshots and networks.

mod adopt;
mod failed_create;
mod isolation;
mod limits;
mod network;
mod snapshots;
mod teardown;
