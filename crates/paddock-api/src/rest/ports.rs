//! A sandbox's own ports: HTTP requests (WebSocket upgrades included) proxied to a server running
//! inside it (`.../ports/{port}/http/...`), and a raw TCP tunnel over a WebSocket
//! (`.../ports/{port}/tcp`, what `paddock sandbox port-forward` uses). Each is one
//! `SandboxService::connect_port` call; the request's API key never reaches the sandbox.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket};
use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{SinkExt as _, StreamExt as _};
use paddock_control::{PortDoor, PortStream, SandboxService};
use paddock_proxy::{Forward, ForwardError};
use paddock_types::api::ErrorCode;
use paddock_types::SandboxId;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::ws::Upgrade;
use crate::extract::{sandbox_id, ApiPath};
use crate::{ApiError, Auth, API_KEY_HEADER};

/// Fields that carry the caller's credentials for paddock, never forwarded.
const STRIP: &[&str] = &["authorization", API_KEY_HEADER];
/// Bytes read from the sandbox's port per WebSocket message of a tunnel.
const TUNNEL_CHUNK: usize = 32 * 1024;
/// The largest message a tunnel's client may send.
const TUNNEL_MAX_MESSAGE: usize = 1024 * 1024;
/// Pings keep an idle tunnel open through proxies and reveal a vanished client.
const PING_INTERVAL: Duration = Duration::from_secs(30);

/// `{id}` and `{port}` of the path (a malformed id answers as a missing sandbox).
#[derive(Debug)]
pub(crate) struct PortPath(SandboxId, u16);

impl<S: Send + Sync> FromRequestParts<S> for PortPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath((raw, port)) = ApiPath::<(String, String)>::from_request_parts(parts, state).await?;
        let id = sandbox_id(&raw)?;
        let port =
            port.parse().ok().filter(|p| *p != 0).ok_or_else(|| {
                ApiError::invalid(Some("port".into()), format!("{port:?} is not a TCP port"))
            })?;
        Ok(Self(id, port))
    }
}

/// `{id}`, `{port}` and `{path}` of the path.
#[derive(Debug)]
pub(crate) struct PortPathRest(SandboxId, u16, String);

impl<S: Send + Sync> FromRequestParts<S> for PortPathRest {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let ApiPath((raw, port, rest)) =
            ApiPath::<(String, String, String)>::from_request_parts(parts, state).await?;
        let id = sandbox_id(&raw)?;
        let port =
            port.parse().ok().filter(|p| *p != 0).ok_or_else(|| {
                ApiError::invalid(Some("port".into()), format!("{port:?} is not a TCP port"))
            })?;
        Ok(Self(id, port, rest))
    }
}

/// Proxies a request to the root (`/`) of a server in the sandbox.
#[utoipa::path(
    method(get, post, put, patch, delete, head, options),
    path = "/v1/sandboxes/{id}/ports/{port}/http/",
    tag = "ports",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("port" = u16, Path, description = "TCP port a server in the sandbox listens on (its loopback or any address)"),
    ),
    responses(
        (status = 200, description = "The sandbox's server's answer, whatever it is (any status; a WebSocket upgrade is piped through)"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn proxy_port_root(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    PortPath(id, port): PortPath,
    req: Request,
) -> Response {
    forward(&service, &p, &id, port, "", req).await
}

/// Proxies a request to a server in the sandbox: `{path}` and the query string are the upstream's
/// path and query, `Host` is `localhost:{port}` (the original in `X-Forwarded-Host`), and the API
/// key is removed. WebSocket upgrades are piped through.
#[utoipa::path(
    method(get, post, put, patch, delete, head, options),
    path = "/v1/sandboxes/{id}/ports/{port}/http/{path}",
    tag = "ports",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("port" = u16, Path, description = "TCP port a server in the sandbox listens on (its loopback or any address)"),
        ("path" = String, Path, description = "The upstream path (without its leading `/`)"),
    ),
    responses(
        (status = 200, description = "The sandbox's server's answer, whatever it is (any status; a WebSocket upgrade is piped through)"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn proxy_port(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    PortPathRest(id, port, path): PortPathRest,
    req: Request,
) -> Response {
    forward(&service, &p, &id, port, &path, req).await
}

async fn forward(
    service: &SandboxService,
    p: &paddock_control::Principal,
    id: &SandboxId,
    port: u16,
    path: &str,
    req: Request,
) -> Response {
    let stream = match service.connect_port(p, id, port, PortDoor::Api).await {
        Ok(stream) => stream,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
    let fwd = Forward {
        client: req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0),
        proto: "http",
        host: Some(format!("localhost:{port}")),
        path_and_query: Some(format!("/{path}{query}")),
        strip: STRIP,
    };
    match paddock_proxy::forward(req, stream, &fwd).await {
        Ok(resp) => resp.map(Body::new),
        Err(ForwardError::BadRequest(status, message)) => {
            let mut e = ApiError::invalid(None, message);
            e.set_status(status);
            e.into_response()
        }
        Err(e @ ForwardError::Upstream(_)) => {
            let mut e = ApiError::from(paddock_control::ServiceError::new(
                ErrorCode::Unavailable,
                format!("port {port} of sandbox {id}: {e}"),
            ));
            e.set_status(StatusCode::BAD_GATEWAY);
            e.into_response()
        }
    }
}

/// A raw TCP connection to a port of the sandbox, over a WebSocket: binary messages carry the
/// bytes both ways; an empty binary message from the client closes the connection's sending side
/// (a half-close); the server closes the WebSocket when the sandbox's side closes. Refused before
/// the upgrade (an ordinary error answer) when the connection cannot be made.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/ports/{port}/tcp",
    tag = "ports",
    params(
        ("id" = String, Path, description = "Sandbox id"),
        ("port" = u16, Path, description = "TCP port a server in the sandbox listens on"),
    ),
    responses(
        (status = 101, description = "Switching to the WebSocket protocol"),
        (status = "4XX", response = ApiError),
        (status = "5XX", response = ApiError),
    )
)]
pub(crate) async fn port_tunnel(
    Auth(p): Auth,
    State(service): State<SandboxService>,
    Upgrade(ws): Upgrade,
    PortPath(id, port): PortPath,
) -> Response {
    let stream = match service.connect_port(&p, &id, port, PortDoor::Api).await {
        Ok(stream) => stream,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let mut resp = ws
        .max_message_size(TUNNEL_MAX_MESSAGE)
        .on_upgrade(move |socket| tunnel(socket, stream));
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}

async fn tunnel(socket: WebSocket, stream: PortStream) {
    let (mut to_client, mut from_client) = socket.split();
    let (mut from_port, mut to_port) = tokio::io::split(stream);
    // Client → port, until the client closes (or sends what a tunnel does not carry).
    let up = async move {
        while let Some(Ok(message)) = from_client.next().await {
            match message {
                Message::Binary(data) if data.is_empty() => {
                    if to_port.shutdown().await.is_err() {
                        return;
                    }
                }
                Message::Binary(data) => {
                    if to_port.write_all(&data).await.is_err() {
                        return;
                    }
                }
                Message::Close(_) | Message::Text(_) => return,
                Message::Ping(_) | Message::Pong(_) => {}
            }
        }
    };
    // Port → client, until the port's side closes; then the WebSocket is closed.
    let down = async move {
        let mut buf = vec![0u8; TUNNEL_CHUNK];
        let mut ping = tokio::time::interval(PING_INTERVAL);
        ping.tick().await;
        loop {
            tokio::select! {
                read = from_port.read(&mut buf) => match read {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if to_client.send(Message::Binary(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                            return;
                        }
                    }
                },
                _ = ping.tick() => {
                    if to_client.send(Message::Ping(Bytes::new())).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = to_client.send(Message::Close(None)).await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
