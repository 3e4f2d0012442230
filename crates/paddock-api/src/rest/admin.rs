//! The audit log, API keys and tenants.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use paddock_control::SandboxService;
use paddock_types::api::{
    AuditPage, AuditQuery, AuditVerification, CreateKeyRequest, CreatedKey, KeyList, TenantInfo, TenantList,
    TenantQuotaBody,
};

use crate::{ApiError, ApiJson, ApiPath, ApiQuery, Auth};

/// Audit rows, oldest first (the caller's tenant only, unless admin).
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "admin",
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of audit rows", body = AuditPage),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn query_audit(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    Ok(Json(service.query_audit(&p, q).await?))
}

/// Checks the audit log's hash chain (admin).
#[utoipa::path(
    get,
    path = "/v1/audit/verify",
    tag = "admin",
    responses(
        (status = 200, description = "The verdict", body = AuditVerification),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn verify_audit(
    Auth(p): Auth,
    State(service): State<SandboxService>,
) -> Result<Json<AuditVerification>, ApiError> {
    Ok(Json(service.verify_audit(&p).await?))
}

/// Creates an API key (admin). The answer is the only time the key itself is shown.
#[utoipa::path(
    post,
    path = "/v1/keys",
    tag = "admin",
    request_body = CreateKeyRequest,
    responses(
        (status = 201, description = "The new key", body = CreatedKey),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn create_key(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiJson(req): ApiJson<CreateKeyRequest>,
) -> Result<(StatusCode, Json<CreatedKey>), ApiError> {
    let key = service.create_key(&p, req).await?;
    Ok((StatusCode::CREATED, Json(key)))
}

/// Lists keys (every key for an admin, the tenant's own otherwise), never their secrets.
#[utoipa::path(
    get,
    path = "/v1/keys",
    tag = "admin",
    responses(
        (status = 200, description = "The keys", body = KeyList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_keys(
    Auth(p): Auth,
    State(service): State<SandboxService>,
) -> Result<Json<KeyList>, ApiError> {
    Ok(Json(service.list_keys(&p).await?))
}

/// Revokes a key (admin).
#[utoipa::path(
    delete,
    path = "/v1/keys/{key_id}",
    tag = "admin",
    params(("key_id" = String, Path, description = "Key id")),
    responses(
        (status = 204, description = "Revoked"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn revoke_key(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(key_id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    service.revoke_key(&p, &key_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Every tenant (admin).
#[utoipa::path(
    get,
    path = "/v1/tenants",
    tag = "admin",
    responses(
        (status = 200, description = "The tenants", body = TenantList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_tenants(
    Auth(p): Auth,
    State(service): State<SandboxService>,
) -> Result<Json<TenantList>, ApiError> {
    Ok(Json(service.list_tenants(&p).await?))
}

/// One tenant (admin, or the tenant itself).
#[utoipa::path(
    get,
    path = "/v1/tenants/{name}",
    tag = "admin",
    params(("name" = String, Path, description = "Tenant name")),
    responses(
        (status = 200, description = "The tenant", body = TenantInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_tenant(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<TenantInfo>, ApiError> {
    Ok(Json(service.get_tenant(&p, &name).await?))
}

/// Sets a tenant's quota (admin); creates the tenant if new.
#[utoipa::path(
    put,
    path = "/v1/tenants/{name}/quota",
    tag = "admin",
    params(("name" = String, Path, description = "Tenant name")),
    request_body = TenantQuotaBody,
    responses(
        (status = 200, description = "The tenant with its new quota", body = TenantInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn set_tenant_quota(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(name): ApiPath<String>,
    ApiJson(quota): ApiJson<TenantQuotaBody>,
) -> Result<Json<TenantInfo>, ApiError> {
    Ok(Json(service.set_tenant_quota(&p, &name, quota).await?))
}
