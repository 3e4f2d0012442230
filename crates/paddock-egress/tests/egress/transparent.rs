//! The transparent door: the name comes from SNI or Host and must match what DNS answered.

use std::net::SocketAddr;

use hickory_proto::rr::RecordType;
use paddock_egress::policy::Rule;
use paddock_egress::Door;
use paddock_types::SandboxId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// A connection "redirected" to the proxy whose original destination was `original`: the sandbox's
/// end. The proxy serves the other end on a task.
async fn redirected(h: &Harness, sb: &SandboxId, original: SocketAddr) -> TcpStream {
    let (client, proxy_end) = intercepted_pair().await;
    let (egress, sb) = (h.egress.clone(), sb.clone());
    tokio::spawn(async move { egress.serve_intercepted(&sb, proxy_end, original).await.unwrap() });
    client
}

/// Send `bytes` and read back what the echo server returns (empty when the proxy closed).
async fn exchange(s: &mut TcpStream, bytes: &[u8]) -> Vec<u8> {
    let _ = s.write_all(bytes).await;
    let _ = s.shutdown().await;
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back).await;
    back
}

#[tokio::test]
async fn tls_to_a_pinned_name_is_relayed_and_an_unpinned_one_is_not() {
    let echo = echo_server().await;
    let mut h = egress(operator(&[echo.port()], &[("echo.test", "127.0.0.1")]), None);
    let sb: SandboxId = "sb-tr-1".parse().unwrap();
    let out = h
        .egress
        .add_sandbox(
            sb.clone(),
            policy(r#"{"allow":[{"domain":"echo.test"}]}"#),
            LOOPBACK,
        )
        .await
        .unwrap();
    let hello = client_hello("echo.test");

    // Before any DNS answer, the name is allowed but the address is not one DNS gave for it.
    let mut s = redirected(&h, &sb, echo).await;
    assert!(exchange(&mut s, &hello).await.is_empty());
    let r = h.next_connection().await;
    assert_eq!((r.allowed, r.rule), (false, Rule::NotResolvedForName));
    assert_eq!(r.name.as_ref().map(|n| n.as_str()), Some("echo.test"));

    assert_eq!(
        answers(&dns_query(out.dns_addr, "echo.test.", RecordType::A).await),
        vec![LOOPBACK]
    );
    let mut s = redirected(&h, &sb, echo).await;
    assert_eq!(exchange(&mut s, &hello).await, hello);
    let r = h.next_connection().await;
    assert_eq!(r.door, Door::Transparent);
    assert_eq!((r.allowed, r.rule), (true, Rule::TenantAllow { index: 0 }));
    assert_eq!(
        (r.bytes_up, r.bytes_down),
        (hello.len() as u64, hello.len() as u64)
    );

    // Another name on the same (pinned) address is not allowed.
    let mut s = redirected(&h, &sb, echo).await;
    assert!(exchange(&mut s, &client_hello("other.test")).await.is_empty());
    assert_eq!(h.next_connection().await.rule, Rule::NoAllowRule);
}

#[tokio::test]
async fn http_host_opaque_and_malformed_connections() {
    let echo = echo_server().await;
    let mut h = egress(operator(&[echo.port()], &[("web.test", "127.0.0.1")]), None);
    let sb: SandboxId = "sb-tr-2".parse().unwrap();
    let out = h
        .egress
        .add_sandbox(
            sb.clone(),
            policy(r#"{"allow":[{"domain":"web.test"}]}"#),
            LOOPBACK,
        )
        .await
        .unwrap();
    dns_query(out.dns_addr, "web.test.", RecordType::A).await;
    let req = b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n";
    let mut s = redirected(&h, &sb, echo).await;
    assert_eq!(exchange(&mut s, req).await, req);
    assert!(h.next_connection().await.allowed);

    // No name: only an address rule could allow it, and there is none.
    let mut s = redirected(&h, &sb, echo).await;
    assert!(exchange(&mut s, b"SSH-2.0-test\r\n").await.is_empty());
    let r = h.next_connection().await;
    assert_eq!((r.name, r.rule), (None, Rule::NoAllowRule));

    // Malformed TLS is refused, not guessed at.
    let mut s = redirected(&h, &sb, echo).await;
    assert!(exchange(&mut s, b"\x16\x03\x01\x00\x05hello").await.is_empty());
    assert!(matches!(h.next_connection().await.rule, Rule::Unreadable { .. }));

    // An address rule allows nameless traffic.
    h.egress
        .set_policy(&sb, policy(r#"{"allow":[{"cidr":"127.0.0.1"}]}"#))
        .unwrap();
    let mut s = redirected(&h, &sb, echo).await;
    assert_eq!(exchange(&mut s, b"SSH-2.0-test\r\n").await, b"SSH-2.0-test\r\n");
    assert_eq!(h.next_connection().await.rule, Rule::TenantAllow { index: 0 });
}

#[tokio::test]
async fn unredirected_connections_to_the_transparent_listener_are_refused() {
    let mut h = egress(operator(&[], &[]), None);
    let out = h
        .egress
        .add_sandbox(
            "sb-tr-0".parse().unwrap(),
            policy(r#"{"allow":[{"cidr":"0.0.0.0/0"}]}"#),
            LOOPBACK,
        )
        .await
        .unwrap();
    let mut s = TcpStream::connect(out.transparent_addr).await.unwrap();
    assert!(exchange(&mut s, b"GET / HTTP/1.1\r\nHost: x.test\r\n\r\n")
        .await
        .is_empty());
    let r = h.next_connection().await;
    assert_eq!(r.door, Door::Transparent);
    assert_eq!(r.rule, Rule::NoOriginalDestination);
}
