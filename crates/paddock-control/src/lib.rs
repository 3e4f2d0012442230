//! `SandboxService`: the one API every front-end calls (REST now; E2B and MCP later), so the same
//! checks, quotas and audit rows apply whichever door a request came through.
//!
//! It owns: authentication (API keys → [`Principal`]), tenant isolation (another tenant's sandbox
//! is indistinguishable from a missing one), quotas, the sandbox lifecycle (create, claim from a warm
//! pool, timeouts and the reaper, kill, recovery after a restart), processes (exec, streams, stdin,
//! signals, re-attach), files, snapshots, named volumes, the hash-chained audit log and the metrics.
//!
//! It does not: speak HTTP (`paddock-api`), run SQL (`paddock-store`), or set up sandboxes
//! (`paddock-runtime`).

mod admin;
mod backend;
mod collect;
mod config;
mod error;
mod exec;
mod exec_diff;
mod exec_restart;
mod files;
mod lifecycle;
mod live;
mod metrics;
mod network;
mod network_audit;
mod paging;
mod principal;
mod quota;
mod recovery;
mod rollback;
mod sandboxes;
mod service;
mod signals;
mod snapshot_transfer;
mod snapshots;
mod stop;
mod streams;
mod volumes;
mod watch;

pub use admin::ADMIN_TENANT;
pub use collect::{CollectedOutput, COLLECT_LIMIT};
pub use config::{NetworkAuditConfig, ServiceConfig, TemplateConfig, DEFAULT_COLLECT_BUDGET};
pub use error::ServiceError;
pub use exec::stream_bytes;
pub use files::WriteFileOptions;
pub use network::NetworkConfig;
pub use paddock_runtime::ExportOptions;
pub use principal::Principal;
pub use service::SandboxService;
pub use streams::{ByteStream, ExecStream, FileDownload, WatchStream};
