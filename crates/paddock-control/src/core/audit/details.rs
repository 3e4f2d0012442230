//! The details audit rows carry, one type per shape, each declared once with the actions whose rows
//! carry it. A row's detail is its type serialized (`serde_json::Value` maps are sorted, so the
//! stored text and its hash depend only on the fields' values). A field is written even when it is
//! `null` unless its declaration says otherwise.
//!
//! Adding, renaming or removing a field, or letting another action carry a shape, changes the golden
//! list (`tests/golden/audit_actions.txt`): the change is reviewed as part of the contract.

use serde::Serialize;

use super::{AuditAction, Detail, DetailShape};

/// Declares detail types: `Name for [Action, ...] { field: Type, ... }` (an empty action list: a
/// part of other details, flattened into them). Each gets `Serialize` and its [`DetailShape`].
macro_rules! details {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident for [$($action:ident),* $(,)?] {
            $( $(#[$attr:meta])* $field:ident : $ty:ty ),* $(,)?
        }
    )*) => {
        $(
            $(#[doc = $doc])*
            #[derive(Debug, Clone, PartialEq, Serialize)]
            pub(crate) struct $name {
                $( $(#[$attr])* pub(crate) $field: $ty, )*
            }

            impl Detail for $name {
                const SHAPE: &'static DetailShape = &DetailShape {
                    name: stringify!($name),
                    actions: &[$(AuditAction::$action),*],
                    fields: &[$( (stringify!($field), stringify!($ty), stringify!($(#[$attr])*)) ),*],
                };
            }
        )*

        /// Every detail shape, in declaration order.
        #[cfg(test)]
        pub(crate) const SHAPES: &[&DetailShape] = &[$(<$name as Detail>::SHAPE),*];
    };
}

/// A command as rows name it: `{"argv": [...]}` or `{"shell": "..."}` (flattened into a detail).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CommandDetail {
    Argv(Vec<String>),
    Shell(String),
}

details! {
    /// No details: `{}`.
    Empty for [SandboxAdopt, SandboxPause, SandboxResume] {}

    /// A request refused (a quota, an invalid field): the error's field and message.
    Refusal for [
        SandboxCheckpoint, SandboxCreate, SandboxFork, SandboxResume, SnapshotCreate,
        SnapshotImport, TemplateBuild, VolumeCreate,
    ] {
        field: Option<String>,
        message: String,
    }

    // Sandboxes.

    /// A sandbox booted for a request: its template, what its files came from, its volumes.
    Booted for [SandboxCreate] {
        template: String,
        source: String,
        volumes: Vec<String>,
    }

    /// A sandbox claimed from a warm pool (`source`: `pool`).
    Claimed for [SandboxCreate] {
        template: String,
        source: &'static str,
    }

    /// A live sandbox's life ended: why, and the state it ended in.
    Ended for [SandboxCreate, SandboxExpire, SandboxKill, SandboxLost] {
        reason: String,
        state: &'static str,
    }

    /// A stopped sandbox killed (`from`: `stopped`).
    EndedStopped for [SandboxKill] {
        reason: &'static str,
        state: &'static str,
        from: &'static str,
    }

    /// A sandbox recorded lost by paddock itself (recovery, a warm pool's failed boot).
    Lost for [SandboxLost] {
        reason: String,
    }

    /// What stopped or paused a sandbox: `stop` (a request) or `timeout`.
    Cause for [SandboxPause, SandboxStop] {
        cause: &'static str,
    }

    /// A sandbox stopped by recovery (`cause`: `recovery`), and why.
    RecoveryStop for [SandboxStop] {
        cause: &'static str,
        reason: String,
    }

    /// A stopped sandbox booted again (`from`: `stopped`).
    Resumed for [SandboxResume] {
        from: &'static str,
    }

    /// A sandbox's new timeout.
    Timeout for [SandboxTimeout] {
        timeout_secs: u64,
    }

    /// A sandbox rolled back to a snapshot; `recovered` when recovery finished it after a restart.
    Rollback for [SandboxRollback] {
        snapshot: String,
        consumed: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        recovered: Option<bool>,
    }

    /// A sandbox's changes since a snapshot: how many entries.
    SandboxDiffed for [SandboxDiff] {
        snapshot: String,
        entries: usize,
    }

    // Snapshots.

    /// A snapshot taken: its id, kind and what it is charged.
    Captured for [SandboxCheckpoint, SnapshotCreate] {
        snapshot: String,
        kind: &'static str,
        storage_bytes: u64,
    }

    /// A fork: its copies, each charged what the sandbox held (its base and its own writes) as well
    /// as its disk limit.
    Forked for [SandboxFork] {
        copies: Vec<String>,
        base_bytes: u64,
    }

    /// A snapshot dropped (deleted, committed, consumed by a rollback).
    SnapshotRef for [SandboxCommit, SnapshotConsume, SnapshotDelete] {
        snapshot: String,
        kind: &'static str,
    }

    /// A snapshot exported (or an export that failed part way: what was sent).
    Exported for [SnapshotExport] {
        snapshot: String,
        bytes_out: u64,
        entries: Option<u64>,
        keep_setid: bool,
        setid_cleared: Option<u64>,
    }

    /// A snapshot imported.
    Imported for [SnapshotImport] {
        snapshot: String,
        bytes_in: u64,
        entries: u64,
        data_bytes: u64,
    }

    /// An import that failed: what was received.
    ImportFailed for [SnapshotImport] {
        snapshot: String,
        bytes_in: u64,
    }

    // Volumes.

    /// A volume created.
    VolumeCreated for [VolumeCreate] {
        volume: String,
        name: String,
        size_bytes: Option<u64>,
    }

    /// A volume deleted.
    VolumeDeleted for [VolumeDelete] {
        volume: String,
        name: String,
    }

    /// A volume delete refused: the sandboxes mounting it.
    VolumeInUse for [VolumeDelete] {
        volume: String,
        mounted_by: Vec<String>,
    }

    // Templates.

    /// A template built: its id and name, what from, the image's digest and how many of its
    /// layers the cache had.
    TemplateBuilt for [TemplateBuild] {
        template: String,
        name: String,
        source: String,
        digest: String,
        layers: usize,
        cached_layers: usize,
    }

    /// A build that failed: what from, and the error's code and message.
    TemplateBuildFailed for [TemplateBuild] {
        template: String,
        name: String,
        source: String,
        code: String,
        message: String,
    }

    /// A template deleted.
    TemplateDeleted for [TemplateDelete] {
        template: String,
        name: String,
    }

    /// A template delete refused: the sandboxes made from it.
    TemplateInUse for [TemplateDelete] {
        template: String,
        used_by: Vec<String>,
    }

    // Keys, tenants, secrets, networks.

    /// A key named by id (`null`: a presented key that names none).
    KeyRef for [AuthFailed, KeyRevoke] {
        key_id: Option<String>,
    }

    /// The first admin key, made at the first start (`via`: `bootstrap`).
    KeyBootstrap for [KeyCreate] {
        key_id: String,
        admin: bool,
        via: &'static str,
    }

    /// A key created by an admin.
    KeyCreated for [KeyCreate] {
        key_id: String,
        for_tenant: String,
        admin: bool,
        change_network: bool,
        approver: bool,
    }

    /// A tenant's quota set.
    TenantQuotaSet for [TenantQuota] {
        for_tenant: String,
        max_sandboxes: Option<u32>,
        max_memory_bytes: Option<u64>,
        max_cpu_millis: Option<u32>,
        max_snapshots: Option<u32>,
        max_volumes: Option<u32>,
        max_storage_bytes: Option<u64>,
        max_templates: Option<u32>,
    }

    /// A secret created (never its value).
    SecretCreated for [SecretCreate] {
        name: String,
        hosts: Vec<String>,
        headers: Vec<String>,
        query: bool,
    }

    /// A secret deleted.
    SecretDeleted for [SecretDelete] {
        name: String,
    }

    /// An approval policy set (`scope`: `tenant`, or `sandbox` for the row's sandbox): how many
    /// rules it has and a digest of the stored JSON, not the policy itself.
    PolicySet for [PolicySet] {
        scope: &'static str,
        rules: u64,
        spec_sha256: String,
        spec_bytes: u64,
    }

    /// An approval policy deleted.
    PolicyDeleted for [PolicyDelete] {
        scope: &'static str,
    }

    /// A request an approval policy refused (`scope`: whose policy; `rule`: absent for the
    /// policy's default): what it was, in one line.
    PolicyDenied for [PolicyDeny] {
        kind: &'static str,
        summary: String,
        scope: &'static str,
        rule: Option<u32>,
        reason: Option<String>,
    }

    /// A request held for a person: the approval's id, what it is (the request itself is in the
    /// approval, its digest here), and the rule that asked.
    ApprovalRequested for [ApprovalRequest] {
        approval_id: String,
        kind: &'static str,
        summary: String,
        request_sha256: String,
        scope: &'static str,
        rule: Option<u32>,
        reason: Option<String>,
        expires_at: String,
    }

    /// A person's decision (the row's key decided), or the expiry: which approval, whose request.
    ApprovalDecided for [ApprovalApprove, ApprovalReject, ApprovalExpire] {
        approval_id: String,
        kind: String,
        summary: String,
        requested_by: String,
        note: Option<String>,
    }

    /// A queue change delivered to the operator's webhook, or given up on: which approval and
    /// change, how many attempts, the last HTTP status or error.
    ApprovalWebhookSent for [ApprovalWebhook] {
        approval_id: String,
        event: String,
        delivery: String,
        attempts: u32,
        status: Option<u16>,
        error: Option<String>,
    }

    /// An approved execution asked for: what it runs and where, and the approval it waits on.
    ExecutionRequested for [ExecutionRequest] {
        execution_id: String,
        approval_id: String,
        executor: &'static str,
        description: String,
        command: Vec<String>,
        args: Vec<String>,
        template: Option<String>,
        image: Option<String>,
        session_id: Option<String>,
        task_id: Option<String>,
        timeout_secs: u64,
    }

    /// An approved execution started on its executor (the row's key: the executor's own), with
    /// who approved it.
    ExecutionStarted for [ExecutionStart] {
        execution_id: String,
        approval_id: String,
        approved_by: Option<String>,
        executor: String,
    }

    /// An approved execution ended: how, its exit code, the executor's object, its logs' size.
    ExecutionFinished for [ExecutionFinish] {
        execution_id: String,
        state: &'static str,
        exit_code: Option<i64>,
        object: Option<String>,
        logs_bytes: u64,
        logs_truncated: bool,
        message: Option<String>,
    }

    /// An execution cancelled (the row's key cancelled it), from the state it was in.
    ExecutionCancelled for [ExecutionCancel] {
        execution_id: String,
        from: String,
    }

    /// A sandbox's network policy and injected secrets set.
    NetworkPolicySet for [NetworkPolicy] {
        policy: serde_json::Value,
        secrets: Vec<String>,
    }

    /// What an egress event's first row adds to the proxy's record (a part, merged into it): one
    /// event.
    NetworkFirst for [] {
        count: u64,
    }

    /// What an aggregate row adds to the proxy's record (a part, merged into it): the repeats it
    /// folds, when the first and last came, and for connections their summed bytes.
    NetworkAggregate for [] {
        count: u64,
        aggregated: bool,
        first_ms: i64,
        last_ms: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes_up: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes_down: Option<u64>,
    }

    /// A sandbox's network audit rows held back (rate or queue), counted by `<kind>.<outcome>`.
    Suppressed for [NetworkSuppressed] {
        events: u64,
        rate_limited: serde_json::Value,
        queue_full: serde_json::Value,
        first_ms: Option<i64>,
        last_ms: i64,
        window_ms: i64,
    }

    // Connections to a sandbox's ports.

    /// Connections to a sandbox's port through one door by one key: the first (`count: 1`), or the
    /// repeats of a window with when the first and last came.
    PortConnected for [SandboxPortConnect] {
        port: u16,
        door: String,
        count: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        first_ms: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        last_ms: Option<i64>,
    }

    /// Connections to a sandbox's ports made while its rows were rate-limited (outcome
    /// `suppressed`), counted over a window.
    PortsSuppressed for [SandboxPortConnect] {
        count: u64,
        first_ms: i64,
        last_ms: i64,
    }

    // Files.

    /// A path (a listing, a directory made).
    FilePath for [FileList, FileMkdir] {
        path: String,
    }

    /// A path and whether the operation recursed (a removal, a watch).
    FilePathRecursive for [FileRemove, FileWatch] {
        path: String,
        recursive: bool,
    }

    /// A file read.
    FileRead for [FileRead] {
        path: String,
        bytes_out: u64,
    }

    /// A file written.
    FileWritten for [FileWrite] {
        path: String,
        bytes_in: u64,
    }

    /// A rename.
    FileRenamed for [FileRename] {
        from: String,
        to: String,
    }

    /// A tar archive of a path made (by the in-sandbox `tar` with this pid).
    TarDownload for [FileTarDownload] {
        path: String,
        pid: u32,
    }

    /// A tar archive unpacked at a path.
    TarUpload for [FileTarUpload] {
        path: String,
        pid: u32,
        bytes_in: u64,
    }

    // Code contexts and cells.

    /// A code context created, restarted or removed (`op`), with its kernel's pid once started.
    CodeContextChange for [CodeContext] {
        op: &'static str,
        context: String,
        language: String,
        pid: Option<u32>,
    }

    /// A cell about to run: its context, the code's size and SHA-256 (not the code itself), and
    /// the names of its own variables (not their values).
    CodeCell for [CodeRun] {
        context: String,
        language: String,
        code_bytes: u64,
        code_sha256: String,
        timeout_ms: Option<u64>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        env: Vec<String>,
    }

    // Front-ends.

    /// An MCP tool call as a whole (the operations it made write their own rows): the tool and its
    /// arguments (as given when their JSON is small, else only their size and SHA-256); the row's
    /// outcome says how it ended (`ok`, `cancelled` or the failure's code).
    ToolCall for [McpCall] {
        tool: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        arguments: Option<serde_json::Value>,
        arguments_bytes: u64,
        arguments_sha256: String,
    }

    // Processes.

    /// A process about to start: its command, exec id and settings.
    ProcessStarted for [ProcessStart] {
        #[serde(flatten)]
        command: CommandDetail,
        exec_id: String,
        cwd: Option<String>,
        user: String,
        background: bool,
        pty: bool,
        tag: Option<String>,
        /// The approval it runs under (absent when no policy asked).
        #[serde(skip_serializing_if = "Option::is_none")]
        approval_id: Option<String>,
    }

    /// What an exit row repeats of its process, when known: the exec id of its start row, and the
    /// command the agent reports (a part of the exit details below).
    ProcessRef for [] {
        #[serde(skip_serializing_if = "Option::is_none")]
        exec_id: Option<String>,
        #[serde(flatten)]
        command: Option<CommandDetail>,
    }

    /// How a process ended, as its exit event says (a part of the exit details below).
    ExitFields for [] {
        exit_code: i32,
        signal: Option<i32>,
        timed_out: bool,
        duration_ms: u64,
        cpu_time_us: u64,
        max_rss_kib: u64,
    }

    /// A process exited.
    ProcessExited for [ProcessExit] {
        pid: u32,
        #[serde(flatten)]
        exit: ExitFields,
        bytes_in: u64,
        bytes_out: u64,
        #[serde(flatten)]
        process: ProcessRef,
    }

    /// A process whose sandbox ended under it (outcome `lost`).
    ProcessLost for [ProcessExit] {
        pid: u32,
        duration_ms: u64,
        bytes_in: u64,
        bytes_out: u64,
        #[serde(flatten)]
        process: ProcessRef,
    }

    /// A process that exited while the server was down, recorded after the restart.
    ProcessExitedWhileDown for [ProcessExit] {
        pid: u32,
        #[serde(flatten)]
        exit: ExitFields,
        recorded_after_restart: bool,
        #[serde(flatten)]
        process: ProcessRef,
    }

    /// A process whose spawn failed after its start row (`spawned`: false).
    ProcessNotSpawned for [ProcessExit] {
        exec_id: String,
        spawned: bool,
        message: String,
    }

    /// A re-attach to a process.
    ProcessAttached for [ProcessAttach] {
        pid: u32,
        follow: bool,
    }

    /// A signal sent to a process (or its tree).
    ProcessSignalled for [ProcessKill, ProcessSignal] {
        pid: u32,
        signal: i32,
    }

    /// What a process changed in its sandbox's files (`paths`: at most the first 100).
    ProcessDiffed for [ProcessDiff] {
        pid: u32,
        added: u64,
        modified: u64,
        deleted: u64,
        bytes_added: u64,
        bytes_deleted: u64,
        truncated: bool,
        paths: Vec<DiffPath>,
    }

    /// A process's diff that could not be taken.
    ProcessDiffFailed for [ProcessDiff] {
        pid: u32,
        message: String,
    }

    /// One changed path of a process's diff (a part of [`ProcessDiffed`]).
    DiffPath for [] {
        path: String,
        change: &'static str,
        size: Option<u64>,
    }
}

impl From<paddock_types::api::ExitInfo> for ExitFields {
    fn from(e: paddock_types::api::ExitInfo) -> Self {
        Self {
            exit_code: e.exit_code,
            signal: e.signal,
            timed_out: e.timed_out,
            duration_ms: e.duration_ms,
            cpu_time_us: e.cpu_time_us,
            max_rss_kib: e.max_rss_kib,
        }
    }
}
