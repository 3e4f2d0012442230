//! The tools of a sandbox's saved states beyond `checkpoint` and `rollback` (in `steps.rs`): take a
//! named snapshot, list and delete snapshots, keep a step (`commit` drops its checkpoint), and fork
//! a sandbox into copies that start from its files. Each a thin translation onto the service, as
//! in `tools.rs`.
//!
//! What it does not do: export or import snapshots, or create a sandbox from one (the `/v1` API
//! does); list more than one page of snapshots (it says when there are more).

use paddock_types::api::{CreateSnapshotRequest, ForkRequest, ListSnapshotsQuery, SnapshotInfo};
use paddock_types::SnapshotId;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{tool, tool_router, Json, RoleServer};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::sandboxes::{summary, SandboxArgs, SandboxSummary, DEFAULT_SANDBOX_TIMEOUT_SECS};
use crate::tools::{failure, sandbox_id, wire_name};
use crate::PaddockMcp;

/// The most snapshots `snapshot_list` returns.
pub const MAX_LISTED_SNAPSHOTS: u32 = 100;

/// `snapshot_create`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotCreateArgs {
    /// The sandbox.
    pub sandbox_id: String,
    /// A name to recognise the snapshot by (at most 256 bytes).
    #[serde(default)]
    pub name: Option<String>,
}

/// A snapshot, as the tools report it.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotSummary {
    /// Its id: pass it to `rollback` as `checkpoint_id` to return its sandbox's files to it.
    pub snapshot_id: String,
    /// The sandbox it was taken of (absent for an imported one).
    pub sandbox_id: Option<String>,
    /// `snapshot` (kept until deleted) or `checkpoint` (dropped by `commit`, used up by a
    /// `rollback` without `checkpoint_id`).
    pub kind: String,
    /// Its name.
    pub name: Option<String>,
    /// When it was taken (RFC 3339).
    pub created_at: String,
}

/// `snapshot_list`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotListArgs {
    /// Only the snapshots of this sandbox (default: all of yours).
    #[serde(default)]
    pub sandbox_id: Option<String>,
}

/// `snapshot_delete`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotDeleteArgs {
    /// The snapshot or checkpoint (from `snapshot_create`, `checkpoint` or `snapshot_list`).
    pub snapshot_id: String,
}

/// `snapshot_delete`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotDeleted {
    /// The snapshot removed (its storage is freed).
    pub snapshot_id: String,
}

/// `snapshot_list`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SnapshotList {
    /// The snapshots and checkpoints, in id order (at most 100).
    pub snapshots: Vec<SnapshotSummary>,
    /// Whether there were more.
    pub truncated: bool,
}

/// `commit`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Committed {
    /// The sandbox, whose files stay as they are.
    pub sandbox_id: String,
    /// The checkpoint dropped.
    pub checkpoint_id: String,
}

/// `sandbox_fork`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxForkArgs {
    /// The sandbox to copy.
    pub sandbox_id: String,
    /// How many copies (1-100, default 1).
    #[serde(default)]
    pub count: Option<u32>,
    /// Seconds until each copy ends by itself (default 600).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// `sandbox_fork`'s result.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Forked {
    /// The new sandboxes: pass their ids to the other tools.
    pub sandboxes: Vec<SandboxSummary>,
}

fn snapshot_summary(info: SnapshotInfo) -> SnapshotSummary {
    SnapshotSummary {
        snapshot_id: info.id,
        sandbox_id: info.sandbox_id,
        kind: wire_name(info.kind),
        name: info.name,
        created_at: info.created_at,
    }
}

#[tool_router(router = snapshots_router, vis = "pub(crate)")]
impl PaddockMcp {
    #[tool(
        name = "snapshot_create",
        description = "Save a sandbox's files as a named snapshot, kept until deleted (unlike a checkpoint, commit does not drop it and rollback does not use it up). Return to it with rollback, passing its snapshot_id as checkpoint_id. Running processes are not saved.",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn snapshot_create(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SnapshotCreateArgs>,
    ) -> Result<Json<SnapshotSummary>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let request = CreateSnapshotRequest {
            name: args.name,
            ..CreateSnapshotRequest::default()
        };
        let info = self
            .service
            .create_snapshot(&p, &id, request)
            .await
            .map_err(failure)?;
        Ok(Json(snapshot_summary(info)))
    }

    #[tool(
        name = "snapshot_list",
        description = "List your snapshots and checkpoints (of one sandbox when sandbox_id is given), at most 100.",
        annotations(read_only_hint = true, idempotent_hint = true)
    )]
    async fn snapshot_list(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SnapshotListArgs>,
    ) -> Result<Json<SnapshotList>, String> {
        let p = self.principal(&ctx)?;
        let sandbox = args
            .sandbox_id
            .as_deref()
            .map(sandbox_id)
            .transpose()?
            .map(|id| id.as_str().to_owned());
        let query = ListSnapshotsQuery {
            sandbox,
            limit: Some(MAX_LISTED_SNAPSHOTS),
            ..ListSnapshotsQuery::default()
        };
        let list = self.service.list_snapshots(&p, query).await.map_err(failure)?;
        Ok(Json(SnapshotList {
            snapshots: list.snapshots.into_iter().map(snapshot_summary).collect(),
            truncated: list.next_cursor.is_some(),
        }))
    }

    #[tool(
        name = "snapshot_delete",
        description = "Delete one of your snapshots or checkpoints and free its storage. A sandbox cannot roll back to it afterwards.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = false)
    )]
    async fn snapshot_delete(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SnapshotDeleteArgs>,
    ) -> Result<Json<SnapshotDeleted>, String> {
        let p = self.principal(&ctx)?;
        let id = args
            .snapshot_id
            .parse::<SnapshotId>()
            .map_err(|e| format!("invalid_request: snapshot_id: {e}"))?;
        self.service.delete_snapshot(&p, &id).await.map_err(failure)?;
        Ok(Json(SnapshotDeleted {
            snapshot_id: args.snapshot_id,
        }))
    }

    #[tool(
        name = "commit",
        description = "Keep the changes made since the sandbox's newest checkpoint and drop that checkpoint (the step succeeded). Fails with snapshot_not_found when the sandbox has no checkpoint.",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn commit(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxArgs>,
    ) -> Result<Json<Committed>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let dropped = self.service.commit(&p, &id).await.map_err(failure)?;
        Ok(Json(Committed {
            sandbox_id: args.sandbox_id,
            checkpoint_id: dropped.id,
        }))
    }

    #[tool(
        name = "sandbox_fork",
        description = "Copy a running sandbox: count new sandboxes (1-100, default 1) start with copies of its files (not its processes), each with its own id, to try alternatives side by side. The source is unchanged. Each copy ends by itself after timeout_secs (default 600).",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn sandbox_fork(
        &self,
        ctx: RequestContext<RoleServer>,
        Parameters(args): Parameters<SandboxForkArgs>,
    ) -> Result<Json<Forked>, String> {
        let p = self.principal(&ctx)?;
        let id = sandbox_id(&args.sandbox_id)?;
        let request = ForkRequest {
            count: args.count.unwrap_or(1),
            labels: None,
            timeout_secs: Some(args.timeout_secs.unwrap_or(DEFAULT_SANDBOX_TIMEOUT_SECS)),
        };
        let forked = self
            .service
            .fork_sandbox(&p, &id, request)
            .await
            .map_err(failure)?;
        Ok(Json(Forked {
            sandboxes: forked.sandboxes.into_iter().map(summary).collect(),
        }))
    }
}
