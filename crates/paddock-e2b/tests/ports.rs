//! E2B's sandbox door to a sandbox's own ports, in-process over the fake backend: who gets through
//! (public ports, the traffic token), and E2B's answers for a closed port and a sandbox it cannot
//! serve. (Upgrades need a real listener: the end-to-end suite has them.)

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt as _;
use paddock_control::{SandboxService, ServiceConfig};
use paddock_e2b::tokens::{TokenKey, TokenKind, KEY_BYTES};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use paddock_e2b::{front_with, E2bConfig, E2bState};
use paddock_runtime::fake::FakeBackend;
use paddock_runtime::AnyBackend;
use paddock_store::Store;
use paddock_types::api::CreateSandboxRequest;
use paddock_types::SandboxId;
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tower::ServiceExt as _;

const DOMAIN: &str = "sandbox.test";

/// A loopback HTTP server answering every request with the request's head as its body.
async fn head_echo() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    head.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.write_all(&head).await;
            });
        }
    });
    addr
}

/// A loopback HTTP/1.1 server that keeps connections alive, answering every GET `ok`, and counts
/// the connections it accepted.
async fn keep_alive_counter() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 1024];
                loop {
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if s.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
            });
        }
    });
    (addr, accepted)
}

fn closed() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
}

struct Setup {
    router: Router,
    pool: paddock_proxy::Pool<paddock_e2b::ports::PoolKey>,
    service: SandboxService,
    backend: FakeBackend,
    key: TokenKey,
    tenant: paddock_control::Principal,
}

async fn setup() -> Setup {
    let backend = FakeBackend::new().expect("fake backend");
    let store = Store::open_in_memory().expect("store");
    let service = SandboxService::start(ServiceConfig::default(), AnyBackend::Fake(backend.clone()), store)
        .await
        .expect("service");
    service.recovered().await;
    let admin = service
        .bootstrap_admin_key()
        .await
        .expect("bootstrap")
        .expect("a key");
    let admin = service.authenticate(&admin.key).await.expect("admin");
    let created = service
        .create_key(
            &admin,
            serde_json::from_value(serde_json::json!({"tenant": "t"})).expect("request"),
        )
        .await
        .expect("key");
    let tenant = service.authenticate(&created.key).await.expect("tenant");
    let key = TokenKey::new([3; KEY_BYTES]);
    let config = E2bConfig {
        token_key: key.clone(),
        domain: Some(DOMAIN.into()),
        internet_access: false,
    };
    let state = E2bState::new(service.clone(), config);
    Setup {
        pool: state.ports_pool.clone(),
        router: front_with(state, Router::new()),
        service,
        backend,
        key,
        tenant,
    }
}

impl Setup {
    async fn sandbox(&self, public: bool) -> SandboxId {
        let request: CreateSandboxRequest =
            serde_json::from_value(serde_json::json!({ "public_ports": public })).expect("request");
        let info = self
            .service
            .create_sandbox(&self.tenant, request)
            .await
            .expect("create");
        let id: SandboxId = info.id.parse().expect("id");
        self.backend.expose_port(&id, 8080, head_echo().await);
        self.backend.expose_port(&id, 8081, closed());
        id
    }

    async fn get(&self, host: &str, headers: &[(&str, &str)]) -> (StatusCode, String) {
        let mut req = Request::builder().uri("/some/path?q=1").header("host", host);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .router
            .clone()
            .oneshot(req.body(Body::empty()).expect("request"))
            .await
            .expect("answer");
        let status = resp.status();
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

fn message(body: &str) -> String {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    v["message"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn public_ports_are_open_to_all_and_private_ones_need_the_token() {
    let s = setup().await;
    let public = s.sandbox(true).await;
    let private = s.sandbox(false).await;

    let (status, head) = s.get(&format!("8080-{public}.{DOMAIN}"), &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(head.starts_with("GET /some/path?q=1 HTTP/1.1\r\n"), "{head}");
    assert!(head.contains(&format!("host: 8080-{public}.{DOMAIN}")), "{head}");

    let private_host = format!("8080-{private}.{DOMAIN}");
    assert_eq!(s.get(&private_host, &[]).await.0, StatusCode::UNAUTHORIZED);
    let wrong = s.key.token(TokenKind::Traffic, &public);
    let envd = s.key.token(TokenKind::Envd, &private);
    for token in [&wrong, &envd] {
        let (status, _) = s.get(&private_host, &[("e2b-traffic-access-token", token)]).await;
        assert_eq!(
            status,
            StatusCode::UNAUTHORIZED,
            "a token of another sandbox or kind"
        );
    }
    let right = s.key.token(TokenKind::Traffic, &private);
    let (status, head) = s
        .get(&private_host, &[("e2b-traffic-access-token", &right)])
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !head.to_ascii_lowercase().contains("e2b-traffic-access-token"),
        "{head}"
    );

    // The routing headers work too, and never reach the sandbox.
    let (status, head) = s
        .get(
            "127.0.0.1:3000",
            &[("e2b-sandbox-id", public.as_str()), ("e2b-sandbox-port", "8080")],
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(!head.to_ascii_lowercase().contains("e2b-sandbox-id"), "{head}");
}

#[tokio::test(flavor = "multi_thread")]
async fn closed_ports_and_sandboxes_it_cannot_serve_get_e2bs_answers() {
    let s = setup().await;
    let id = s.sandbox(true).await;
    let (status, body) = s.get(&format!("8081-{id}.{DOMAIN}"), &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(message(&body), "The sandbox is running but port is not open");

    let (status, body) = s.get(&format!("8080-sb-00000000000000ff.{DOMAIN}"), &[]).await;
    assert_eq!(
        (status, message(&body).as_str()),
        (StatusCode::BAD_GATEWAY, "The sandbox was not found")
    );
    let (status, body) = s.get(&format!("8080-Not_An_Id.{DOMAIN}"), &[]).await;
    assert_eq!(
        (status, message(&body).as_str()),
        (StatusCode::BAD_GATEWAY, "The sandbox was not found")
    );

    s.service.pause_sandbox(&s.tenant, &id).await.expect("pause");
    let (status, body) = s.get(&format!("8080-{id}.{DOMAIN}"), &[]).await;
    assert_eq!(
        (status, message(&body).as_str()),
        (StatusCode::BAD_GATEWAY, "The sandbox was not found")
    );
    s.service.resume_sandbox(&s.tenant, &id).await.expect("resume");
    assert_eq!(s.get(&format!("8080-{id}.{DOMAIN}"), &[]).await.0, StatusCode::OK);
    s.service.kill_sandbox(&s.tenant, &id).await.expect("kill");
    let (status, body) = s.get(&format!("8080-{id}.{DOMAIN}"), &[]).await;
    assert_eq!(
        (status, message(&body).as_str()),
        (StatusCode::BAD_GATEWAY, "The sandbox was not found")
    );
    s.service.shutdown().await;
}

/// Waits until the door's pool holds `n` idle connections (a connection rejoins it in a task once
/// its response was read).
async fn pooled(s: &Setup, n: usize) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while s.pool.idle_connections() != n {
        assert!(
            std::time::Instant::now() < end,
            "the pool never held {n} connections"
        );
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_are_kept_alive_per_sandbox_port_and_credential_and_checked_every_time() {
    let s = setup().await;
    let (addr, accepted) = keep_alive_counter().await;
    let a = s.sandbox(true).await;
    let b = s.sandbox(true).await;
    s.backend.expose_port(&a, 9000, addr);
    s.backend.expose_port(&b, 9000, addr);
    let host_a = format!("9000-{a}.{DOMAIN}");
    for _ in 0..3 {
        assert_eq!(s.get(&host_a, &[]).await, (StatusCode::OK, "ok".to_owned()));
        pooled(&s, 1).await;
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "one connection for one sandbox's port"
    );
    // Another sandbox (behind the same address here) never gets that connection.
    assert_eq!(s.get(&format!("9000-{b}.{DOMAIN}"), &[]).await.0, StatusCode::OK);
    pooled(&s, 2).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    // Nor does a request under another credential (its audit rows name the token).
    let token = s.key.token(TokenKind::Traffic, &a);
    assert_eq!(
        s.get(&host_a, &[("e2b-traffic-access-token", &token)]).await.0,
        StatusCode::OK
    );
    pooled(&s, 3).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    // A kept connection does not let a request past the checks: paused and killed sandboxes
    // answer as missing ones.
    s.service.pause_sandbox(&s.tenant, &a).await.expect("pause");
    let (status, body) = s.get(&host_a, &[]).await;
    assert_eq!(
        (status, message(&body).as_str()),
        (StatusCode::BAD_GATEWAY, "The sandbox was not found")
    );
    s.service.resume_sandbox(&s.tenant, &a).await.expect("resume");
    assert_eq!(s.get(&host_a, &[]).await.0, StatusCode::OK);
    s.service.kill_sandbox(&s.tenant, &a).await.expect("kill");
    assert_eq!(s.get(&host_a, &[]).await.0, StatusCode::BAD_GATEWAY);
    s.service.shutdown().await;
}
