//! The control plane's wire model: the JSON bodies of the REST API (`paddock-api`), which the service
//! (`paddock-control`) takes and returns and the CLI client (`paddock sandbox ...`) sends and reads.
//!
//! These types are a contract: `/openapi.json` is generated from them and frozen by a golden test, and
//! COMPATIBILITY.md says how they may evolve (fields are only ever added, optional, with defaults).
//! Requests refuse unknown fields so a typo is an error, not a silently ignored option.

mod approvals;
mod audit;
mod code;
mod cursor;
mod error;
mod exec;
mod executions;
mod files;
mod keys;
mod lists;
mod network;
mod policies;
mod sandboxes;
mod snapshots;
mod templates;
mod volumes;

pub use approvals::{
    ApprovalEvent, ApprovalInfo, ApprovalKind, ApprovalList, ApprovalState, DecideApprovalRequest,
    ListApprovalsQuery,
};
pub use audit::{AuditQuery, AuditRecord, AuditVerification, BrokenAuditRow};
pub use code::{
    CodeError, CodeEvent, CodeResult, CodeRunResult, CodeStatus, ContextInfo, ContextList, ContextState,
    CreateContextRequest, RunCodeRequest,
};
pub use error::{ApiErrorBody, ErrorCode};
pub use exec::{
    AttachQuery, ExecEvent, ExecRequest, ExecResult, ExitInfo, KillRequest, ProcessCommand, ProcessInfo,
    PtySizeBody, SignalRequest, StreamData, StreamDataError,
};
pub use executions::{
    CreateExecutionRequest, ExecutionInfo, ExecutionList, ExecutionState, ListExecutionsQuery,
};
pub use files::{
    FileEntry, FileKindBody, FileList, MkdirRequest, RenameRequest, WatchEvent, WatchEventKind, WrittenFile,
};
pub use keys::{CreateKeyRequest, CreatedKey, KeyInfo, TenantInfo, TenantQuotaBody, TenantUsageBody};
pub use lists::{AuditPage, KeyList, ProcessList, TenantList};
pub use network::{
    CreateSecretRequest, NetworkEvent, SandboxNetworkInfo, SecretInfo, SecretList, SetNetworkRequest,
};
pub use policies::{ApprovalPolicyInfo, SetApprovalPolicyRequest};
pub use sandboxes::{
    CreateSandboxRequest, LimitsRequest, ListSandboxesQuery, OnTimeout, SandboxInfo, SandboxList,
    SandboxStateBody, SandboxUsageBody, SetTimeoutRequest,
};
pub use snapshots::{
    ChangeBody, CreateSnapshotRequest, DiffEntryBody, DiffQuery, DiffResult, ExportSnapshotQuery,
    ForkRequest, ForkResult, ImportSnapshotQuery, ListSnapshotsQuery, RollbackRequest, SnapshotInfo,
    SnapshotKindBody, SnapshotList,
};
pub use templates::{
    BuildTemplateRequest, ImportTemplateQuery, ReadyCheck, TemplateBuildEvent, TemplateInfo, TemplateLayer,
    TemplateList, TemplateStart,
};
pub use volumes::{
    CreateVolumeRequest, ListVolumesQuery, VolumeInfo, VolumeList, VolumeMountInfo, VolumeMountRequest,
};
