//! envd's Connect-RPC services through the whole front-end (`paddock_e2b::front`), over a
//! `SandboxService` on the fake backend: authorisation, the Connect protocol's refusals, and the
//! process and filesystem services as far as the fake agent runs them.

mod calls;
mod filesystem;
mod process;
mod support;
