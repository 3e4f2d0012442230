//! The route table, the router built from it and the OpenAPI document generated from it.
//!
//! There is one table ([`route_table`]): each entry is a handler whose `#[utoipa::path]` attribute
//! gives its method and path, and `utoipa_axum` registers it in the router and in the document at
//! once, so a route cannot be served undocumented or documented unserved (a test checks both ways).

use std::sync::OnceLock;

use axum::extract::FromRef;
use axum::http::{Method, Uri};
use axum::Router;
use paddock_control::SandboxService;
use paddock_types::api::{ApiErrorBody, ErrorCode, ExecEvent, WatchEvent};
use tower_http::catch_panic::CatchPanicLayer;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::rest::{
    admin, approvals, code, executions, files, meta, network, policies, ports, processes, sandboxes,
    snapshot_transfer, snapshots, templates, volumes, ws,
};
use crate::{observe, ApiError};

/// The API's router: every route of the table, JSON answers for unknown endpoints (404) and methods
/// (405), panics turned into `500 internal`, and every request traced and counted with the service.
/// Serve it with `axum::serve`, or drive it in tests with `tower::ServiceExt::oneshot`.
pub fn router(service: SandboxService) -> Router {
    let (routes, _) = route_table::<SandboxService>().split_for_parts();
    observe::observed(finish(routes), service.clone()).with_state(service)
}

/// The OpenAPI 3.1 document of [`router`] (served at `/openapi.json`).
pub fn openapi() -> utoipa::openapi::OpenApi {
    route_table::<SandboxService>().into_openapi()
}

/// The document as served: pretty JSON, built once.
pub(crate) fn openapi_text() -> String {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        openapi().to_pretty_json().unwrap_or_else(|e| {
            tracing::error!(error = %e, "failed to serialize the OpenAPI document");
            "{}".to_owned()
        })
    })
    .clone()
}

/// Every route. Generic over the router state so tests can route requests without a live service
/// (handlers only ask the state for the service after authentication succeeded).
fn route_table<S>() -> OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
    SandboxService: FromRef<S>,
{
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(meta::healthz))
        .routes(routes!(meta::metrics))
        .routes(routes!(meta::openapi_json))
        .routes(routes!(templates::list_templates, templates::build_template))
        .routes(routes!(templates::get_template, templates::delete_template))
        .routes(routes!(templates::import_template))
        .routes(routes!(sandboxes::create_sandbox))
        .routes(routes!(sandboxes::list_sandboxes))
        .routes(routes!(sandboxes::get_sandbox))
        .routes(routes!(sandboxes::kill_sandbox))
        .routes(routes!(sandboxes::set_timeout))
        .routes(routes!(sandboxes::sandbox_usage))
        .routes(routes!(snapshots::create_snapshot))
        .routes(routes!(snapshots::list_snapshots))
        .routes(routes!(snapshots::get_snapshot))
        .routes(routes!(snapshots::delete_snapshot))
        .routes(routes!(snapshots::fork_sandbox))
        .routes(routes!(snapshots::checkpoint))
        .routes(routes!(snapshots::commit))
        .routes(routes!(snapshots::rollback))
        .routes(routes!(snapshots::pause_sandbox))
        .routes(routes!(snapshots::stop_sandbox))
        .routes(routes!(snapshots::resume_sandbox))
        .routes(routes!(snapshots::diff_sandbox))
        .routes(routes!(snapshot_transfer::export_snapshot))
        .routes(routes!(snapshot_transfer::import_snapshot))
        .routes(routes!(volumes::create_volume))
        .routes(routes!(volumes::list_volumes))
        .routes(routes!(volumes::get_volume))
        .routes(routes!(volumes::delete_volume))
        .routes(routes!(network::get_network, network::set_network))
        .routes(routes!(network::create_secret, network::list_secrets))
        .routes(routes!(network::delete_secret))
        .routes(routes!(
            policies::get_tenant_policy,
            policies::set_tenant_policy,
            policies::delete_tenant_policy
        ))
        .routes(routes!(
            policies::get_sandbox_policy,
            policies::set_sandbox_policy,
            policies::delete_sandbox_policy
        ))
        .routes(routes!(approvals::list_approvals))
        .routes(routes!(approvals::approval_events))
        .routes(routes!(approvals::get_approval))
        .routes(routes!(approvals::approve))
        .routes(routes!(approvals::reject))
        .routes(routes!(approvals::callback))
        .routes(routes!(executions::create_execution, executions::list_executions))
        .routes(routes!(executions::get_execution))
        .routes(routes!(executions::cancel_execution))
        .routes(routes!(processes::exec))
        .routes(routes!(code::run_code))
        .routes(routes!(code::create_context, code::list_contexts))
        .routes(routes!(code::restart_context))
        .routes(routes!(code::delete_context))
        .routes(routes!(ws::exec_ws))
        .routes(routes!(processes::list_processes))
        .routes(routes!(processes::process_output))
        .routes(routes!(processes::write_stdin))
        .routes(routes!(processes::signal_process))
        .routes(routes!(processes::kill_process))
        .routes(routes!(processes::resize_pty))
        .routes(routes!(ws::pty_ws))
        .routes(routes!(ports::proxy_port_root))
        .routes(routes!(ports::proxy_port))
        .routes(routes!(ports::port_tunnel))
        .routes(routes!(files::read_file))
        .routes(routes!(files::write_file))
        .routes(routes!(files::remove_file))
        .routes(routes!(files::list_dir))
        .routes(routes!(files::stat_file))
        .routes(routes!(files::make_dir))
        .routes(routes!(files::rename_file))
        .routes(routes!(files::download_tar))
        .routes(routes!(files::upload_tar))
        .routes(routes!(files::watch_dir))
        .routes(routes!(admin::query_audit))
        .routes(routes!(admin::verify_audit))
        .routes(routes!(admin::create_key))
        .routes(routes!(admin::list_keys))
        .routes(routes!(admin::revoke_key))
        .routes(routes!(admin::list_tenants))
        .routes(routes!(admin::get_tenant))
        .routes(routes!(admin::set_tenant_quota))
}

/// What every router gets besides its routes: the JSON fallbacks and the panic guard.
pub(crate) fn finish<S: Clone + Send + Sync + 'static>(routes: Router<S>) -> Router<S> {
    routes
        .fallback(no_such_endpoint)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(CatchPanicLayer::custom(crate::error::panic_response))
}

async fn no_such_endpoint(method: Method, uri: Uri) -> ApiError {
    ApiError::no_such_endpoint(method.as_str(), uri.path())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// The document's frame; the paths and their schemas come from the route table.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "paddock",
        version = "v1",
        description = "The paddock control plane: disposable Linux sandboxes for AI agents. Every \
            endpoint but `/healthz` needs an API key, as `Authorization: Bearer <key>` or `X-API-Key: \
            <key>` (an approval callback is signed with the webhook's key instead). Every error is an `ApiErrorBody` whose `code` is stable.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    modifiers(&SecuritySchemes),
    security(("bearer" = []), ("api_key" = [])),
    tags(
        (name = "meta", description = "Health, metrics and this document"),
        (name = "sandboxes", description = "Sandbox lifecycle"),
        (name = "processes", description = "Running and talking to processes"),
        (name = "files", description = "Files inside a sandbox"),
        (name = "snapshots", description = "Snapshots of a sandbox's files (never its memory), forks, checkpoint / rollback / commit, pause, stop and resume"),
        (name = "network", description = "Sandbox networks through paddock's egress proxy: policies, recent connections, and secrets injected into requests to bound hosts"),
        (name = "approvals", description = "The approvals queue: requests an approval policy held for a person, listed, streamed as they change, approved (by an approver key other than the one that asked) or rejected"),
        (name = "executions", description = "Approved executions: a command proposed for a person to approve, run once afterwards on the server's executor (a fresh sandbox, or a Kubernetes Job), with its state, exit code and capped logs"),
        (name = "policies", description = "Approval policies: which exec requests, file writes and network destinations a person must approve, for the tenant and for one sandbox (set and deleted with an approver or admin key)"),
        (name = "templates", description = "Templates sandboxes start from: the server's, and those built from registry images for the caller"),
        (name = "volumes", description = "Named volumes: persistent storage shared by the sandboxes that mount it, outliving them; not part of a sandbox's snapshots or diffs"),
        (name = "admin", description = "Audit log, API keys and tenants"),
    ),
    components(
        schemas(ApiErrorBody, ErrorCode, ExecEvent, WatchEvent, ws::WsClientMessage),
        responses(ApiError),
    )
)]
struct ApiDoc;

/// Adds the two ways of presenting a key.
struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    use super::*;

    /// A router state without a service: enough to route and to refuse unauthenticated requests.
    #[derive(Debug, Clone)]
    struct NoService;

    impl FromRef<NoService> for SandboxService {
        fn from_ref(_: &NoService) -> Self {
            panic!("an unauthenticated request reached the service");
        }
    }

    fn app() -> Router {
        let (routes, _) = route_table::<NoService>().split_for_parts();
        finish(routes).with_state(NoService)
    }

    /// The API as specified: (method, path template).
    const EXPECTED: &[(&str, &str)] = &[
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("GET", "/openapi.json"),
        ("GET", "/v1/templates"),
        ("POST", "/v1/templates"),
        ("POST", "/v1/templates/import"),
        ("GET", "/v1/templates/{template}"),
        ("DELETE", "/v1/templates/{template}"),
        ("POST", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes"),
        ("GET", "/v1/sandboxes/{id}"),
        ("DELETE", "/v1/sandboxes/{id}"),
        ("POST", "/v1/sandboxes/{id}/timeout"),
        ("GET", "/v1/sandboxes/{id}/usage"),
        ("POST", "/v1/sandboxes/{id}/exec"),
        ("POST", "/v1/sandboxes/{id}/code"),
        ("POST", "/v1/sandboxes/{id}/contexts"),
        ("GET", "/v1/sandboxes/{id}/contexts"),
        ("POST", "/v1/sandboxes/{id}/contexts/{context}/restart"),
        ("DELETE", "/v1/sandboxes/{id}/contexts/{context}"),
        ("GET", "/v1/sandboxes/{id}/exec/ws"),
        ("GET", "/v1/sandboxes/{id}/processes"),
        ("GET", "/v1/sandboxes/{id}/processes/{pid}/output"),
        ("POST", "/v1/sandboxes/{id}/processes/{pid}/stdin"),
        ("POST", "/v1/sandboxes/{id}/processes/{pid}/signal"),
        ("POST", "/v1/sandboxes/{id}/processes/{pid}/kill"),
        ("POST", "/v1/sandboxes/{id}/processes/{pid}/resize"),
        ("GET", "/v1/sandboxes/{id}/pty"),
        ("GET", "/v1/sandboxes/{id}/ports/{port}/http/"),
        ("POST", "/v1/sandboxes/{id}/ports/{port}/http/"),
        ("PUT", "/v1/sandboxes/{id}/ports/{port}/http/"),
        ("PATCH", "/v1/sandboxes/{id}/ports/{port}/http/"),
        ("DELETE", "/v1/sandboxes/{id}/ports/{port}/http/"),
        ("GET", "/v1/sandboxes/{id}/ports/{port}/http/{path}"),
        ("POST", "/v1/sandboxes/{id}/ports/{port}/http/{path}"),
        ("PUT", "/v1/sandboxes/{id}/ports/{port}/http/{path}"),
        ("PATCH", "/v1/sandboxes/{id}/ports/{port}/http/{path}"),
        ("DELETE", "/v1/sandboxes/{id}/ports/{port}/http/{path}"),
        ("GET", "/v1/sandboxes/{id}/ports/{port}/tcp"),
        ("GET", "/v1/sandboxes/{id}/files"),
        ("PUT", "/v1/sandboxes/{id}/files"),
        ("DELETE", "/v1/sandboxes/{id}/files"),
        ("GET", "/v1/sandboxes/{id}/files/list"),
        ("GET", "/v1/sandboxes/{id}/files/stat"),
        ("POST", "/v1/sandboxes/{id}/files/mkdir"),
        ("POST", "/v1/sandboxes/{id}/files/rename"),
        ("GET", "/v1/sandboxes/{id}/files/tar"),
        ("PUT", "/v1/sandboxes/{id}/files/tar"),
        ("GET", "/v1/sandboxes/{id}/files/watch"),
        ("GET", "/v1/audit"),
        ("GET", "/v1/audit/verify"),
        ("POST", "/v1/keys"),
        ("GET", "/v1/keys"),
        ("DELETE", "/v1/keys/{key_id}"),
        ("GET", "/v1/tenants"),
        ("GET", "/v1/tenants/{name}"),
        ("PUT", "/v1/tenants/{name}/quota"),
        ("POST", "/v1/sandboxes/{id}/snapshots"),
        ("GET", "/v1/snapshots"),
        ("GET", "/v1/snapshots/{snapshot_id}"),
        ("DELETE", "/v1/snapshots/{snapshot_id}"),
        ("POST", "/v1/sandboxes/{id}/fork"),
        ("POST", "/v1/sandboxes/{id}/checkpoint"),
        ("POST", "/v1/sandboxes/{id}/commit"),
        ("POST", "/v1/sandboxes/{id}/rollback"),
        ("POST", "/v1/sandboxes/{id}/pause"),
        ("POST", "/v1/sandboxes/{id}/stop"),
        ("POST", "/v1/sandboxes/{id}/resume"),
        ("GET", "/v1/sandboxes/{id}/diff"),
        ("GET", "/v1/snapshots/{snapshot_id}/export"),
        ("POST", "/v1/snapshots/import"),
        ("POST", "/v1/volumes"),
        ("GET", "/v1/volumes"),
        ("GET", "/v1/volumes/{volume_id}"),
        ("DELETE", "/v1/volumes/{volume_id}"),
        ("GET", "/v1/sandboxes/{id}/network"),
        ("PUT", "/v1/sandboxes/{id}/network"),
        ("POST", "/v1/secrets"),
        ("GET", "/v1/secrets"),
        ("DELETE", "/v1/secrets/{secret_name}"),
        ("GET", "/v1/policy"),
        ("PUT", "/v1/policy"),
        ("DELETE", "/v1/policy"),
        ("GET", "/v1/sandboxes/{id}/policy"),
        ("PUT", "/v1/sandboxes/{id}/policy"),
        ("DELETE", "/v1/sandboxes/{id}/policy"),
        ("GET", "/v1/approvals"),
        ("GET", "/v1/approvals/events"),
        ("GET", "/v1/approvals/{approval_id}"),
        ("POST", "/v1/approvals/{approval_id}/approve"),
        ("POST", "/v1/approvals/{approval_id}/reject"),
        ("POST", "/v1/approvals/{approval_id}/callback"),
        ("POST", "/v1/executions"),
        ("GET", "/v1/executions"),
        ("GET", "/v1/executions/{execution_id}"),
        ("POST", "/v1/executions/{execution_id}/cancel"),
    ];

    const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

    fn documented() -> BTreeSet<(String, String)> {
        let doc = serde_json::to_value(openapi()).expect("document serializes");
        let paths = doc["paths"].as_object().expect("paths");
        let mut routes = BTreeSet::new();
        for (path, item) in paths {
            for method in item.as_object().expect("path item").keys() {
                let method = method.to_ascii_uppercase();
                if METHODS.contains(&method.as_str()) {
                    routes.insert((method, path.clone()));
                }
            }
        }
        routes
    }

    fn concrete(template: &str) -> String {
        template
            .replace("{id}", "sb-1")
            .replace("{pid}", "42")
            .replace("{key_id}", "key-1")
            .replace("{name}", "acme")
            .replace("{volume_id}", "data")
            .replace("{secret_name}", "GH")
            .replace("{approval_id}", "apr_1")
            .replace("{execution_id}", "ex-1")
    }

    async fn call(app: &Router, method: &str, path: &str) -> (StatusCode, serde_json::Value) {
        let response = app
            .clone()
            .oneshot(
                Request::builder()
                    .method(method)
                    .uri(path)
                    .body(Body::empty())
                    .expect("request"),
            )
            .await
            .expect("infallible");
        let status = response.status();
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (status, json)
    }

    #[test]
    fn the_document_lists_exactly_the_specified_routes() {
        let expected: BTreeSet<(String, String)> = EXPECTED
            .iter()
            .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
            .collect();
        assert_eq!(expected.len(), EXPECTED.len(), "duplicates in EXPECTED");
        let documented = documented();
        let missing: Vec<_> = expected.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&expected).collect();
        assert!(missing.is_empty(), "specified but not documented: {missing:?}");
        assert!(extra.is_empty(), "documented but not specified: {extra:?}");
    }

    #[tokio::test]
    async fn every_documented_route_is_served_and_no_other_method() {
        let app = app();
        let documented = documented();
        let paths: BTreeSet<&String> = documented.iter().map(|(_, p)| p).collect();
        for path in paths {
            let uri = concrete(path);
            for method in METHODS {
                let (status, body) = call(&app, method, &uri).await;
                if documented.contains(&(method.to_owned(), path.clone())) {
                    if path == "/healthz" {
                        assert_eq!(status, StatusCode::OK);
                        assert_eq!(body, serde_json::json!({"status": "ok"}));
                    } else {
                        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {body}");
                        assert_eq!(body["code"], "unauthorized");
                    }
                } else {
                    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}: {body}");
                    assert_eq!(body["code"], "invalid_request");
                }
            }
        }
    }

    #[tokio::test]
    async fn unknown_endpoints_answer_json() {
        let app = app();
        let (status, body) = call(&app, "GET", "/v2/sandboxes?x=1").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            body,
            serde_json::json!({"code": "invalid_request", "message": "no such endpoint: GET /v2/sandboxes"})
        );
        let (status, body) = call(&app, "POST", "/healthz").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(body["message"], "method not allowed: POST /healthz");
        let (status, _) = call(&app, "GET", "/v1/sandboxes/a/b/c/d").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[test]
    fn the_document_is_openapi_3_1_with_key_security() {
        let doc = serde_json::to_value(openapi()).expect("document serializes");
        assert!(doc["openapi"].as_str().expect("version").starts_with("3.1"));
        let schemes = &doc["components"]["securitySchemes"];
        assert_eq!(schemes["bearer"]["scheme"], "bearer");
        assert_eq!(schemes["api_key"]["name"], "X-API-Key");
        assert_eq!(
            doc["paths"]["/healthz"]["get"]["security"],
            serde_json::json!([{}])
        );
        for (_, path) in documented() {
            for (method, op) in doc["paths"][&path].as_object().expect("item") {
                assert!(
                    op["operationId"].is_string(),
                    "{method} {path} has no operation id"
                );
                assert!(
                    op["tags"].as_array().is_some_and(|t| !t.is_empty()),
                    "{method} {path} untagged"
                );
            }
        }
    }
}
