//! A real image registry on 127.0.0.1 for template builds: paddock-registry's own test fixture
//! (Debian's `docker-registry` with TLS from a test CA and htpasswd basic auth), shared rather
//! than copied.

#[path = "../../../../paddock-registry/tests/support/registry.rs"]
mod fixture;

pub use fixture::{run, TestRegistry, PASSWORD, USER};
