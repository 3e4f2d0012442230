//! Recovery after a restart (a crash, a `kill -9`, or a graceful stop): every sandbox the store says
//! is live is adopted again, or the operation a crash interrupted on it is finished or undone, and
//! storage nothing owns is reclaimed.
//!
//! Two phases. Before the API serves ([`SandboxService::begin_recovery`]): the ids to recover are
//! marked `recovering` (a request for one answers `sandbox_recovering` until it is done), and storage
//! is compared with the store (snapshots, stopped file systems and volumes without a record go;
//! checkpoints of ended sandboxes are dropped); this must finish before a request can make new storage.
//! Then, in the background ([`SandboxService::finish_recovery`]): the sandboxes, several at once, each
//! within [`RECOVER_DEADLINE`]; then the backend's garbage collection, which needs every survivor's
//! lock taken first; then the warm pools.
//!
//! What each interrupted operation becomes (its intent record says which it was; see `rollback.rs`,
//! `stop.rs`, `snapshots.rs`):
//! - **create** (record `creating`, no intent): never acknowledged; whatever was made is removed and
//!   the record ends `failed` ("its creation was interrupted"). Fork copies are created this way
//!   until the whole fork is recorded, so an interrupted fork leaves no copy.
//! - **rollback**: done again from its snapshot (which exists until the rollback is recorded):
//!   whatever of the sandbox is left is removed and it boots on a copy of the snapshot.
//! - **stop**: finished: processes end, the files are kept, the record says `stopped`.
//! - **resume** of a stopped sandbox: undone: the same, so it is stopped as it was.
//! - **fork**: no intent: the copies are `creating` (above), and the source, found frozen, is thawed
//!   when adopted like any sandbox. An older paddock's fork left an intent naming a base snapshot:
//!   the snapshot is dropped.
//! - **pause** and **checkpoint** need no intent: a sandbox found frozen is thawed for the service's
//!   connection to its agent and frozen again only if its record says paused; snapshot storage
//!   without a record is removed in the first phase.
//!
//! A sandbox whose files are gone is recorded `failed` with the reason, never dropped silently. One
//! that does not recover within the deadline is stopped, its files kept, so that a resume can try
//! again. This module does not decide how the backend adopts a sandbox (`native/adopt.rs`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream;
use futures_util::stream::StreamExt;
use paddock_runtime::agent_client::AgentClient;
use paddock_runtime::{Adoption, SandboxHandle};
use paddock_store::{IntentOp, IntentRecord, SandboxRecord, SandboxState, StoreError};
use paddock_types::{SandboxId, SnapshotId, VolumeSource};

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::error::stored_sandbox_id;
use crate::core::live::{lock, LiveSandbox, Ownership, StoredSpec};
use crate::lifecycle::states::Transition;
use crate::lifecycle::storage::drop_checkpoints_in;
use crate::{SandboxService, ServiceError};

/// How many sandboxes are recovered at once.
const RECOVER_CONCURRENCY: usize = 8;
/// The longest one sandbox's recovery may take before it is stopped (files kept) instead.
pub(crate) const RECOVER_DEADLINE: Duration = Duration::from_secs(20);
/// How long an adopted sandbox's agent has to answer the service's own connection.
const AGENT_CONNECT_DEADLINE: Duration = Duration::from_secs(5);

/// What the first phase leaves to the second.
#[derive(Debug)]
pub(crate) struct Recovery {
    records: Vec<SandboxRecord>,
    intents: Vec<IntentRecord>,
}

/// How one sandbox's recovery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recovered {
    Adopted,
    RolledBack,
    Stopped,
    Lost,
    Left,
}

impl SandboxService {
    /// The first phase (see the module docs): before the API serves.
    pub(crate) async fn begin_recovery(&self) -> Result<Recovery, ServiceError> {
        let records = self.db("list live sandboxes", |s| s.live_sandboxes()).await?;
        let intents = self.db("list intents", |s| s.list_intents()).await?;
        // A record whose id does not parse cannot be addressed through the API; `recover_one` leaves it.
        lock(&self.inner.recovering).extend(records.iter().filter_map(|r| r.id.parse::<SandboxId>().ok()));
        self.collect_snapshot_garbage().await?;
        self.collect_stopped_garbage(&intents).await?;
        self.collect_volume_garbage().await?;
        self.collect_template_garbage().await?;
        self.drop_orphaned_checkpoints().await?;
        Ok(Recovery { records, intents })
    }

    /// The second phase (see the module docs), in the background while the API serves.
    pub(crate) async fn finish_recovery(self, work: Recovery) {
        let started = Instant::now();
        let Recovery { records, intents } = work;
        let mut per_sandbox: HashMap<String, IntentRecord> = HashMap::new();
        let mut forks = Vec::new();
        for intent in intents {
            match intent.op {
                IntentOp::Fork => forks.push(intent),
                _ => {
                    if let Some(older) = per_sandbox.insert(intent.sandbox_id.clone(), intent) {
                        // Operations on one sandbox are serialized: an older one is stale.
                        self.end_intent(older.id).await;
                    }
                }
            }
        }
        let total = records.len();
        let outcomes: Vec<Recovered> = stream::iter(records)
            .map(|record| {
                let intent = per_sandbox.remove(&record.id);
                let service = self.clone();
                async move {
                    let id = record.id.clone();
                    let tenant = record.tenant.clone();
                    let outcome = match tokio::time::timeout(
                        RECOVER_DEADLINE,
                        service.recover_one(&record, intent.as_ref()),
                    )
                    .await
                    {
                        Ok(Ok(outcome)) => outcome,
                        Ok(Err(e)) => {
                            tracing::error!(sandbox_id = %id, error = %e.message, "recovering a sandbox failed");
                            service.stop_unrecovered(&id, tenant, &e.message).await
                        }
                        Err(_) => {
                            tracing::error!(sandbox_id = %id, deadline = ?RECOVER_DEADLINE, "a sandbox did not recover in time; stopping it");
                            service
                                .stop_unrecovered(&id, tenant, "it did not recover in time after a restart")
                                .await
                        }
                    };
                    if let Some(intent) = intent {
                        service.end_intent(intent.id).await;
                    }
                    lock(&service.inner.recovering).remove(id.as_str());
                    outcome
                }
            })
            .buffer_unordered(RECOVER_CONCURRENCY)
            .collect()
            .await;
        // Intents of sandboxes that are no longer live: nothing left to do but forget them.
        for intent in per_sandbox.into_values() {
            self.end_intent(intent.id).await;
        }
        for fork in forks {
            self.undo_fork(&fork).await;
        }
        let count = |what| outcomes.iter().filter(|o| **o == what).count();
        let reclaimed = self.on_backend("collect garbage", |b| b.collect_garbage()).await;
        let reclaimed = match reclaimed {
            Ok(Ok(ids)) => ids.len(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "garbage collection after recovery failed; the next start retries");
                0
            }
            Err(e) => {
                tracing::warn!(error = %e, "garbage collection after recovery failed; the next start retries");
                0
            }
        };
        tracing::info!(
            sandboxes = total,
            adopted = count(Recovered::Adopted),
            rolled_back = count(Recovered::RolledBack),
            stopped = count(Recovered::Stopped),
            lost = count(Recovered::Lost),
            reclaimed,
            ms = started.elapsed().as_millis() as u64,
            "recovery done"
        );
        self.inner.recovered.cancel();
    }

    /// Recovers one sandbox the store says is live, given the intent of the operation a crash
    /// interrupted on it, if any.
    async fn recover_one(
        &self,
        record: &SandboxRecord,
        intent: Option<&IntentRecord>,
    ) -> Result<Recovered, ServiceError> {
        let id = stored_sandbox_id(&record.id)?;
        match (intent.map(|i| i.op), record.state) {
            (Some(IntentOp::Rollback), SandboxState::Running) => {
                let intent = intent.expect("matched");
                self.redo_rollback(record, &id, intent).await
            }
            (Some(IntentOp::Stop), SandboxState::Running)
            | (Some(IntentOp::Resume), SandboxState::Creating) => {
                self.settle_stopped(record, &id, "an interrupted stop or resume")
                    .await
            }
            _ => self.adopt_one(record, &id).await,
        }
    }

    /// Takes over a sandbox that survived the restart, or records why it did not.
    async fn adopt_one(&self, record: &SandboxRecord, id: &SandboxId) -> Result<Recovered, ServiceError> {
        let adopt_id = id.clone();
        let adoption = self
            .on_backend("adopt a sandbox", move |b| b.adopt_sandbox(&adopt_id))
            .await?;
        let spec: Option<StoredSpec> = serde_json::from_str(&record.spec_json).ok();
        let build_step = record
            .labels
            .contains_key(crate::plan::template::BUILD_STEP_LABEL);
        let reason = match (adoption, spec) {
            // Its build died with the previous server: nothing will take the step's result.
            (Ok(Adoption::Alive(handle)), _) if build_step => {
                self.destroy_handle(handle).await;
                "its template build ended with the server"
            }
            (Ok(Adoption::Alive(handle)), Some(spec)) if record.state != SandboxState::Creating => {
                return self.take_over(record, handle, spec).await;
            }
            (Ok(Adoption::Alive(handle)), _) => {
                self.destroy_handle(handle).await;
                "its creation was interrupted"
            }
            (Ok(Adoption::Busy), _) => {
                tracing::warn!(sandbox_id = %record.id, "sandbox is held by another process; leaving it alone");
                return Ok(Recovered::Left);
            }
            (Ok(Adoption::Dead | Adoption::Missing), _) if record.state == SandboxState::Creating => {
                "its creation was interrupted"
            }
            (Ok(Adoption::Dead | Adoption::Missing), _) => "it was gone when the server restarted",
            (Err(e), _) => {
                tracing::warn!(sandbox_id = %record.id, error = %e, "cannot adopt sandbox");
                "it could not be re-adopted"
            }
        };
        self.mark_lost(&record.id, record.tenant.clone(), reason).await?;
        Ok(Recovered::Lost)
    }

    /// Connects to an adopted sandbox's agent, serves it on the egress proxy, re-follows its
    /// processes and freezes it again if its record says paused.
    async fn take_over(
        &self,
        record: &SandboxRecord,
        handle: SandboxHandle,
        spec: StoredSpec,
    ) -> Result<Recovered, ServiceError> {
        // The backend hands a sandbox over as it found it: frozen if it was paused, or if a crash
        // came in the middle of a snapshot or a fork. Its agent answers only thawed; a paused one is
        // frozen again below, once connected.
        let (handle, thawed) = self
            .on_backend("thaw an adopted sandbox", move |b| {
                let thawed = b.resume_sandbox(&handle);
                (handle, thawed)
            })
            .await?;
        if let Err(e) = thawed {
            tracing::warn!(sandbox_id = %record.id, error = %e, "cannot thaw an adopted sandbox");
        }
        let client =
            match tokio::time::timeout(AGENT_CONNECT_DEADLINE, AgentClient::connect(&handle.agent_socket))
                .await
            {
                Ok(Ok(client)) => client,
                failed => {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => format!("no answer within {AGENT_CONNECT_DEADLINE:?}"),
                    };
                    tracing::warn!(sandbox_id = %record.id, error = %why, "agent unreachable after restart");
                    self.destroy_handle(handle).await;
                    self.mark_lost(
                        &record.id,
                        record.tenant.clone(),
                        "agent unreachable after restart",
                    )
                    .await?;
                    return Ok(Recovered::Lost);
                }
            };
        if let Err(e) = self.attach_network(&handle, None).await {
            // Its link stays, unserved: every connection it tries is refused.
            tracing::error!(sandbox_id = %record.id, error = %e.message, "cannot serve an adopted sandbox on the egress proxy");
        }
        let owner = Ownership {
            tenant: record.tenant.clone(),
            spec,
        };
        let sb = Arc::new(LiveSandbox::new(handle.id.clone(), client, handle, owner));
        self.follow_running_processes(&sb).await;
        if record.paused {
            self.on_handle(&sb, "pause an adopted sandbox", |b, handle| {
                b.pause_sandbox(handle)
            })
            .await?
            .unwrap_or(Ok(()))
            .map_err(|e| crate::core::service::runtime_error("pause an adopted sandbox", e))?;
            sb.set_paused(true);
        }
        lock(&self.inner.live).insert(sb.id.clone(), sb);
        self.audit(AuditEntry::system(
            AuditAction::SandboxAdopt,
            record.tenant.clone(),
            Some(&record.id),
        ))
        .await?;
        Ok(Recovered::Adopted)
    }

    /// Rolls sandbox `id` back again from the snapshot of its interrupted rollback.
    async fn redo_rollback(
        &self,
        record: &SandboxRecord,
        id: &SandboxId,
        intent: &IntentRecord,
    ) -> Result<Recovered, ServiceError> {
        let spec: StoredSpec = serde_json::from_str(&record.spec_json)
            .map_err(|e| ServiceError::internal("decode a sandbox spec", &e))?;
        let snapshot_id = intent.snapshot_id.clone().unwrap_or_default();
        let sid = snapshot_id.clone();
        let snapshot = self
            .db("read a snapshot", move |s| s.get_snapshot(&sid))
            .await?
            .filter(|s| s.deleted_at_ms.is_none());
        let (Some(snapshot), Ok(parsed)) = (snapshot, snapshot_id.parse::<SnapshotId>()) else {
            self.reclaim(id).await;
            self.mark_lost(
                &record.id,
                record.tenant.clone(),
                "its rollback was interrupted and the snapshot it returned to is gone",
            )
            .await?;
            return Ok(Recovered::Lost);
        };
        tracing::info!(sandbox_id = %id, snapshot = %snapshot.id, "finishing an interrupted rollback");
        // Whatever is left of the sandbox goes (its init, a prepared copy, a half-switched volume).
        self.reclaim(id).await;
        let (handle, client) = match self.boot(id, &spec, VolumeSource::Snapshot(parsed)).await {
            Ok(booted) => booted,
            Err(e) => {
                self.mark_lost(
                    &record.id,
                    record.tenant.clone(),
                    &format!(
                        "its rollback was interrupted and restarting it failed: {}",
                        e.message
                    ),
                )
                .await?;
                return Ok(Recovered::Lost);
            }
        };
        let owner = Ownership {
            tenant: record.tenant.clone(),
            spec,
        };
        let sb = Arc::new(LiveSandbox::new(id.clone(), client, handle, owner));
        lock(&self.inner.live).insert(id.clone(), sb);
        let consumed = intent.detail["consume"].as_bool().unwrap_or(false);
        self.record_rollback(None, &record.id, &snapshot, consumed, intent.id)
            .await?;
        Ok(Recovered::RolledBack)
    }

    /// Ends whatever runs of sandbox `id`, keeps its files and records it `stopped` (a stop or resume
    /// a crash interrupted, or a sandbox that could not be recovered in time).
    async fn settle_stopped(
        &self,
        record: &SandboxRecord,
        id: &SandboxId,
        cause: &str,
    ) -> Result<Recovered, ServiceError> {
        let park_id = id.clone();
        let kept = self
            .on_backend("stop a sandbox", move |b| b.park_sandbox(&park_id))
            .await?;
        match kept {
            Ok(true) => {}
            Ok(false) => {
                self.mark_lost(
                    &record.id,
                    record.tenant.clone(),
                    &format!("{cause}: its files were gone when the server restarted"),
                )
                .await?;
                return Ok(Recovered::Lost);
            }
            Err(e) => {
                return Err(crate::core::service::runtime_error("stop a sandbox", e));
            }
        }
        let entry = AuditEntry::system(AuditAction::SandboxStop, record.tenant.clone(), Some(&record.id))
            .detail(audit::RecoveryStop {
                cause: "recovery",
                reason: cause.to_owned(),
            })
            .into_row();
        let sid = record.id.clone();
        let stopped = self
            .db("record a stop", move |s| {
                s.transaction(|tx| {
                    let stopped = audit::record(tx, Transition::Park.change(), &sid, None, &entry)?;
                    if stopped {
                        tx.set_sandbox_expiry(&sid, None)?;
                    }
                    Ok::<_, StoreError>(stopped)
                })
            })
            .await?;
        if stopped {
            tracing::info!(sandbox_id = %id, cause, "sandbox stopped by recovery; its files are kept");
        }
        Ok(Recovered::Stopped)
    }

    /// A sandbox whose recovery failed or ran out of time: stopped with its files kept if that can
    /// be done, else recorded lost.
    async fn stop_unrecovered(&self, id: &str, tenant: Option<String>, why: &str) -> Recovered {
        lock(&self.inner.live).remove(id);
        let record = {
            let sid = id.to_owned();
            self.db("read a sandbox", move |s| s.get_sandbox(&sid)).await
        };
        let (Ok(Some(record)), Ok(sandbox_id)) = (record, stored_sandbox_id(id)) else {
            return Recovered::Left;
        };
        if !record.state.is_live() {
            return Recovered::Left;
        }
        match self.settle_stopped(&record, &sandbox_id, why).await {
            Ok(outcome) => outcome,
            Err(e) => {
                tracing::error!(sandbox_id = %id, error = %e.message, "cannot stop an unrecovered sandbox");
                self.reclaim(&sandbox_id).await;
                let _ = self.mark_lost(id, tenant, why).await;
                Recovered::Lost
            }
        }
    }

    /// Undoes a fork a crash interrupted: its copies (still `creating`) were ended with the others,
    /// its source thawed when adopted; the base snapshot an older paddock's fork took is dropped.
    async fn undo_fork(&self, intent: &IntentRecord) {
        if let Some(base) = intent.snapshot_id.clone() {
            let record = self.db("read a snapshot", move |s| s.get_snapshot(&base)).await;
            if let Ok(Some(record)) = record {
                if record.deleted_at_ms.is_none() {
                    if let Err(e) = self
                        .drop_snapshot(None, &record, AuditAction::SnapshotDelete)
                        .await
                    {
                        tracing::warn!(snapshot = %record.id, error = %e.message, "cannot drop an interrupted fork's base snapshot");
                    }
                }
            }
        }
        self.end_intent(intent.id).await;
    }

    /// Removes whatever of sandbox `id` is left (no owner holds it), logging a failure.
    async fn reclaim(&self, id: &SandboxId) {
        let rid = id.clone();
        let reclaimed = self
            .on_backend("reclaim a sandbox", move |b| b.reclaim_sandbox(&rid))
            .await;
        if let Ok(Err(e)) = reclaimed {
            tracing::warn!(sandbox_id = %id, error = %e, "cannot reclaim a sandbox; gc will retry");
        }
    }

    /// Records a live sandbox `failed` (with its checkpoints dropped) for `reason`.
    pub(crate) async fn mark_lost(
        &self,
        id: &str,
        tenant: Option<String>,
        reason: &str,
    ) -> Result<(), ServiceError> {
        let entry = AuditEntry::system(AuditAction::SandboxLost, tenant, Some(id))
            .outcome("lost")
            .detail(audit::Lost {
                reason: reason.to_owned(),
            })
            .into_row();
        let (sid, reason) = (id.to_owned(), reason.to_owned());
        let dropped = self
            .db("record a lost sandbox", move |s| {
                s.transaction(|tx| {
                    let mut dropped = Vec::new();
                    if audit::record(tx, Transition::Lose.change(), &sid, Some(&reason), &entry)? {
                        dropped = drop_checkpoints_in(tx, &sid, &entry)?;
                    }
                    Ok::<_, StoreError>(dropped)
                })
            })
            .await?;
        self.free_snapshot_storage(dropped);
        lock(&self.inner.live).remove(id);
        Ok(())
    }
}
