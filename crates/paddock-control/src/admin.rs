//! Authentication, keys, tenants, the audit log and metrics.

use std::time::Duration;

use paddock_types::api::{
    AuditPage, AuditQuery, AuditVerification, CreateKeyRequest, CreatedKey, ErrorCode, KeyList, TenantInfo,
    TenantList, TenantQuotaBody,
};

use crate::{Principal, SandboxService, ServiceError};

fn pending() -> ServiceError {
    ServiceError::new(ErrorCode::Unsupported, "not implemented yet")
}

impl SandboxService {
    /// Resolves an API key (the bare key, as sent in `Authorization: Bearer <key>` or `X-API-Key`).
    /// Failures are audited and answered `unauthorized`.
    pub async fn authenticate(&self, key: &str) -> Result<Principal, ServiceError> {
        let _ = key;
        Err(pending())
    }

    /// Creates the first admin key if no active admin key exists (first start); `None` otherwise.
    pub async fn bootstrap_admin_key(&self) -> Result<Option<CreatedKey>, ServiceError> {
        Err(pending())
    }

    /// Creates an API key (admin).
    pub async fn create_key(&self, p: &Principal, req: CreateKeyRequest) -> Result<CreatedKey, ServiceError> {
        let _ = (p, req);
        Err(pending())
    }

    /// Lists keys: every key for an admin, the tenant's own keys otherwise.
    pub async fn list_keys(&self, p: &Principal) -> Result<KeyList, ServiceError> {
        let _ = p;
        Err(pending())
    }

    /// Revokes a key (admin).
    pub async fn revoke_key(&self, p: &Principal, key_id: &str) -> Result<(), ServiceError> {
        let _ = (p, key_id);
        Err(pending())
    }

    /// Every tenant (admin).
    pub async fn list_tenants(&self, p: &Principal) -> Result<TenantList, ServiceError> {
        let _ = p;
        Err(pending())
    }

    /// One tenant (admin, or the tenant itself).
    pub async fn get_tenant(&self, p: &Principal, name: &str) -> Result<TenantInfo, ServiceError> {
        let _ = (p, name);
        Err(pending())
    }

    /// Sets a tenant's quota (admin); creates the tenant if new.
    pub async fn set_tenant_quota(
        &self,
        p: &Principal,
        name: &str,
        quota: TenantQuotaBody,
    ) -> Result<TenantInfo, ServiceError> {
        let _ = (p, name, quota);
        Err(pending())
    }

    /// Audit rows (the caller's tenant only, unless admin).
    pub async fn query_audit(&self, p: &Principal, q: AuditQuery) -> Result<AuditPage, ServiceError> {
        let _ = (p, q);
        Err(pending())
    }

    /// Checks the audit chain (admin).
    pub async fn verify_audit(&self, p: &Principal) -> Result<AuditVerification, ServiceError> {
        let _ = p;
        Err(pending())
    }

    /// The Prometheus text exposition (admin).
    pub fn render_metrics(&self, p: &Principal) -> Result<String, ServiceError> {
        let _ = p;
        Err(pending())
    }

    /// Counts one HTTP request in the metrics (called by the front-end's middleware); `route` is the
    /// route template (`/v1/sandboxes/{id}`), never the concrete path.
    pub fn record_request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let _ = (method, route, status, elapsed);
    }
}
