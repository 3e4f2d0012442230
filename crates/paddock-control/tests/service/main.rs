//! The control plane driven without root: `SandboxService` on the fake backend
//! (`paddock_runtime::fake`) and an in-memory store. Nothing here touches cgroups, btrfs, mounts or
//! namespaces, so these tests run as any user; what only a real kernel can show (isolation, limits,
//! real programs) stays in the end-to-end suite (`crates/paddock/tests/`).
//!
//! One binary, modules by area; every test builds its own service (`fixture.rs`) and checks the
//! audit chain at its end.

mod admin;
mod approvals;
mod audit;
mod executions;
mod files;
mod fixture;
mod lifecycle;
mod network;
mod policies;
mod pools;
mod ports;
mod processes;
mod quotas;
mod restart;
mod snapshots;
mod tenancy;
mod validation;
mod volumes;
