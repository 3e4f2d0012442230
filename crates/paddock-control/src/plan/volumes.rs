//! Planning the named volumes a new sandbox mounts: each resolved to a volume of the caller's tenant,
//! with its mount path checked.

use paddock_types::api::VolumeMountRequest;
use paddock_types::{check_volume_mounts, SandboxPath, VolumeMount};

use crate::core::access::parse_id;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// Resolves the volumes a create request mounts (by name or id, `p`'s tenant's only) and checks
    /// where they go.
    pub(crate) async fn resolve_volume_mounts(
        &self,
        p: &Principal,
        requests: &[VolumeMountRequest],
    ) -> Result<Vec<VolumeMount>, ServiceError> {
        let mut mounts = Vec::with_capacity(requests.len());
        for (i, r) in requests.iter().enumerate() {
            let path: SandboxPath = r.path.parse().map_err(|e: paddock_types::SandboxPathError| {
                ServiceError::invalid(format!("volumes[{i}].path"), e.to_string())
            })?;
            let record = self.owned_volume(p, &r.volume).await.map_err(|mut e| {
                e.field = Some(format!("volumes[{i}].volume"));
                e
            })?;
            mounts.push(VolumeMount {
                volume: parse_id(&record)?,
                path,
                read_only: r.read_only,
            });
        }
        check_volume_mounts(&mounts)
            .map_err(|e| ServiceError::invalid(format!("volumes[{}].path", e.index), e.reason))?;
        Ok(mounts)
    }
}
