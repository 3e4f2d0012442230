//! Approved executions (`/v1/executions`): a command proposed for a person to approve, run once
//! on the server's executor after the approval, with its status, exit code and logs.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use paddock_control::SandboxService;
use paddock_types::api::{CreateExecutionRequest, ExecutionInfo, ExecutionList, ListExecutionsQuery};

use crate::extract::{ApiPath, ApiQuery};
use crate::{ApiError, ApiJson, Auth};

/// Proposes an execution: it enters the approvals queue (`kind: execution`) and runs only once
/// a person approves it. A repeated `id` answers the first execution instead of making a second.
#[utoipa::path(
    post,
    path = "/v1/executions",
    tag = "executions",
    request_body = CreateExecutionRequest,
    responses(
        (status = 202, description = "Queued for approval (or the execution this `id` made before)", body = ExecutionInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn create_execution(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiJson(req): ApiJson<CreateExecutionRequest>,
) -> Result<(StatusCode, Json<ExecutionInfo>), ApiError> {
    Ok((
        StatusCode::ACCEPTED,
        Json(service.create_execution(&p, req).await?),
    ))
}

/// Lists the tenant's executions, newest first.
#[utoipa::path(
    get,
    path = "/v1/executions",
    tag = "executions",
    params(ListExecutionsQuery),
    responses(
        (status = 200, description = "The executions", body = ExecutionList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_executions(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiQuery(q): ApiQuery<ListExecutionsQuery>,
) -> Result<Json<ExecutionList>, ApiError> {
    Ok(Json(service.list_executions(&p, q).await?))
}

/// One execution: its state (`pending_approval`, `rejected`, `running`, `succeeded`, `failed`,
/// `timed_out`, `cancelled`), exit code, logs (capped, `logs_truncated` says so), times, the
/// executor's object and the approver.
#[utoipa::path(
    get,
    path = "/v1/executions/{execution_id}",
    tag = "executions",
    params(("execution_id" = String, Path, description = "Execution id (ex-...)")),
    responses(
        (status = 200, description = "The execution", body = ExecutionInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_execution(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ExecutionInfo>, ApiError> {
    Ok(Json(service.get_execution(&p, &id).await?))
}

/// Cancels an execution: a pending one never runs (its approval is rejected), a running one is
/// ended by its executor; an ended one is answered as it is.
#[utoipa::path(
    post,
    path = "/v1/executions/{execution_id}/cancel",
    tag = "executions",
    params(("execution_id" = String, Path, description = "Execution id (ex-...)")),
    responses(
        (status = 200, description = "The execution after the cancel", body = ExecutionInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn cancel_execution(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ExecutionInfo>, ApiError> {
    Ok(Json(service.cancel_execution(&p, &id).await?))
}
