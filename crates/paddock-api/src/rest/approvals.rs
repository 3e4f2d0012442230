//! The approvals queue (`/v1/approvals`): what waits for a person, and their decisions. Any key of
//! the tenant may read; approving and rejecting need an approver or admin key, and the key that
//! asked cannot approve its own request unless the tenant's policy allows it.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;
use paddock_control::SandboxService;
use paddock_types::api::{
    ApprovalEvent, ApprovalInfo, ApprovalList, DecideApprovalRequest, ListApprovalsQuery,
};

use crate::extract::{ApiPath, ApiQuery, OptionalJson};
use crate::negotiate::{negotiate, StreamFormat};
use crate::stream::event_stream_response;
use crate::{ApiError, Auth};

/// Lists the tenant's approvals, newest first (`state=pending` for the queue).
#[utoipa::path(
    get,
    path = "/v1/approvals",
    tag = "approvals",
    params(ListApprovalsQuery),
    responses(
        (status = 200, description = "The approvals", body = ApprovalList),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn list_approvals(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiQuery(q): ApiQuery<ListApprovalsQuery>,
) -> Result<Json<ApprovalList>, ApiError> {
    Ok(Json(service.list_approvals(&p, q).await?))
}

/// Streams the tenant's queue changes as they happen (`requested`, `approved`, `rejected`,
/// `expired`, `used`), as Server-Sent Events (`Accept: text/event-stream`) or NDJSON. It ends if
/// the reader falls far behind: list again, then listen again.
#[utoipa::path(
    get,
    path = "/v1/approvals/events",
    tag = "approvals",
    responses(
        (status = 200, description = "The changes, as they happen", content(
            (ApprovalEvent = "text/event-stream"),
            (ApprovalEvent = "application/x-ndjson"),
        )),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn approval_events(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let format = negotiate(&headers, &[StreamFormat::Sse, StreamFormat::Ndjson]);
    Ok(event_stream_response(service.approval_stream(&p), format))
}

/// One approval: the exact request, the rule that asked, and where it stands.
#[utoipa::path(
    get,
    path = "/v1/approvals/{approval_id}",
    tag = "approvals",
    params(("approval_id" = String, Path, description = "Approval id (apr_...)")),
    responses(
        (status = 200, description = "The approval", body = ApprovalInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn get_approval(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ApprovalInfo>, ApiError> {
    Ok(Json(service.get_approval(&p, &id).await?))
}

/// Approves a pending request: it may run once (the waiting request goes on, or a retry with its
/// `approval_id` runs). Needs an approver or admin key other than the one that asked.
#[utoipa::path(
    post,
    path = "/v1/approvals/{approval_id}/approve",
    tag = "approvals",
    params(("approval_id" = String, Path, description = "Approval id (apr_...)")),
    request_body(content = DecideApprovalRequest, description = "An optional note"),
    responses(
        (status = 200, description = "Approved", body = ApprovalInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn approve(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(id): ApiPath<String>,
    OptionalJson(req): OptionalJson<DecideApprovalRequest>,
) -> Result<Json<ApprovalInfo>, ApiError> {
    Ok(Json(service.approve(&p, &id, req).await?))
}

/// Rejects a pending request: it never runs. Needs an approver or admin key.
#[utoipa::path(
    post,
    path = "/v1/approvals/{approval_id}/reject",
    tag = "approvals",
    params(("approval_id" = String, Path, description = "Approval id (apr_...)")),
    request_body(content = DecideApprovalRequest, description = "An optional note"),
    responses(
        (status = 200, description = "Rejected", body = ApprovalInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn reject(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    ApiPath(id): ApiPath<String>,
    OptionalJson(req): OptionalJson<DecideApprovalRequest>,
) -> Result<Json<ApprovalInfo>, ApiError> {
    Ok(Json(service.reject(&p, &id, req).await?))
}

/// A decision sent back by the operator's approval system (a chat bot, a ticketing tool), signed
/// with the webhook's key instead of an API key: `Paddock-Signature: t=<unix time>,v1=<hex
/// HMAC-SHA256 of "<t>.<body>">` over the exact body `{"decision": "approve"|"reject",
/// "approver": "who", "note": "..."}`, within five minutes. Recorded as decided by
/// `webhook:<approver>`.
#[utoipa::path(
    post,
    path = "/v1/approvals/{approval_id}/callback",
    tag = "approvals",
    params(
        ("approval_id" = String, Path, description = "Approval id (apr_...)"),
        ("Paddock-Signature" = String, Header, description = "t=<unix time>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">"),
    ),
    request_body(content = Object, description = "{\"decision\": \"approve\" | \"reject\", \"approver\": \"...\", \"note\": \"...\"}"),
    responses(
        (status = 200, description = "Decided", body = ApprovalInfo),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    ),
    security(())
)]
pub(crate) async fn callback(
    Signature(signature): Signature,
    State(service): State<SandboxService>,
    ApiPath(id): ApiPath<String>,
    body: axum::body::Bytes,
) -> Result<Json<ApprovalInfo>, ApiError> {
    Ok(Json(
        service.decide_by_callback(&id, Some(&signature), &body).await?,
    ))
}

/// The `Paddock-Signature` header, taken before anything else: a request without one is refused
/// (`401 unauthorized`) as one without an API key is elsewhere.
pub(crate) struct Signature(String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Signature {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, ApiError> {
        parts
            .headers
            .get("paddock-signature")
            .and_then(|v| v.to_str().ok())
            .map(|v| Self(v.to_owned()))
            .ok_or_else(|| {
                ApiError::new(
                    paddock_types::api::ErrorCode::Unauthorized,
                    "a callback must carry a Paddock-Signature header",
                )
            })
    }
}
