//! Loopback integration tests of the egress proxy through its public API: the explicit proxy, the
//! transparent door, DNS and credential injection. Every server is one the test starts on 127.0.0.1.

#![allow(clippy::unwrap_used, reason = "tests")]

mod common;
mod dns;
mod inject;
mod limits;
mod proxy;
mod transparent;
