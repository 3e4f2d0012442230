//! Floor 2, the lifecycle: booting and tearing down sandboxes, the state changes between running,
//! paused, stopped and ended (with their audit rows), capturing and freeing snapshot storage,
//! restarts (rollback), networks of live sandboxes, recovery after a restart, the reaper, warm
//! pools, and following processes that outlive a request.
//!
//! It serves no request by itself beyond the state-machine operations (stop, pause, resume, kill);
//! it uses `core` and `plan`, never `ops`.

pub(crate) mod boot;
pub(crate) mod build_step;
pub(crate) mod capture;
pub(crate) mod end;
pub(crate) mod exec_diff;
pub(crate) mod kernels;
pub(crate) mod network;
pub(crate) mod network_audit;
pub(crate) mod pause;
pub(crate) mod port_audit;
pub(crate) mod processes;
pub(crate) mod reaper;
pub(crate) mod reattach;
pub(crate) mod recovery;
pub(crate) mod restart;
pub(crate) mod start;
pub(crate) mod start_command;
pub(crate) mod states;
pub(crate) mod stop;
pub(crate) mod storage;
pub(crate) mod warm;
