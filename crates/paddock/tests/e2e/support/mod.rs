//! What every end-to-end test stands on. [`TestEnv::new`] is the fixture: it fails the test unless
//! it runs as root ([`require_root`]; CI does), gives the test its own state directory and parent
//! cgroup, and reclaims everything when dropped, also after a failure; a test ends with
//! [`TestEnv::assert_clean`]. [`skip`] is the loud skip of a root host that lacks what one test needs.
//!
//! Around it: the native backend driven directly (`backend.rs`), the REST API of an in-process
//! service (`harness.rs`: [`harness::Harness`], which checks cleanliness when dropped), a real
//! `paddock serve` (`server.rs`), the host's view of what sandboxes hold (`host.rs`), and the checks
//! that must hold after any crash (`crash.rs`).

mod backend;
pub mod crash;
mod env;
pub mod harness;
mod host;
pub mod mcp;
pub mod registry;
pub mod server;

pub use backend::{agent_sh, agent_sh_as, connect, host_spec, native_config, shell_request, GcOnDrop};
pub use env::{
    agent_bin, assert_code, paddock_bin, require_root, setup_bin, skip, stderr, stdout, test_name,
    wait_until, TestEnv, ID_BASE,
};
pub use host::{
    assert_cgroups_are, cgroups, cli_audit_verify, cli_gc, fd_kinds, open_fds, run_dirs, sandbox_processes,
    state_mounts, store_ids, store_sandboxes, subvolumes, threads, volume_in, volume_of, StoredSandbox,
};
