//! Credential injection: the sandbox holds placeholders, the proxy substitutes real values in the
//! HTTP headers of requests to the hosts each secret is bound to, intercepting TLS for those hosts
//! only (with a per-sandbox CA the sandbox trusts).

mod ca;
mod intercept;
mod secret;

pub(crate) use ca::SandboxCa;
pub use ca::SandboxCaKey;
pub(crate) use intercept::intercept;
pub(crate) use secret::SecretSet;
pub use secret::{Secret, SecretError, SecretName, PLACEHOLDER_PREFIX};
