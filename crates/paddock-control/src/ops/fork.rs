//! Forks: N new sandboxes from one snapshot of a sandbox, booted concurrently, all recorded in one
//! transaction (or none: copies that booted are killed when any fails).

use std::collections::BTreeMap;

use paddock_runtime::fault;
use paddock_store::{IntentOp, NewAuditEntry, QuotaRequest, SnapshotKind, StoreError};
use paddock_types::api::{ErrorCode, ForkRequest, ForkResult};
use paddock_types::SandboxId;
use paddock_types::{SnapshotId, VolumeSource};

use crate::core::access::info_from_record;
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::time::now_ms;
use crate::lifecycle::capture::Capture;
use crate::lifecycle::states::Transition;
use crate::plan::labels::check_snapshot_labels;
use crate::{Principal, SandboxService, ServiceError};

/// The most copies one fork makes.
pub const MAX_FORKS: u32 = 100;

impl SandboxService {
    /// Forks a sandbox into `count` new ones that start as copies of its files.
    pub async fn fork_sandbox(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: ForkRequest,
    ) -> Result<ForkResult, ServiceError> {
        if req.count == 0 || req.count > MAX_FORKS {
            return Err(ServiceError::invalid(
                "count",
                format!("count must be between 1 and {MAX_FORKS}"),
            ));
        }
        if let Some(labels) = &req.labels {
            check_snapshot_labels(labels)?;
        }
        let sb = self.owned_live(p, id).await?;
        let source = self.owned_record(p, id).await?;
        // Every copy counts as a new sandbox of the source's size (and starts from at least the
        // source's base): a fork the quota cannot take is refused before anything is made.
        let spec = sb.spec();
        let copy = QuotaRequest {
            sandboxes: 1,
            memory_bytes: source.memory_bytes,
            cpu_millis: u64::from(source.cpu_millis),
            storage_bytes: crate::core::quota::sandbox_storage(&spec.limits, source.base_bytes),
            ..QuotaRequest::default()
        };
        let base_snapshot = QuotaRequest {
            snapshots: 1,
            storage_bytes: source.base_bytes,
            ..QuotaRequest::default()
        };
        self.precheck_quota(
            p,
            AuditAction::SandboxFork,
            Some(id),
            copy.times(u64::from(req.count)).plus(base_snapshot),
        )
        .await?;
        // The base snapshot is named in the fork's intent before it exists: a crash at any point
        // after leaves nothing of it (recovery drops it, or collects its unrecorded storage).
        let snapshot = SnapshotId::from_random(rand::random());
        let intent = self
            .begin_intent(id, IntentOp::Fork, Some(snapshot.as_str()), serde_json::json!({}))
            .await?;
        let base = match self
            .take_snapshot(
                p,
                &sb,
                Capture {
                    id: snapshot.clone(),
                    kind: SnapshotKind::Snapshot,
                    name: Some(format!("fork of {id}")),
                    labels: BTreeMap::new(),
                },
                AuditAction::SandboxFork,
            )
            .await
        {
            Ok(base) => base,
            Err(e) => {
                self.end_intent(intent).await;
                return Err(e);
            }
        };
        fault::point("fork.base_taken");
        let copied = self
            .fork_copies(p, &source, &spec, &req, &snapshot, base.storage_bytes)
            .await;
        let copies = match copied {
            Ok(copies) => copies,
            Err(e) => {
                self.drop_snapshot(Some(p), &base, AuditAction::SnapshotDelete)
                    .await?;
                self.end_intent(intent).await;
                return Err(e);
            }
        };
        fault::point("fork.copies_booted");
        // Every copy moves to `running` with its row, and the base goes, in one transaction with the
        // end of the intent: a crash before it leaves no copy, after it every one.
        let drop_row = AuditEntry::ok(p, AuditAction::SnapshotDelete, Some(id))
            .detail(audit::SnapshotRef {
                snapshot: base.id.clone(),
                kind: base.kind.as_str(),
            })
            .into_row();
        let (ids, base_id) = (copies.clone(), base.id.clone());
        // The copies' records come back from the same transaction (what the caller is answered
        // with), rather than from one store call each after it.
        let committed = self
            .db("record a fork", move |s| {
                s.transaction(|tx| {
                    for (copy, entry) in &ids {
                        let started =
                            audit::record(tx, Transition::Boot.change(), copy.as_str(), None, entry)?;
                        if !started {
                            return Ok(None);
                        }
                    }
                    if tx.mark_snapshot_deleted(&base_id, now_ms())? {
                        audit::append(tx, &drop_row)?;
                    }
                    tx.end_intent(intent)?;
                    let mut records = Vec::with_capacity(ids.len());
                    for (copy, _) in &ids {
                        records.extend(tx.get_sandbox(copy.as_str())?);
                    }
                    Ok::<_, StoreError>(Some(records))
                })
            })
            .await;
        let records = match committed {
            Ok(Some(records)) => records,
            failed => {
                for (copy, _) in &copies {
                    let _ = self.kill_sandbox(p, copy).await;
                }
                self.drop_snapshot(Some(p), &base, AuditAction::SnapshotDelete)
                    .await?;
                self.end_intent(intent).await;
                return Err(failed.err().unwrap_or_else(|| {
                    ServiceError::new(
                        ErrorCode::SandboxNotRunning,
                        "a copy ended before the fork was recorded",
                    )
                }));
            }
        };
        self.free_snapshot_storage(vec![snapshot]);
        let sandboxes: Vec<_> = records.iter().map(info_from_record).collect();
        if sandboxes.len() != copies.len() {
            return Err(ServiceError::internal(
                "read a fork's copies",
                &format!("{} of {} copies recorded", sandboxes.len(), copies.len()),
            ));
        }
        Ok(ForkResult { sandboxes })
    }

    /// Boots `req.count` copies of sandbox `source` on `snapshot`, recorded `creating` (all or none:
    /// a failure ends those already made); each with its pending `sandbox.create` row.
    async fn fork_copies(
        &self,
        p: &Principal,
        source: &paddock_store::SandboxRecord,
        spec: &crate::core::live::StoredSpec,
        req: &ForkRequest,
        snapshot: &SnapshotId,
        base_bytes: u64,
    ) -> Result<Vec<(paddock_types::SandboxId, NewAuditEntry)>, ServiceError> {
        let labels = req.labels.clone().unwrap_or_else(|| source.labels.clone());
        // The copies get the same network policy and secrets (each with its own link and CA).
        let (network, secrets) = match self.network_of(&source.id).await? {
            Some((policy, secrets)) => (Some(policy), secrets),
            None => (None, Vec::new()),
        };
        let request = paddock_types::api::CreateSandboxRequest {
            network,
            secrets,
            template: Some(spec.template.clone()),
            limits: paddock_types::api::LimitsRequest {
                memory: spec.limits.memory,
                cpus: spec.limits.cpus,
                pids: spec.limits.pids,
                disk: spec.limits.disk,
            },
            env: spec.env.clone(),
            workdir: spec.workdir.clone(),
            user: Some(spec.user.clone()),
            labels,
            timeout_secs: req.timeout_secs,
            snapshot: None,
            on_timeout: Some(spec.on_timeout),
            audit_exec_diff: spec.audit_exec_diff,
            public_ports: spec.public_ports,
            // Volumes are shared, not copied: the copies mount the same ones.
            volumes: spec
                .volumes
                .iter()
                .map(|v| paddock_types::api::VolumeMountRequest {
                    volume: v.volume.to_string(),
                    path: v.path.to_string(),
                    read_only: v.read_only,
                })
                .collect(),
        };
        // One plan per copy (a networked copy gets its own CA), then every copy recorded in one
        // transaction, so that their boots start together: recorded one by one, each waiting for the
        // store in turn, they reached the backend over 15-20 ms, and their volume snapshots spread
        // over more transaction commits.
        let mut plans = Vec::with_capacity(req.count as usize);
        for _ in 0..req.count {
            plans.push(self.plan_request(p, request.clone()).await?);
        }
        let ids = self.record_creating(p, &plans, base_bytes).await?;
        // The copies boot concurrently: their volume snapshots join the same btrfs transaction commits
        // and their setups overlap each other's waits.
        use futures_util::stream::{self, StreamExt};
        let results: Vec<Result<_, ServiceError>> = stream::iter(ids.into_iter().zip(plans))
            .map(|(id, plan)| self.boot_record(p, id, plan, VolumeSource::Snapshot(snapshot.clone())))
            .buffered(FORK_CONCURRENCY)
            .collect()
            .await;
        let mut created = Vec::with_capacity(results.len());
        let mut failure = None;
        for result in results {
            match result {
                Ok(copy) => created.push(copy),
                Err(e) => failure = failure.or(Some(e)),
            }
        }
        if let Some(e) = failure {
            // All or nothing: a fork that cannot make every copy makes none.
            for (copy, _) in &created {
                let _ = self.kill_sandbox(p, copy).await;
            }
            return Err(e);
        }
        Ok(created)
    }
}

/// How many copies of a fork boot at once.
pub(crate) const FORK_CONCURRENCY: usize = 16;
