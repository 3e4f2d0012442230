//! Forks: N new sandboxes whose volumes are snapshotted straight from a sandbox's own, held frozen
//! from before the copies are recorded until they have booted, all recorded in one transaction (or
//! none: copies that booted are killed when any fails). There is no base snapshot in between: its
//! commit (about 10 ms on a loop-mounted pool) came before any copy's, and the copies' snapshots
//! share their commits.
//!
//! What it does not do: hold the sandbox frozen for longer than the copies' boots, or copy its
//! memory (a copy's processes start afresh, as after a power cut at the fork's instant).

use paddock_runtime::fault;
use paddock_store::{NewAuditEntry, QuotaRequest, StoreError};
use paddock_types::api::{ErrorCode, ForkRequest, ForkResult};
use paddock_types::SandboxId;
use paddock_types::VolumeSource;

use crate::core::access::info_from_record;
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::backend::HandleGuard;
use crate::core::live::LiveSandbox;
use crate::lifecycle::states::Transition;
use crate::plan::labels::check_snapshot_labels;
use crate::{Principal, SandboxService, ServiceError};

/// The most copies one fork makes.
pub const MAX_FORKS: u32 = 100;

/// A fork's source, its handle locked (no pause, resume, snapshot, rollback, stop or delete of it
/// comes in between) and its processes frozen while its copies are made.
struct Frozen {
    guard: HandleGuard,
    /// Frozen before the fork took the handle (a pause that landed between the fork's check that
    /// the sandbox runs and its lock): left frozen after it.
    was_frozen: bool,
}

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
        // The fork holds its source frozen while its copies boot: it runs to its end on a task of its
        // own, so a caller that goes away leaves neither a frozen source nor copies half recorded.
        let (service, p, id) = (self.clone(), p.clone(), id.clone());
        tokio::spawn(async move { service.fork_now(&p, &id, req).await })
            .await
            .map_err(|e| ServiceError::internal("fork a sandbox", &e))?
    }

    async fn fork_now(
        &self,
        p: &Principal,
        id: &SandboxId,
        req: ForkRequest,
    ) -> Result<ForkResult, ServiceError> {
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
        self.precheck_quota(
            p,
            AuditAction::SandboxFork,
            Some(id),
            copy.times(u64::from(req.count)),
        )
        .await?;
        // No intent: the copies are recorded `creating` before their volumes are made, so a crash
        // leaves no volume without a record, and recovery ends every `creating` record; the source,
        // found frozen, is thawed when adopted. (An older paddock's fork intent named a base snapshot
        // for recovery to drop.)
        let (frozen, written) = self.freeze_source(&sb).await?;
        fault::point("fork.frozen");
        // Recorded with what the source's quota group says now (its latest writes may not be counted
        // until the copies' commit); the exact figure is taken once they are made, checked again.
        let copied = self
            .fork_copies(
                p,
                &source,
                &spec,
                &req,
                id,
                source.base_bytes.saturating_add(written),
            )
            .await;
        fault::point("fork.copies_booted");
        let thawed = self.thaw_source(&sb, frozen).await;
        // A fork whose copies failed ended them already (all or none).
        let copies = copied?;
        let written = match thawed {
            Ok(written) => written,
            Err(e) => {
                for (copy, _) in &copies {
                    let _ = self.kill_sandbox(p, copy).await;
                }
                return Err(e);
            }
        };
        let base_bytes = source.base_bytes.saturating_add(written);
        // Every copy moves to `running` with its row and its exact base, in one transaction: a crash
        // before it leaves no copy, after it every one.
        let fork_row = AuditEntry::ok(p, AuditAction::SandboxFork, Some(id))
            .detail(audit::Forked {
                copies: copies.iter().map(|(c, _)| c.to_string()).collect(),
                base_bytes,
            })
            .into_row();
        let (ids, tenant, defaults) = (copies.clone(), p.tenant.clone(), self.quota_defaults());
        // The copies' records come back from the same transaction (what the caller is answered
        // with), rather than from one store call each after it.
        let committed = self
            .db("record a fork", move |s| {
                s.transaction(|tx| {
                    for (copy, entry) in &ids {
                        let started =
                            audit::record(tx, Transition::Boot.change(), copy.as_str(), None, entry)?;
                        if !started
                            || !tx.rebase_sandbox_checked(copy.as_str(), &tenant, base_bytes, &defaults)?
                        {
                            return Ok(None);
                        }
                    }
                    audit::append(tx, &fork_row)?;
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
                let e = failed.err().unwrap_or_else(|| {
                    ServiceError::new(
                        ErrorCode::SandboxNotRunning,
                        "a copy ended before the fork was recorded",
                    )
                });
                // Over the storage quota with the copies' exact base: refused, and audited so.
                return self
                    .audit_refusal(p, AuditAction::SandboxFork, Some(id), Err(e))
                    .await;
            }
        };
        let sandboxes: Vec<_> = records.iter().map(info_from_record).collect();
        if sandboxes.len() != copies.len() {
            return Err(ServiceError::internal(
                "read a fork's copies",
                &format!("{} of {} copies recorded", sandboxes.len(), copies.len()),
            ));
        }
        Ok(ForkResult { sandboxes })
    }

    /// Locks `sb`'s handle and freezes it; what its own writes take now, as its quota group says.
    async fn freeze_source(&self, sb: &LiveSandbox) -> Result<(Frozen, u64), ServiceError> {
        const WHAT: &str = "freeze a sandbox for its copies";
        let guard = std::sync::Arc::clone(&sb.handle).lock_owned().await;
        let (guard, frozen) = self
            .on_held_handle(guard, WHAT, |b, handle| {
                let was_frozen = b.freeze_sandbox(handle)?;
                b.sandbox_usage(handle)
                    .map(|usage| (was_frozen, usage.disk_bytes))
                    .inspect_err(|_| {
                        if !was_frozen {
                            let _ = b.resume_sandbox(handle);
                        }
                    })
            })
            .await?;
        let (was_frozen, written) = frozen
            .ok_or_else(|| ServiceError::sandbox_ending(&sb.id))?
            .map_err(|e| ServiceError::from_runtime(WHAT, e))?;
        Ok((Frozen { guard, was_frozen }, written))
    }

    /// Thaws a fork's source (unless it was paused before) and unlocks its handle; what its own
    /// writes take, read after the copies' volumes were committed (so every write they hold counts).
    async fn thaw_source(&self, sb: &LiveSandbox, frozen: Frozen) -> Result<u64, ServiceError> {
        const WHAT: &str = "thaw a sandbox after its copies";
        let Frozen { guard, was_frozen } = frozen;
        let done = self
            .on_held_handle(guard, WHAT, move |b, handle| {
                let written = b.sandbox_usage(handle).map(|u| u.disk_bytes);
                let thawed = if was_frozen {
                    Ok(())
                } else {
                    b.resume_sandbox(handle)
                };
                thawed.and(written)
            })
            .await;
        match done {
            Ok((_, thawed)) => thawed
                .ok_or_else(|| ServiceError::sandbox_ending(&sb.id))?
                .map_err(|e| ServiceError::from_runtime(WHAT, e)),
            Err(e) => {
                // The blocking task died with the handle's lock: the sandbox may still be frozen.
                tracing::error!(sandbox_id = %sb.id, error = %e.message, "a fork's source may be left frozen");
                Err(e)
            }
        }
    }

    /// Boots `req.count` copies of sandbox `source` (`from`, frozen), recorded `creating` with
    /// `base_bytes` (all or none: a failure ends those already made); each with its pending
    /// `sandbox.create` row.
    async fn fork_copies(
        &self,
        p: &Principal,
        source: &paddock_store::SandboxRecord,
        spec: &crate::core::live::StoredSpec,
        req: &ForkRequest,
        from: &SandboxId,
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
            .map(|(id, plan)| self.boot_record(p, id, plan, VolumeSource::Sandbox(from.clone())))
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
