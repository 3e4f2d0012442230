//! Named volumes: create, get, list, delete, and resolving the volumes a new sandbox mounts.
//!
//! A volume's storage lives in the pool, its record (owner, name, labels, size) in the store; the
//! record is written with its audit row in one transaction, and storage without a record is garbage
//! (collected at startup). Which sandbox mounts which volume is recorded with the sandbox's row, so a
//! delete can refuse while a live sandbox mounts it, also after a restart. Another tenant's volume
//! answers exactly like a missing one.

use paddock_store::{NewVolume, QuotaRequest, StoreError, VolumeFilter, VolumeRecord};
use paddock_types::api::{CreateVolumeRequest, ErrorCode, ListVolumesQuery, VolumeInfo, VolumeList};
use paddock_types::{VolumeId, VolumeName};

use crate::core::access::parse_id;
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::error::{volume_exists, volume_not_found};
use crate::core::service::runtime_error;
use crate::core::time::{now_ms, rfc3339};
use crate::plan::labels::check_volume_labels;
use crate::{Principal, SandboxService, ServiceError};

impl SandboxService {
    /// Creates an empty volume for `p`'s tenant.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant))]
    pub async fn create_volume(
        &self,
        p: &Principal,
        req: CreateVolumeRequest,
    ) -> Result<VolumeInfo, ServiceError> {
        let name: VolumeName = req
            .name
            .parse()
            .map_err(|e: paddock_types::VolumeNameError| ServiceError::invalid("name", e.to_string()))?;
        check_volume_labels(&req.labels)?;
        if req.size.is_some_and(|s| s.as_u64() == 0) {
            return Err(ServiceError::invalid("size", "size must be at least 1 byte"));
        }
        // A volume is disk space like a sandbox's: one created without a size gets the server's
        // default disk size (as its real limit, and charged so), and the server's cap on sandbox
        // disks caps it too. Nothing a tenant stores is unlimited or uncharged.
        let size = req.size.or(self.inner.config.default_limits.disk);
        if let Some(cap) = self.inner.config.max_limits.disk {
            match size {
                Some(size) if size > cap => {
                    return Err(ServiceError::invalid(
                        "size",
                        format!("{size} is above this server's maximum of {cap}"),
                    ))
                }
                None => {
                    return Err(ServiceError::invalid(
                        "size",
                        format!("this server requires a size of at most {cap}"),
                    ))
                }
                Some(_) => {}
            }
        }
        let request = QuotaRequest {
            volumes: 1,
            storage_bytes: size.map_or(0, u64::from),
            ..QuotaRequest::default()
        };
        self.precheck_quota(p, AuditAction::VolumeCreate, None, request)
            .await?;
        let (tenant, lookup) = (p.tenant.clone(), name.to_string());
        if self
            .db("read a volume", move |s| s.find_volume(&tenant, &lookup))
            .await?
            .is_some()
        {
            return Err(volume_exists(name.as_str()));
        }
        let id = VolumeId::from_random(rand::random());
        let made = id.clone();
        self.on_backend("create a volume", move |b| b.create_volume(&made, size))
            .await?
            .map_err(|e| runtime_error("create a volume", e))?;
        let new = NewVolume {
            id: id.to_string(),
            tenant: p.tenant.clone(),
            name: name.to_string(),
            labels: req.labels,
            size_bytes: size.map(|s| s.as_u64()),
            created_at_ms: now_ms(),
        };
        let row = AuditEntry::ok(p, AuditAction::VolumeCreate, None)
            .detail(audit::VolumeCreated {
                volume: id.to_string(),
                name: new.name.clone(),
                size_bytes: new.size_bytes,
            })
            .into_row();
        let (record, defaults) = (new.clone(), self.quota_defaults());
        let stored = self
            .db("record a volume", move |s| {
                s.transaction(|tx| {
                    tx.insert_volume_checked(&record, &defaults)?;
                    audit::append(tx, &row)?;
                    Ok::<_, StoreError>(())
                })
            })
            .await;
        if let Err(e) = stored {
            // Storage without a record is garbage: remove it now rather than at the next start.
            let _ = self
                .on_backend("delete a volume", move |b| b.delete_volume(&id))
                .await;
            return self
                .audit_refusal(p, AuditAction::VolumeCreate, None, Err(e))
                .await;
        }
        let record = VolumeRecord {
            id: new.id,
            tenant: new.tenant,
            name: new.name,
            labels: new.labels,
            size_bytes: new.size_bytes,
            created_at_ms: new.created_at_ms,
            deleted_at_ms: None,
        };
        self.volume_info(&record).await
    }

    /// One volume (by id or name), with its usage and the live sandboxes mounting it.
    pub async fn get_volume(&self, p: &Principal, id_or_name: &str) -> Result<VolumeInfo, ServiceError> {
        let record = self.owned_volume(p, id_or_name).await?;
        self.volume_info(&record).await
    }

    /// The caller's volumes.
    pub async fn list_volumes(&self, p: &Principal, q: ListVolumesQuery) -> Result<VolumeList, ServiceError> {
        let limit = crate::core::paging::page_limit(q.limit)?;
        let filter = VolumeFilter {
            tenant: Some(p.tenant.clone()),
            after_id: q.cursor.clone(),
            limit: limit + 1,
        };
        let mut records = self.db("list volumes", move |s| s.list_volumes(&filter)).await?;
        let next_cursor = crate::core::paging::finish_page(&mut records, limit, |r| r.id.clone());
        let mut volumes = Vec::with_capacity(records.len());
        for record in &records {
            volumes.push(self.volume_info(record).await?);
        }
        Ok(VolumeList { volumes, next_cursor })
    }

    /// Deletes a volume and frees its storage; refused (`volume_in_use`) while a live sandbox mounts
    /// it.
    #[tracing::instrument(skip_all, fields(tenant = %p.tenant))]
    pub async fn delete_volume(&self, p: &Principal, id_or_name: &str) -> Result<(), ServiceError> {
        let record = self.owned_volume(p, id_or_name).await?;
        let id = parse_id(&record)?;
        let row = AuditEntry::ok(p, AuditAction::VolumeDelete, None)
            .detail(audit::VolumeDeleted {
                volume: record.id.clone(),
                name: record.name.clone(),
            })
            .into_row();
        let vid = record.id.clone();
        // The check and the deletion are one transaction, as a sandbox's insert and its mounts are:
        // a concurrent create either mounts the volume first (and this refuses) or finds it deleted.
        let outcome = self
            .db("delete a volume", move |s| {
                s.transaction(|tx| {
                    let users = tx.volume_users(&vid)?;
                    if !users.is_empty() {
                        return Ok(Err(users));
                    }
                    let deleted = tx.mark_volume_deleted(&vid, now_ms())?;
                    if deleted {
                        audit::append(tx, &row)?;
                    }
                    Ok::<_, StoreError>(Ok(deleted))
                })
            })
            .await?;
        match outcome {
            Err(users) => {
                let entry = AuditEntry::ok(p, AuditAction::VolumeDelete, None)
                    .outcome(ErrorCode::VolumeInUse.as_str())
                    .detail(audit::VolumeInUse {
                        volume: record.id.clone(),
                        mounted_by: users.clone(),
                    });
                self.audit(entry).await?;
                Err(ServiceError::new(
                    ErrorCode::VolumeInUse,
                    format!(
                        "volume {} is mounted by {}; delete those sandboxes first",
                        record.name,
                        users.join(", ")
                    ),
                ))
            }
            Ok(false) => Err(volume_not_found(id_or_name)),
            Ok(true) => {
                let volume = id.clone();
                if let Ok(Err(e)) = self
                    .on_backend("delete a volume", move |b| b.delete_volume(&volume))
                    .await
                {
                    tracing::warn!(volume = %id, error = %e, "volume storage not freed; gc will");
                }
                Ok(())
            }
        }
    }

    async fn volume_info(&self, r: &VolumeRecord) -> Result<VolumeInfo, ServiceError> {
        let vid = r.id.clone();
        let mounted_by = self
            .db("read a volume's users", move |s| s.volume_users(&vid))
            .await?;
        let used_bytes = match r.id.parse::<VolumeId>() {
            Ok(id) => match self
                .on_backend("measure a volume", move |b| b.volume_usage(&id))
                .await
            {
                Ok(Ok(usage)) => Some(usage.bytes),
                _ => None,
            },
            Err(_) => None,
        };
        Ok(VolumeInfo {
            id: r.id.clone(),
            name: r.name.clone(),
            labels: r.labels.clone(),
            size_bytes: r.size_bytes,
            used_bytes,
            mounted_by,
            created_at: rfc3339(r.created_at_ms),
        })
    }
}
