//! Connections to a sandbox's ports: tenancy, refusals, caps and their audit rows.

use paddock_control::PortDoor;
use paddock_types::api::ErrorCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixture::{code, error, sid, Fixture, NO_SUCH_SANDBOX};

/// A loopback echo server (one connection at a time, forever) and its address.
async fn echo() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// An address nothing listens on (a listener's, closed).
fn closed() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

#[tokio::test(flavor = "multi_thread")]
async fn the_owner_connects_and_others_see_nothing() {
    let f = Fixture::start().await;
    let sb = f.create(&f.a, json!({})).await;
    f.backend.expose_port(&sb.id, 8080, echo().await);
    f.backend.expose_port(&sb.id, 8081, closed());

    let mut conn = f
        .service
        .connect_port(&f.a, &sb.id, 8080, PortDoor::Api)
        .await
        .expect("connects");
    conn.write_all(b"ping").await.expect("write");
    let mut buf = [0u8; 4];
    conn.read_exact(&mut buf).await.expect("read");
    assert_eq!(&buf, b"ping");

    // Another tenant's sandbox and a missing one are the same answer.
    let other = error(f.service.connect_port(&f.b, &sb.id, 8080, PortDoor::Api).await);
    let missing = error(
        f.service
            .connect_port(&f.b, &sid(NO_SUCH_SANDBOX), 8080, PortDoor::Api)
            .await,
    );
    assert_eq!(other.code, ErrorCode::SandboxNotFound);
    assert_eq!(missing.code, ErrorCode::SandboxNotFound);
    assert_eq!(
        other.message.replace(sb.id.as_str(), "X"),
        missing.message.replace(NO_SUCH_SANDBOX, "X")
    );

    assert_eq!(
        code(f.service.connect_port(&f.a, &sb.id, 8081, PortDoor::Api).await),
        ErrorCode::PortClosed
    );
    assert_eq!(
        code(f.service.connect_port(&f.a, &sb.id, 0, PortDoor::Api).await),
        ErrorCode::InvalidRequest
    );

    f.service.pause_sandbox(&f.a, &sb.id).await.expect("pause");
    assert_eq!(f.service.live_sandbox_ports_public(&sb.id), None);
    assert_eq!(
        code(f.service.connect_port(&f.a, &sb.id, 8080, PortDoor::Api).await),
        ErrorCode::SandboxNotRunning
    );
    f.service.resume_sandbox(&f.a, &sb.id).await.expect("resume");
    f.service.kill_sandbox(&f.a, &sb.id).await.expect("kill");
    assert_eq!(
        code(f.service.connect_port(&f.a, &sb.id, 8080, PortDoor::Api).await),
        ErrorCode::SandboxNotRunning
    );
    drop(conn);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn public_ports_are_recorded_with_the_sandbox() {
    let f = Fixture::start().await;
    let private = f.create(&f.a, json!({})).await;
    let public = f.create(&f.a, json!({ "public_ports": true })).await;
    assert!(!private.public_ports && public.public_ports);
    assert_eq!(f.service.live_sandbox_ports_public(&private.id), Some(false));
    assert_eq!(f.service.live_sandbox_ports_public(&public.id), Some(true));
    let got = f.service.get_sandbox(&f.a, &public.id).await.expect("get");
    assert!(got.public_ports);
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_are_capped_and_their_rows_folded() {
    let f = Fixture::with(|c| {
        c.ports.per_sandbox = 3;
        c.ports.audit_window = std::time::Duration::from_millis(200);
    })
    .await;
    let sb = f.create(&f.a, json!({})).await;
    f.backend.expose_port(&sb.id, 80, echo().await);
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(
            f.service
                .connect_port(&f.a, &sb.id, 80, PortDoor::E2b)
                .await
                .expect("connects"),
        );
    }
    let over = error(f.service.connect_port(&f.a, &sb.id, 80, PortDoor::E2b).await);
    assert_eq!(over.code, ErrorCode::QuotaExceeded);
    assert_eq!(over.field.as_deref(), Some("port_connections"));
    open.pop();
    open.push(
        f.service
            .connect_port(&f.a, &sb.id, 80, PortDoor::E2b)
            .await
            .expect("a place came back"),
    );
    drop(open);

    // Four connections: one row at once, the three repeats on one row when the window ends.
    let rows = crate::fixture::poll("the aggregate row", || async {
        let rows = f.rows("sandbox.port_connect").await;
        (rows.len() == 2).then_some(rows)
    })
    .await;
    assert_eq!(rows[0].detail["count"], 1);
    assert_eq!(rows[0].detail["door"], "e2b");
    assert_eq!(rows[0].detail["port"], 80);
    assert_eq!(rows[1].detail["count"], 3);
    assert_eq!(rows[0].key_id, rows[1].key_id);
    assert_eq!(rows[1].sandbox_id.as_deref(), Some(sb.id.as_str()));
    f.finish().await;
}
