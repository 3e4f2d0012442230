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

mod core;
mod lifecycle;
mod ops;
mod plan;

pub use paddock_runtime::ExportOptions;

pub use crate::core::approvals::signature::{sign_webhook, verify_webhook};
pub use crate::core::config::{
    ApprovalsConfig, CallbackKey, DebianBase, ExecutionsConfig, ImagesConfig, NetworkAuditConfig,
    NetworkConfig, PortsConfig, RecipeBuild, ServiceConfig, TemplateConfig, DEFAULT_COLLECT_BUDGET,
};
pub use crate::core::error::ServiceError;
pub use crate::core::executor::{
    BoxFuture, CappedLogs, ExecutionSpec, Executor, ExecutorError, ExecutorStatus, Finished, Outcome,
};
pub use crate::core::output::collect::{CollectedOutput, COLLECT_LIMIT};
pub use crate::core::output::events::{ExecOutput, OutputStream};
pub use crate::core::output::streams::{ByteStream, ExecStream, FileDownload, WatchStream};
pub use crate::core::ports::PortStream;
pub use crate::core::principal::Principal;
pub use crate::core::service::SandboxService;
pub use crate::ops::admin::ADMIN_TENANT;
pub use crate::ops::approvals::{ApprovalStream, WebhookDelivery};
pub use crate::ops::calls::{ToolCallOutcome, ToolCallRecord, INLINE_ARGUMENTS};
pub use crate::ops::code::{CodeStream, CollectedCell};
pub use crate::ops::files::accounts::{AccountUser, SandboxAccounts};
pub use crate::ops::files::WriteFileOptions;
pub use crate::ops::policies::PolicyScope;
pub use crate::ops::ports::PortDoor;
pub use crate::plan::code::{code_language, code_languages};
pub use crate::plan::create::host_cpus;
