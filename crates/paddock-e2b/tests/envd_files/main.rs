//! envd's `/files` and `/envs`, driven through the front-end's router (`paddock_e2b::front`) over a
//! service on the fake backend, as the SDKs send them: `E2b-Sandbox-Id` / `E2b-Sandbox-Port`
//! headers, the envd token or a URL signature.

mod auth;
mod fixture;
mod refusals;
mod transfer;
