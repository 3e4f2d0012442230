//! paddock's egress proxy: the pure policy decision and the mechanism that enforces it.
pub mod policy;
pub mod sniff;
