//! The E2B-compatible front-end: what E2B's official SDKs (`e2b` on PyPI and npm) send, translated
//! onto [`paddock_control::SandboxService`], so a program written for E2B's cloud drives paddock when
//! only its environment variables change.
//!
//! Three doors share one listener with the `/v1` API ([`front`] picks one per request):
//! - **sandbox traffic**: a request naming a sandbox (the `E2b-Sandbox-Id` and `E2b-Sandbox-Port`
//!   headers, or a `Host` of the form `<port>-<sandbox id>.<domain>`) goes to that sandbox: port
//!   49983 is envd's protocol ([`envd`]: Connect-RPC process and filesystem services, `/files`,
//!   `/health`, `/envs`), answered here from the service; port 49999 is the code interpreter's
//!   server ([`interpreter`]: `/execute`, `/contexts`) on the service's code contexts; any other port
//!   is proxied into the
//!   sandbox's network namespace. Authorised by the sandbox's access tokens ([`tokens`]), not by an
//!   API key (the SDKs send none there).
//! - **E2B's control plane** ([`control`]): `/sandboxes`, `/v2/sandboxes`, `/snapshots`, `/templates`,
//!   authorised by `X-API-KEY` (a paddock key, in E2B's `e2b_<hex>` spelling or paddock's own).
//! - everything else: the `/v1` router it was given.
//!
//! It does not: implement any operation itself (each handler translates its request into service
//! calls, so tenants, quotas, audit rows, network policy and snapshots behave as through `/v1`), hold
//! state of its own beyond the key its tokens are derived from, or serve E2B's template builds,
//! secrets and volumes APIs (COMPATIBILITY.md lists every route and RPC with its status).

pub mod control;
pub mod envd;
mod error;
mod front;
pub mod interpreter;
pub mod ports;
mod state;
mod target;
pub mod tokens;

pub use error::{ConnectCode, ConnectError, E2bError, ProxyError};
pub use front::{front, front_with};
pub use state::{E2bConfig, E2bState};
pub use target::{SandboxTarget, ENVD_PORT, SANDBOX_ID_HEADER, SANDBOX_PORT_HEADER};

/// The envd version paddock reports: at or above every feature gate of the SDKs (0.6.4), so none of
/// their features is switched off (E2B's own envd reports 0.6.13).
pub const ENVD_VERSION: &str = "0.6.13";
