//! Authentication, keys, tenants, the audit log and metrics.

use std::time::Duration;

use paddock_store::{ApiKeyRecord, AuditFilter, KeyPermissions, StoreError, TenantQuota, TenantRecord};
use paddock_types::api::{
    AuditPage, AuditQuery, AuditRecord, AuditVerification, BrokenAuditRow, CreateKeyRequest, CreatedKey,
    ErrorCode, KeyInfo, KeyList, TenantInfo, TenantList, TenantQuotaBody, TenantUsageBody,
};
use paddock_types::{ByteSize, CpuQuota};

use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::live::lock;
use crate::core::principal::Permission;
use crate::core::time::{now_ms, parse_rfc3339, rfc3339};
use crate::{Principal, SandboxService, ServiceError};

/// The tenant the first admin key belongs to.
pub use crate::core::principal::ADMIN_TENANT;
const MAX_TENANT_LEN: usize = 64;
/// Detail text one page of `GET /v1/audit` holds at most (beyond its first row): a page of a
/// thousand rows with large details (a 1 MiB command line each) would otherwise be a gigabyte.
const AUDIT_PAGE_BYTES: usize = 8 << 20;

fn forbidden(what: &str) -> ServiceError {
    Permission::Admin.refusal(what)
}

fn require_admin(p: &Principal, what: &str) -> Result<(), ServiceError> {
    p.require(Permission::Admin, what)
}

/// Tenant names: 1-64 of `[a-z0-9_-]`, starting with a letter or digit.
pub(crate) fn check_tenant(field: &str, name: &str) -> Result<(), ServiceError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_TENANT_LEN
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ServiceError::invalid(
            field,
            format!(
                "{name:?} is not a tenant name: use 1-{MAX_TENANT_LEN} characters of a-z, 0-9, '-' and '_'"
            ),
        ))
    }
}

/// How a revocation ended.
enum Revocation {
    Done,
    NotFound,
    LastAdmin,
}

fn key_info(k: ApiKeyRecord) -> KeyInfo {
    KeyInfo {
        id: k.id,
        tenant: k.tenant,
        name: Some(k.name).filter(|n| !n.is_empty()),
        admin: k.admin,
        change_network: k.change_network,
        approver: k.approver,
        created_at: rfc3339(k.created_at_ms),
        revoked_at: k.revoked_at_ms.map(rfc3339),
        last_used_at: k.last_used_at_ms.map(rfc3339),
    }
}

fn quota_body(q: &TenantQuota) -> TenantQuotaBody {
    TenantQuotaBody {
        max_sandboxes: q.max_sandboxes,
        max_memory: q.max_memory_bytes.map(ByteSize::bytes),
        max_cpus: q
            .max_cpu_millis
            .and_then(|m| CpuQuota::try_from(f64::from(m) / 1000.0).ok()),
        max_snapshots: q.max_snapshots,
        max_volumes: q.max_volumes,
        max_storage: q.max_storage_bytes.map(ByteSize::bytes),
        max_templates: q.max_templates,
    }
}

impl SandboxService {
    /// Resolves an API key (the bare key, as sent in `Authorization: Bearer <key>` or `X-API-Key`).
    /// Failures are audited and answered `unauthorized`.
    pub async fn authenticate(&self, key: &str) -> Result<Principal, ServiceError> {
        let text = key.to_owned();
        let record = self
            .db("check an API key", move |s| s.authenticate(&text, now_ms()))
            .await?;
        match record {
            Some(k) => Ok(Principal {
                tenant: k.tenant,
                key_id: k.id,
                admin: k.admin,
                change_network: k.change_network,
                approver: k.approver,
            }),
            None => {
                // The key id part (never the secret) helps tell a revoked key from garbage.
                let key_id = key
                    .strip_prefix("pdk_")
                    .and_then(|rest| rest.split('_').next())
                    .filter(|id| id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit()))
                    .map(str::to_owned);
                let entry = AuditEntry::system(AuditAction::AuthFailed, None, None)
                    .outcome("unauthorized")
                    .detail(audit::KeyRef { key_id });
                self.audit(entry).await?;
                Err(ServiceError::new(
                    ErrorCode::Unauthorized,
                    "invalid or revoked API key",
                ))
            }
        }
    }

    /// Creates the first admin key if no active admin key exists (first start); `None` otherwise.
    pub async fn bootstrap_admin_key(&self) -> Result<Option<CreatedKey>, ServiceError> {
        let row = AuditEntry::system(AuditAction::KeyCreate, Some(ADMIN_TENANT.to_owned()), None).pending();
        let created = self
            .db("create the first admin key", move |s| {
                s.transaction(|tx| {
                    if tx.count_admin_keys()? > 0 {
                        return Ok(None);
                    }
                    let (record, key) = tx.create_api_key(ADMIN_TENANT, "bootstrap admin", true, now_ms())?;
                    let row = row.detail(audit::KeyBootstrap {
                        key_id: record.id.clone(),
                        admin: true,
                        via: "bootstrap",
                    });
                    audit::append(tx, &row)?;
                    Ok::<_, StoreError>(Some((record, key)))
                })
            })
            .await?;
        Ok(created.map(|(record, key)| CreatedKey {
            id: record.id,
            tenant: record.tenant,
            e2b_key: paddock_store::e2b_spelling(&key),
            key,
            admin: true,
            change_network: record.change_network,
            approver: record.approver,
        }))
    }

    /// Creates an API key (admin).
    pub async fn create_key(&self, p: &Principal, req: CreateKeyRequest) -> Result<CreatedKey, ServiceError> {
        require_admin(p, "creating keys")?;
        check_tenant("tenant", &req.tenant)?;
        let name = req.name.clone().unwrap_or_default();
        if name.len() > 256 {
            return Err(ServiceError::invalid("name", "at most 256 bytes"));
        }
        let permissions = KeyPermissions {
            admin: req.admin,
            change_network: req.change_network,
            // An admin may do everything an approver may: its key says so.
            approver: req.approver || req.admin,
        };
        let tenant = req.tenant.clone();
        let row = AuditEntry::ok(p, AuditAction::KeyCreate, None).pending();
        let (record, key) = self
            .db("create an API key", move |s| {
                s.transaction(|tx| {
                    let (record, key) = tx.create_api_key_with(&tenant, &name, permissions, now_ms())?;
                    let row = row.detail(audit::KeyCreated {
                        key_id: record.id.clone(),
                        for_tenant: record.tenant.clone(),
                        admin: permissions.admin,
                        change_network: permissions.change_network,
                        approver: permissions.approver,
                    });
                    audit::append(tx, &row)?;
                    Ok::<_, StoreError>((record, key))
                })
            })
            .await?;
        Ok(CreatedKey {
            id: record.id,
            tenant: record.tenant,
            e2b_key: paddock_store::e2b_spelling(&key),
            key,
            admin: permissions.admin,
            change_network: permissions.change_network,
            approver: permissions.approver,
        })
    }

    /// Lists keys: every key for an admin, the tenant's own keys otherwise.
    pub async fn list_keys(&self, p: &Principal) -> Result<KeyList, ServiceError> {
        let tenant = (!p.admin).then(|| p.tenant.clone());
        let keys = self
            .db("list API keys", move |s| s.list_api_keys(tenant.as_deref()))
            .await?;
        Ok(KeyList {
            keys: keys.into_iter().map(key_info).collect(),
        })
    }

    /// Revokes a key (admin). The last active admin key cannot be revoked: create another first.
    pub async fn revoke_key(&self, p: &Principal, key_id: &str) -> Result<(), ServiceError> {
        require_admin(p, "revoking keys")?;
        let id = key_id.to_owned();
        let row = AuditEntry::ok(p, AuditAction::KeyRevoke, None)
            .detail(audit::KeyRef {
                key_id: Some(key_id.to_owned()),
            })
            .into_row();
        let outcome = self
            .db("revoke an API key", move |s| {
                let target = s
                    .list_api_keys(None)?
                    .into_iter()
                    .find(|k| k.id == id && !k.is_revoked());
                let Some(target) = target else {
                    return Ok(Revocation::NotFound);
                };
                s.transaction(|tx| {
                    if target.admin && tx.count_admin_keys()? <= 1 {
                        return Ok(Revocation::LastAdmin);
                    }
                    if !tx.revoke_api_key(&id, now_ms())? {
                        return Ok(Revocation::NotFound);
                    }
                    audit::append(tx, &row)?;
                    Ok::<_, StoreError>(Revocation::Done)
                })
            })
            .await?;
        match outcome {
            Revocation::Done => Ok(()),
            Revocation::NotFound => Err(ServiceError::new(
                ErrorCode::KeyNotFound,
                format!("no active key {key_id}"),
            )),
            Revocation::LastAdmin => Err(ServiceError::new(
                ErrorCode::Forbidden,
                format!("{key_id} is the last active admin key; create another admin key first"),
            )),
        }
    }

    async fn tenant_info(&self, record: TenantRecord) -> Result<TenantInfo, ServiceError> {
        let (name, defaults) = (record.name.clone(), self.quota_defaults());
        let usage = self
            .db("read a tenant's usage", move |s| s.tenant_usage(&name, &defaults))
            .await?;
        Ok(TenantInfo {
            name: record.name,
            quota: quota_body(&record.quota.or(&defaults.quota)),
            usage: TenantUsageBody {
                sandboxes: usage.sandboxes,
                memory_bytes: usage.memory_bytes,
                cpus: usage.cpu_millis as f64 / 1000.0,
                snapshots: usage.snapshots,
                volumes: usage.volumes,
                templates: usage.templates,
                storage_bytes: usage.storage_bytes,
            },
        })
    }

    /// Every tenant (admin).
    pub async fn list_tenants(&self, p: &Principal) -> Result<TenantList, ServiceError> {
        require_admin(p, "listing tenants")?;
        let records = self.db("list tenants", |s| s.list_tenants()).await?;
        let mut tenants = Vec::with_capacity(records.len());
        for r in records {
            tenants.push(self.tenant_info(r).await?);
        }
        Ok(TenantList { tenants })
    }

    /// One tenant (admin, or the tenant itself).
    pub async fn get_tenant(&self, p: &Principal, name: &str) -> Result<TenantInfo, ServiceError> {
        let not_found = || ServiceError::new(ErrorCode::InvalidRequest, format!("no tenant {name:?}"));
        if !p.admin && p.tenant != name {
            return Err(forbidden("reading another tenant"));
        }
        let n = name.to_owned();
        let record = self.db("read a tenant", move |s| s.get_tenant(&n)).await?;
        self.tenant_info(record.ok_or_else(not_found)?).await
    }

    /// Sets a tenant's quota (admin); creates the tenant if new.
    pub async fn set_tenant_quota(
        &self,
        p: &Principal,
        name: &str,
        quota: TenantQuotaBody,
    ) -> Result<TenantInfo, ServiceError> {
        require_admin(p, "setting quotas")?;
        check_tenant("name", name)?;
        let q = TenantQuota {
            max_sandboxes: quota.max_sandboxes,
            max_memory_bytes: quota.max_memory.map(u64::from),
            max_cpu_millis: quota.max_cpus.map(|c| c.millicpus()),
            max_snapshots: quota.max_snapshots,
            max_volumes: quota.max_volumes,
            max_storage_bytes: quota.max_storage.map(u64::from),
            max_templates: quota.max_templates,
        };
        let n = name.to_owned();
        let record = self
            .db("set a tenant's quota", move |s| {
                s.set_tenant_quota(&n, &q, now_ms())
            })
            .await?;
        self.audit(
            AuditEntry::ok(p, AuditAction::TenantQuota, None).detail(audit::TenantQuotaSet {
                for_tenant: name.to_owned(),
                max_sandboxes: q.max_sandboxes,
                max_memory_bytes: q.max_memory_bytes,
                max_cpu_millis: q.max_cpu_millis,
                max_snapshots: q.max_snapshots,
                max_volumes: q.max_volumes,
                max_storage_bytes: q.max_storage_bytes,
                max_templates: q.max_templates,
            }),
        )
        .await?;
        self.tenant_info(record).await
    }

    /// Audit rows (the caller's tenant only, unless admin).
    pub async fn query_audit(&self, p: &Principal, q: AuditQuery) -> Result<AuditPage, ServiceError> {
        let tenant = match (&q.tenant, p.admin) {
            (Some(t), true) => Some(t.clone()),
            (None, true) => None,
            (Some(t), false) if *t != p.tenant => {
                return Err(forbidden("reading another tenant's audit log"))
            }
            (_, false) => Some(p.tenant.clone()),
        };
        let limit = crate::core::paging::page_limit(q.limit)?;
        let filter = AuditFilter {
            tenant,
            sandbox_id: q.sandbox.clone(),
            action: q.action.clone(),
            since_ms: q
                .since
                .as_deref()
                .map(|t| parse_rfc3339("since", t))
                .transpose()?,
            until_ms: q
                .until
                .as_deref()
                .map(|t| parse_rfc3339("until", t))
                .transpose()?,
            after_seq: q.after_seq,
            limit: limit + 1,
            newest_first: false,
        };
        let (mut rows, cut) = self
            .db("read the audit log", move |s| {
                s.query_audit_within(&filter, AUDIT_PAGE_BYTES)
            })
            .await?;
        let mut next_after_seq = crate::core::paging::finish_page(&mut rows, limit, |r| r.seq);
        if cut && next_after_seq.is_none() {
            // Cut short by size: the next page starts after the last row returned.
            next_after_seq = rows.last().map(|r| r.seq);
        }
        Ok(AuditPage {
            records: rows
                .into_iter()
                .map(|r| AuditRecord {
                    seq: r.seq,
                    time: rfc3339(r.ts_ms),
                    tenant: r.tenant,
                    key_id: r.key_id,
                    action: r.action,
                    sandbox_id: r.sandbox_id,
                    outcome: r.outcome,
                    detail: r.detail,
                    prev_hash: r.prev_hash,
                    hash: r.hash,
                })
                .collect(),
            next_after_seq,
        })
    }

    /// Checks the audit chain (admin).
    pub async fn verify_audit(&self, p: &Principal) -> Result<AuditVerification, ServiceError> {
        require_admin(p, "verifying the audit log")?;
        let v = self.db("verify the audit log", |s| s.verify_audit()).await?;
        Ok(AuditVerification {
            ok: v.is_intact(),
            rows_checked: v.rows_checked,
            rows_pruned: v.rows_pruned,
            prune_anchors: v.prune_anchors,
            first_broken: v.first_broken.map(|b| BrokenAuditRow {
                seq: b.seq,
                reason: b.reason,
            }),
        })
    }

    /// The Prometheus text exposition (admin).
    pub fn render_metrics(&self, p: &Principal) -> Result<String, ServiceError> {
        require_admin(p, "reading metrics")?;
        let (mut warm, mut running) = (0i64, 0i64);
        for sb in lock(&self.inner.live).values() {
            if sb.is_warm() {
                warm += 1;
            } else {
                running += 1;
            }
        }
        let metrics = &self.inner.metrics;
        metrics.set_sandboxes("warm", warm);
        metrics.set_sandboxes("running", running);
        for (name, t) in &self.inner.config.templates {
            if t.warm_pool_size > 0 {
                metrics.set_pool_size(name, self.warm_count(name) as i64);
            }
        }
        if let Some(egress) = &self.inner.egress {
            let (in_use, budget) = egress.descriptors_in_use();
            metrics.set_egress_descriptors(in_use, budget);
        }
        metrics.set_store_space(self.inner.store.space_status());
        metrics
            .render()
            .map_err(|e| ServiceError::internal("render metrics", &e))
    }

    /// Counts one HTTP request in the metrics (called by the front-end's middleware); `route` is the
    /// route template (`/v1/sandboxes/{id}`), never the concrete path.
    pub fn record_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.inner.metrics.observe_request(method, route, status, elapsed);
    }

    /// Counts one error response by code (called by the front-end for every error it answers).
    pub fn record_error(&self, code: ErrorCode) {
        self.inner.metrics.count_error(code.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names() {
        for ok in ["alice", "team-1", "a_b", "0x"] {
            assert!(check_tenant("tenant", ok).is_ok(), "{ok}");
        }
        for bad in ["", "Alice", "-a", "a b", "a/b", &"x".repeat(65)] {
            assert!(check_tenant("tenant", bad).is_err(), "{bad}");
        }
    }
}
