//! Tenant access: the one place that decides whether a principal may see a sandbox, snapshot or
//! volume (another tenant's looks missing), whether a sandbox is usable now (not paused, not being
//! recovered), and how records read back as API bodies.

use std::sync::Arc;

use paddock_store::{SandboxRecord, SandboxState, SnapshotKind, SnapshotRecord, VolumeRecord};
use paddock_types::api::{
    ErrorCode, SandboxInfo, SandboxStateBody, SnapshotInfo, SnapshotKindBody, VolumeMountInfo,
};
use paddock_types::SandboxId;
use paddock_types::VolumeId;

use crate::core::error::{snapshot_not_found, volume_not_found};
use crate::core::live::{lock, LiveSandbox, StoredSpec};
use crate::core::time::rfc3339;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// The record of sandbox `id` if `p`'s tenant owns it.
    pub(crate) async fn owned_record(&self, p: &Principal, id: &str) -> Result<SandboxRecord, ServiceError> {
        let sid = id.to_owned();
        let record = self.db("read a sandbox", move |s| s.get_sandbox(&sid)).await?;
        match record {
            Some(r) if r.tenant.as_deref() == Some(p.tenant.as_str()) => Ok(r),
            _ => Err(ServiceError::sandbox_not_found(id)),
        }
    }

    /// The live sandbox `id` if `p`'s tenant owns it (without a store read on the hot path).
    pub(crate) async fn owned_live(&self, p: &Principal, id: &str) -> Result<Arc<LiveSandbox>, ServiceError> {
        let sb = self.owned_live_any(p, id).await?;
        self.refuse_paused(&sb)?;
        Ok(sb)
    }

    /// Like [`Self::owned_live`], paused sandboxes included (for pause, resume and kill).
    pub(crate) async fn owned_live_any(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<Arc<LiveSandbox>, ServiceError> {
        self.inner.activity.touch();
        if let Some(sb) = self.live_sandbox(id) {
            if sb.tenant().as_deref() == Some(p.tenant.as_str()) {
                return Ok(sb);
            }
            return Err(ServiceError::sandbox_not_found(id));
        }
        let record = self.owned_record(p, id).await?;
        self.refuse_recovering(id)?;
        Err(ServiceError::new(
            ErrorCode::SandboxNotRunning,
            format!("sandbox {id} is {}", record.state.as_str()),
        ))
    }

    /// For a front-end that authorised a request with a credential bound to one sandbox (E2B's envd
    /// access token) instead of an API key: a principal of that sandbox's tenant, with `via` as its
    /// key id in audit rows. `None` unless the sandbox is live, owned (not in a warm pool) and not
    /// paused, so the front-end answers as for a missing sandbox. Reads the live registry only.
    pub fn live_sandbox_principal(&self, id: &SandboxId, via: &str) -> Option<Principal> {
        let sb = self.live_sandbox(id.as_str())?;
        if sb.is_paused() {
            return None;
        }
        let tenant = sb.tenant()?;
        Some(Principal {
            tenant,
            key_id: via.to_owned(),
            admin: false,
            change_network: true,
            approver: false,
        })
    }

    /// Whether live sandbox `id` serves its ports without credentials on E2B's sandbox door (it was
    /// created with `public_ports`); `None` where [`Self::live_sandbox_principal`] is `None`.
    pub fn live_sandbox_ports_public(&self, id: &SandboxId) -> Option<bool> {
        let sb = self.live_sandbox(id.as_str())?;
        if sb.is_paused() || sb.is_warm() {
            return None;
        }
        Some(sb.spec().public_ports)
    }

    /// One sandbox of the caller's tenant.
    pub async fn get_sandbox(&self, p: &Principal, id: &SandboxId) -> Result<SandboxInfo, ServiceError> {
        Ok(info_from_record(&self.owned_record(p, id).await?))
    }

    /// A live sandbox of `p`'s tenant that is not paused (its agent answers).
    pub(crate) fn refuse_paused(&self, sb: &LiveSandbox) -> Result<(), ServiceError> {
        if sb.is_paused() {
            return Err(ServiceError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {} is paused; resume it first", sb.id),
            ));
        }
        Ok(())
    }

    /// A snapshot of `p`'s tenant that still exists.
    pub(crate) async fn owned_snapshot(
        &self,
        p: &Principal,
        id: &str,
    ) -> Result<SnapshotRecord, ServiceError> {
        let sid = id.to_owned();
        let record = self.db("read a snapshot", move |s| s.get_snapshot(&sid)).await?;
        match record {
            Some(r) if r.tenant == p.tenant && r.deleted_at_ms.is_none() => Ok(r),
            _ => Err(snapshot_not_found(id)),
        }
    }

    /// Snapshot `snapshot` of `p`'s tenant, or with `None` the newest checkpoint of sandbox `id`
    /// (`snapshot_not_found` when it has none).
    pub(crate) async fn snapshot_or_checkpoint(
        &self,
        p: &Principal,
        id: &str,
        snapshot: Option<&str>,
    ) -> Result<SnapshotRecord, ServiceError> {
        if let Some(s) = snapshot {
            return self.owned_snapshot(p, s).await;
        }
        let sid = id.to_owned();
        self.db("read a checkpoint", move |s| s.latest_checkpoint(&sid))
            .await?
            .ok_or_else(|| {
                ServiceError::new(
                    ErrorCode::SnapshotNotFound,
                    format!("sandbox {id} has no checkpoint"),
                )
            })
    }

    /// `sandbox_recovering` while sandbox `id` is being recovered after a restart.
    pub(crate) fn refuse_recovering(&self, id: &str) -> Result<(), ServiceError> {
        if lock(&self.inner.recovering).contains(id) {
            return Err(ServiceError::new(
                ErrorCode::SandboxRecovering,
                format!("sandbox {id} is being recovered after a server restart; retry shortly"),
            ));
        }
        Ok(())
    }

    /// The existing volume of `p`'s tenant whose id or name is `id_or_name`.
    pub(crate) async fn owned_volume(
        &self,
        p: &Principal,
        id_or_name: &str,
    ) -> Result<VolumeRecord, ServiceError> {
        let (tenant, lookup) = (p.tenant.clone(), id_or_name.to_owned());
        self.db("read a volume", move |s| s.find_volume(&tenant, &lookup))
            .await?
            .ok_or_else(|| volume_not_found(id_or_name))
    }
}

pub(crate) fn info_from_record(r: &SandboxRecord) -> SandboxInfo {
    let spec: Option<StoredSpec> = serde_json::from_str(&r.spec_json).ok();
    SandboxInfo {
        id: r.id.clone(),
        tenant: r.tenant.clone().unwrap_or_default(),
        state: state_body(r.state),
        template: r.profile.clone(),
        limits: spec.as_ref().map(|s| s.limits.clone()).unwrap_or_default(),
        env_keys: spec
            .as_ref()
            .map(|s| s.env.keys().cloned().collect())
            .unwrap_or_default(),
        workdir: spec.as_ref().and_then(|s| s.workdir.clone()),
        user: spec.as_ref().map(|s| s.user.clone()).unwrap_or_default(),
        labels: r.labels.clone(),
        volumes: spec
            .as_ref()
            .map(|s| {
                s.volumes
                    .iter()
                    .map(|v| VolumeMountInfo {
                        volume: v.volume.to_string(),
                        path: v.path.to_string(),
                        read_only: v.read_only,
                    })
                    .collect()
            })
            .unwrap_or_default(),
        created_at: rfc3339(r.claimed_at_ms.unwrap_or(r.created_at_ms)),
        expires_at: r.expires_at_ms.map(rfc3339),
        ended_at: r.ended_at_ms.map(rfc3339),
        end_reason: r.end_reason.clone(),
        paused: r.paused,
        on_timeout: spec.as_ref().map(|s| s.on_timeout).unwrap_or_default(),
        audit_exec_diff: spec.as_ref().is_some_and(|s| s.audit_exec_diff),
        public_ports: spec.as_ref().is_some_and(|s| s.public_ports),
    }
}

pub(crate) fn state_body(state: SandboxState) -> SandboxStateBody {
    match state {
        SandboxState::Warm | SandboxState::Creating => SandboxStateBody::Creating,
        SandboxState::Running => SandboxStateBody::Running,
        SandboxState::Stopped => SandboxStateBody::Stopped,
        SandboxState::Killed => SandboxStateBody::Killed,
        SandboxState::Expired => SandboxStateBody::Expired,
        SandboxState::Failed => SandboxStateBody::Failed,
    }
}

pub(crate) fn info(r: &SnapshotRecord) -> SnapshotInfo {
    SnapshotInfo {
        id: r.id.clone(),
        sandbox_id: r.sandbox_id.clone(),
        kind: kind_body(r.kind),
        name: r.name.clone(),
        labels: r.labels.clone(),
        created_at: rfc3339(r.created_at_ms),
        referenced_bytes: None,
        exclusive_bytes: None,
        storage_bytes: r.storage_bytes,
    }
}

pub(crate) fn parse_id(record: &VolumeRecord) -> Result<VolumeId, ServiceError> {
    record
        .id
        .parse()
        .map_err(|e| ServiceError::internal("parse a volume id", &e))
}

pub(crate) fn kind_body(kind: SnapshotKind) -> SnapshotKindBody {
    match kind {
        SnapshotKind::Snapshot => SnapshotKindBody::Snapshot,
        SnapshotKind::Checkpoint => SnapshotKindBody::Checkpoint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_types::api::SandboxStateBody;

    #[test]
    fn warm_and_creating_look_like_creating() {
        assert_eq!(state_body(SandboxState::Warm), SandboxStateBody::Creating);
        assert_eq!(state_body(SandboxState::Expired), SandboxStateBody::Expired);
    }
}
