//! Sandbox networks through the service: the egress proxy's policy, injection and bounds, and the
//! audit rows a flooding sandbox adds.

mod audit;
mod egress;
mod reachable;
