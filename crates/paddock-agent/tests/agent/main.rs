//! End-to-end tests: the real agent binary on a temporary socket and root, driven by the real
//! host-side `AgentClient`. Spawning switches users and drops capabilities, so these run as root
//! (they skip, loudly, otherwise).

mod harness;

mod files;
mod handshake;
mod kernels;
mod output;
mod processes;
mod watch;
