//! The control plane's HTTP front-end: the REST API over [`paddock_control::SandboxService`] (JSON,
//! NDJSON and SSE streams, WebSockets) and its OpenAPI 3.1 document.
//!
//! It does: authentication headers, request parsing and validation errors, content negotiation,
//! streaming with backpressure, the JSON error shape, request metrics and tracing. It does not: hold
//! business rules (each handler is one service call, so every door applies the same checks and audit
//! rows), speak to the store or the backend, or run SQL.
//!
//! Streams: process output and directory events are pulled from the service one event at a time as
//! the client reads, so a slow client slows its source instead of growing a buffer; when a client
//! disconnects, the response body (or WebSocket session) is dropped and with it the service's stream,
//! which kills a foreground process.

mod auth;
mod error;
mod extract;
mod negotiate;
mod observe;
mod rest;
mod router;
mod stream;

pub use auth::{api_key, Auth, API_KEY_HEADER};
pub use error::ApiError;
pub use extract::{
    ApiJson, ApiPath, ApiQuery, ContextPath, OptionalJson, ProcessPath, SandboxPath, SnapshotPath,
    JSON_BODY_LIMIT,
};
pub use negotiate::{negotiate, StreamFormat};
pub use observe::UNMATCHED_ROUTE;
pub use rest::files::{FilePathQuery, RemoveFileQuery, WatchQuery, WriteFileQuery};
pub use rest::meta::HealthBody;
pub use rest::processes::{StdinQuery, COLLECT_LIMIT};
pub use rest::ws::{pty_request, PtyQuery, WsClientMessage, DEFAULT_TERMINAL_SHELL};
pub use router::{openapi, router};
