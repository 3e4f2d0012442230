//! The end-to-end suite, one test binary: each module is an area of paddock's behaviour, tried
//! against the real binary, backend and service.

mod api;
mod attacks;
mod cli;
mod crash;
mod load;
mod network;
mod runtime;
mod snapshot_transfer;
mod support;
