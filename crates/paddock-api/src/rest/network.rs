//! Sandbox networks (policy, injected secrets, recent connections) and a tenant's secrets.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use paddock_control::SandboxService;
use paddock_types::api::{
    CreateSecretRequest, SandboxNetworkInfo, SecretInfo, SecretList, SetNetworkRequest,
};

use crate::{ApiError, ApiJson, ApiPath, Auth, SandboxPath};

/// A networked sandbox's egress policy, injected secrets (names), proxy address and its most recent
/// connections and DNS questions (allowed and refused), newest first. `invalid_request` for a sandbox
/// created without a network.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/network",
    tag = "network",
    params(("id" = String, Path, description = "Sandbox id")),
    responses(
        (status = 200, description = "The sandbox's network", body = SandboxNetworkInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_network(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
) -> Result<Json<SandboxNetworkInfo>, ApiError> {
    Ok(Json(service.get_network(&p, &id).await?))
}

/// Replaces a networked sandbox's policy and/or injected secrets. New connections and DNS questions
/// follow the change at once; established connections are not cut.
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/network",
    tag = "network",
    params(("id" = String, Path, description = "Sandbox id")),
    request_body = SetNetworkRequest,
    responses(
        (status = 200, description = "The sandbox's network, changed", body = SandboxNetworkInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn set_network(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    SandboxPath(id): SandboxPath,
    ApiJson(req): ApiJson<SetNetworkRequest>,
) -> Result<Json<SandboxNetworkInfo>, ApiError> {
    Ok(Json(service.set_network(&p, &id, req).await?))
}

/// Stores a secret for injection by the egress proxy. Its value is never returned, logged or sent
/// into a sandbox: sandboxes created with `secrets: [NAME]` see the placeholder `paddock-secret:NAME`,
/// which the proxy replaces in request headers sent to the secret's hosts only.
#[utoipa::path(
    post,
    path = "/v1/secrets",
    tag = "network",
    request_body = CreateSecretRequest,
    responses(
        (status = 201, description = "The secret, without its value", body = SecretInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn create_secret(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiJson(req): ApiJson<CreateSecretRequest>,
) -> Result<(StatusCode, Json<SecretInfo>), ApiError> {
    Ok((StatusCode::CREATED, Json(service.create_secret(&p, req).await?)))
}

/// Lists the caller's secrets (names and hosts, never values).
#[utoipa::path(
    get,
    path = "/v1/secrets",
    tag = "network",
    responses(
        (status = 200, description = "The secrets", body = SecretList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_secrets(
    Auth(p): Auth,
    State(service): State<SandboxService>,
) -> Result<Json<SecretList>, ApiError> {
    Ok(Json(service.list_secrets(&p).await?))
}

/// Deletes a secret: from now on no sandbox's requests carry its value.
#[utoipa::path(
    delete,
    path = "/v1/secrets/{secret_name}",
    tag = "network",
    params(("secret_name" = String, Path, description = "Secret name")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn delete_secret(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    service.delete_secret(&p, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
