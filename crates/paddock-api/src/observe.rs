//! Every request, counted and traced: a span with the method, the route template (never the concrete
//! path, which carries ids), the status and the latency; never headers or bodies. For a streamed
//! response the latency is the time to its headers.

use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use axum::Router;
use paddock_control::SandboxService;
use tracing::Instrument as _;

/// The route recorded for requests no route matched (so metrics do not grow a series per bad path).
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// Where answered requests are counted: the service's metrics (a test double in tests).
pub(crate) trait RequestRecorder: Clone + Send + Sync + 'static {
    /// Counts one answered request.
    fn record(&self, method: &str, route: &str, status: u16, elapsed: Duration);
}

impl RequestRecorder for SandboxService {
    fn record(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        self.record_request(method, route, status, elapsed);
    }
}

/// Wraps every route of `router` (and its fallbacks) in the middleware.
pub(crate) fn observed<S, R>(router: Router<S>, recorder: R) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    R: RequestRecorder,
{
    router.layer(axum::middleware::from_fn_with_state(recorder, observe::<R>))
}

async fn observe<R: RequestRecorder>(State(recorder): State<R>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED_ROUTE, MatchedPath::as_str)
        .to_owned();
    let span = tracing::info_span!(
        "http_request",
        method = %method,
        route = %route,
        status = tracing::field::Empty,
        latency_ms = tracing::field::Empty,
    );
    let start = Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let elapsed = start.elapsed();
    let status = response.status().as_u16();
    span.record("status", status);
    span.record("latency_ms", elapsed.as_secs_f64() * 1000.0);
    span.in_scope(|| tracing::debug!("request answered"));
    recorder.record(method.as_str(), &route, status, elapsed);
    response
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::body::Body;
    use axum::http::Request as HttpRequest;
    use axum::routing::get;
    use tower::ServiceExt as _;

    use super::*;

    #[derive(Debug, Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<(String, String, u16)>>>);

    impl RequestRecorder for Recorded {
        fn record(&self, method: &str, route: &str, status: u16, _elapsed: Duration) {
            self.0
                .lock()
                .expect("lock")
                .push((method.to_owned(), route.to_owned(), status));
        }
    }

    #[tokio::test]
    async fn records_route_templates_and_statuses() {
        let recorded = Recorded::default();
        let routes = Router::new()
            .route("/v1/sandboxes/{id}", get(|| async { "ok" }))
            .route(
                "/boom",
                get(|| async {
                    if true {
                        panic!("handler bug");
                    }
                    "unreachable"
                }),
            );
        let app = observed(crate::router::finish(routes), recorded.clone());
        for (method, uri) in [
            ("GET", "/v1/sandboxes/sb-123"),
            ("DELETE", "/v1/sandboxes/sb-123"),
            ("GET", "/nowhere/sb-123"),
            ("GET", "/boom"),
        ] {
            let request = HttpRequest::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .expect("request");
            let _ = app.clone().oneshot(request).await.expect("infallible");
        }
        let recorded = recorded.0.lock().expect("lock").clone();
        let expected = [
            ("GET", "/v1/sandboxes/{id}", 200),
            ("DELETE", "/v1/sandboxes/{id}", 405),
            ("GET", UNMATCHED_ROUTE, 404),
            ("GET", "/boom", 500),
        ]
        .map(|(m, r, s)| (m.to_owned(), r.to_owned(), s));
        assert_eq!(recorded, expected);
    }
}
