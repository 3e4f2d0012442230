//! Approval policies: the caller's tenant's (`/v1/policy`) and one of its sandboxes'
//! (`/v1/sandboxes/{id}/policy`). Setting and deleting need an approver or admin key.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use paddock_control::{PolicyScope, SandboxService};
use paddock_types::api::{ApprovalPolicyInfo, SetApprovalPolicyRequest};

use crate::{ApiError, ApiJson, Auth, SandboxPath};

/// The caller's tenant's approval policy (`policy_not_found` if none is set).
#[utoipa::path(
    get,
    path = "/v1/policy",
    tag = "policies",
    responses(
        (status = 200, description = "The tenant's approval policy", body = ApprovalPolicyInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_tenant_policy(
    Auth(p): Auth,
    State(service): State<SandboxService>,
) -> Result<Json<ApprovalPolicyInfo>, ApiError> {
    Ok(Json(service.get_policy(&p, &PolicyScope::Tenant).await?))
}

/// Sets (or replaces) the caller's tenant's approval policy. Needs an approver or admin key
/// (`forbidden` otherwise); a policy that does not compile is refused whole with `invalid_request`
/// and `field` naming the fault (`policy.rules[1].exec.args`).
#[utoipa::path(
    put,
    path = "/v1/policy",
    tag = "policies",
    request_body = SetApprovalPolicyRequest,
    responses(
        (status = 200, description = "The policy, as stored", body = ApprovalPolicyInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn set_tenant_policy(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiJson(req): ApiJson<SetApprovalPolicyRequest>,
) -> Result<Json<ApprovalPolicyInfo>, ApiError> {
    Ok(Json(service.set_policy(&p, &PolicyScope::Tenant, req).await?))
}

/// Deletes the caller's tenant's approval policy. Needs an approver or admin key.
#[utoipa::path(
    delete,
    path = "/v1/policy",
    tag = "policies",
    responses(
        (status = 204, description = "Deleted"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn delete_tenant_policy(
    Auth(p): Auth,
    State(service): State<SandboxService>,
) -> Result<StatusCode, ApiError> {
    service.delete_policy(&p, &PolicyScope::Tenant).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A sandbox's own approval policy (`policy_not_found` if none is set).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/policy",
    tag = "policies",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox's approval policy", body = ApprovalPolicyInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_sandbox_policy(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<ApprovalPolicyInfo>, ApiError> {
    Ok(Json(service.get_policy(&p, &PolicyScope::Sandbox(id)).await?))
}

/// Sets (or replaces) a sandbox's own approval policy. Needs an approver or admin key; refused
/// whole like the tenant's.
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/policy",
    tag = "policies",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetApprovalPolicyRequest,
    responses(
        (status = 200, description = "The policy, as stored", body = ApprovalPolicyInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn set_sandbox_policy(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<SetApprovalPolicyRequest>,
) -> Result<Json<ApprovalPolicyInfo>, ApiError> {
    Ok(Json(
        service.set_policy(&p, &PolicyScope::Sandbox(id), req).await?,
    ))
}

/// Deletes a sandbox's own approval policy. Needs an approver or admin key.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/policy",
    tag = "policies",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn delete_sandbox_policy(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<StatusCode, ApiError> {
    service.delete_policy(&p, &PolicyScope::Sandbox(id)).await?;
    Ok(StatusCode::NO_CONTENT)
}
