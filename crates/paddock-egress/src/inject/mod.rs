//! Credential injection: the sandbox holds placeholders; the proxy substitutes real values where each
//! secret's binding allows (named header fields, optionally the query string) in requests to the
//! hosts it is bound to, intercepting TLS for those hosts only (with a per-sandbox CA the sandbox
//! trusts), and refuses requests whose target is not the intercepted host.

mod ca;
mod intercept;
mod request;
mod secret;

pub(crate) use ca::SandboxCa;
pub use ca::SandboxCaKey;
pub(crate) use intercept::intercept;
pub(crate) use secret::SecretSet;
pub use secret::{
    BoundHeader, Secret, SecretBinding, SecretError, SecretName, DEFAULT_HEADER, MAX_BOUND_HEADERS,
    PLACEHOLDER_PREFIX,
};
