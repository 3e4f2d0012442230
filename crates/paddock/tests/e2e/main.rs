//! The end-to-end suite, one test binary: each module is an area of paddock's behaviour, tried
//! against the real binary, backend and service, and the module paths read as its specification
//! (`api::exec::exec_stdin`). Every test that makes sandboxes starts with the fixture in `support`
//! (`TestEnv::new`, or the API harness), which fails unless it runs as root: CI does.

mod api;
mod approvals;
mod attacks;
mod cli;
mod crash;
mod e2b;
mod load;
mod mcp;
mod network;
mod ports;
mod runtime;
mod snapshot_transfer;
mod support;
