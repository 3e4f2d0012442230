//! What one sandbox can make the proxy hold: connections per door and per sandbox, descriptors
//! across sandboxes, idle and total lifetimes, DNS over TCP. Over a cap, a connection is reset at
//! once and counted; another door, another sandbox and DNS over UDP go on being served. Timeouts
//! are checked in tokio's paused time (the clock jumps when every task waits), never by sleeping.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use paddock_egress::{Cut, EgressLimits, Limit};
use paddock_types::SandboxId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

fn id(s: &str) -> SandboxId {
    s.parse().unwrap()
}

/// Whether the proxy closed `s` without a word (reset or EOF), within the tests' wait.
async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) | Err(_) => false,
    }
}

/// A tunnel through the proxy to the echo server that answers.
async fn tunnel(proxy: SocketAddr, echo: SocketAddr) -> TcpStream {
    let (status, mut s) = connect_via(proxy, &format!("echo.test:{}", echo.port())).await;
    assert_eq!(status, 200);
    s.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    s.read_exact(&mut back).await.unwrap();
    s
}

fn dns_question(name: &str) -> Vec<u8> {
    let mut q = Message::new();
    q.set_id(9)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let bytes = q.to_vec().unwrap();
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&bytes);
    framed
}

/// Asks one question over DNS/TCP; `None` when the connection was closed instead.
async fn ask_tcp(s: &mut TcpStream, name: &str) -> Option<Message> {
    s.write_all(&dns_question(name)).await.ok()?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.ok()?;
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
    s.read_exact(&mut reply).await.ok()?;
    Some(Message::from_vec(&reply).unwrap())
}

#[tokio::test]
async fn connections_over_a_doors_cap_are_reset_and_counted_and_nothing_else_waits() {
    let echo = echo_server().await;
    let limits = EgressLimits {
        proxy_connections: 3,
        ..EgressLimits::default()
    };
    let mut h = egress_with(
        operator(&[echo.port()], &[("echo.test", "127.0.0.1")]),
        None,
        limits,
    );
    let p = || policy(r#"{"allow":[{"domain":"echo.test"}]}"#);
    let a = h.egress.add_sandbox(id("sb-cap-a"), p(), LOOPBACK).await.unwrap();
    let b = h.egress.add_sandbox(id("sb-cap-b"), p(), LOOPBACK).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tunnel(a.proxy_addr, echo).await);
    }
    // The fourth and later: reset at once, whatever they would have asked.
    for _ in 0..20 {
        let mut s = TcpStream::connect(a.proxy_addr).await.unwrap();
        let _ = s
            .write_all(format!("CONNECT echo.test:{} HTTP/1.1\r\n\r\n", echo.port()).as_bytes())
            .await;
        assert!(closed(&mut s).await, "a connection over the cap was served");
    }
    let r = h.next_refusal().await;
    assert_eq!(
        (r.sandbox, r.limit, r.count),
        (id("sb-cap-a"), Limit::ProxyConnections, 1)
    );
    // Another sandbox's proxy, and the same sandbox's DNS, are served meanwhile.
    drop(tunnel(b.proxy_addr, echo).await);
    assert_eq!(
        answers(&dns_query(a.dns_addr, "echo.test.", RecordType::A).await),
        vec![LOOPBACK]
    );
    // A freed place is taken again (the connection's end is noticed a moment after the close).
    drop(held.pop());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = TcpStream::connect(a.proxy_addr).await.unwrap();
        let _ = s
            .write_all(format!("CONNECT echo.test:{} HTTP/1.1\r\n\r\n", echo.port()).as_bytes())
            .await;
        if read_head(&mut s)
            .await
            .is_some_and(|h| h.starts_with(b"HTTP/1.1 200"))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the freed place never came back"
        );
        tokio::task::yield_now().await;
    }
    // The others (19, and any refused while the place was being freed) are reported together
    // when the sandbox goes (or at a window's end), not one record each.
    h.egress.remove_sandbox(&id("sb-cap-a")).unwrap();
    let (mut refused, mut records) = (0, 0);
    while refused < 19 {
        let r = h.next_refusal().await;
        assert_eq!(r.limit, Limit::ProxyConnections);
        refused += r.count;
        records += 1;
    }
    assert!(records <= 2, "{records} records for {refused} refusals");
}

#[tokio::test]
async fn the_descriptor_budget_is_shared_by_all_sandboxes() {
    let echo = echo_server().await;
    let limits = EgressLimits {
        descriptors: Some(4),
        ..EgressLimits::default()
    };
    let mut h = egress_with(
        operator(&[echo.port()], &[("echo.test", "127.0.0.1")]),
        None,
        limits,
    );
    assert_eq!(h.egress.descriptors_in_use(), (0, 4));
    let p = || policy(r#"{"allow":[{"domain":"echo.test"}]}"#);
    let a = h.egress.add_sandbox(id("sb-fd-a"), p(), LOOPBACK).await.unwrap();
    let b = h.egress.add_sandbox(id("sb-fd-b"), p(), LOOPBACK).await.unwrap();
    let _one = tunnel(a.proxy_addr, echo).await;
    let _two = tunnel(a.proxy_addr, echo).await;
    assert_eq!(h.egress.descriptors_in_use(), (4, 4));
    let mut s = TcpStream::connect(b.proxy_addr).await.unwrap();
    assert!(closed(&mut s).await);
    let r = h.next_refusal().await;
    assert_eq!((r.sandbox, r.limit), (id("sb-fd-b"), Limit::Descriptors));
    // DNS over UDP holds no descriptor of the budget: still answered.
    assert_eq!(
        answers(&dns_query(b.dns_addr, "echo.test.", RecordType::A).await),
        vec![LOOPBACK]
    );
}

/// Idle and lifetime cuts in real time with short limits (their timing is checked in paused time by
/// the unit tests of the watchdog): the proxy ends the connection and says why.
#[tokio::test]
async fn idle_and_old_connections_are_cut_and_the_record_says_why() {
    let echo = echo_server().await;
    for (idle, lifetime, cut) in [
        (
            Duration::from_millis(200),
            Duration::from_secs(3600),
            Cut::IdleTimeout,
        ),
        (
            Duration::from_secs(3600),
            Duration::from_millis(300),
            Cut::Lifetime,
        ),
    ] {
        let limits = EgressLimits {
            idle_timeout: idle,
            max_lifetime: lifetime,
            ..EgressLimits::default()
        };
        let mut h = egress_with(
            operator(&[echo.port()], &[("echo.test", "127.0.0.1")]),
            None,
            limits,
        );
        let out = h
            .egress
            .add_sandbox(
                id("sb-cut"),
                policy(r#"{"allow":[{"domain":"echo.test"}]}"#),
                LOOPBACK,
            )
            .await
            .unwrap();
        let mut s = tunnel(out.proxy_addr, echo).await;
        assert!(closed(&mut s).await, "{cut:?}: not cut");
        let r = h.next_connection().await;
        assert_eq!(r.cut, Some(cut));
        assert!(r.allowed && r.bytes_up > 0);
        assert_eq!(
            h.egress.descriptors_in_use().0,
            0,
            "its descriptors are given back"
        );
    }
}

async fn dns_sandbox(h: &Harness, name: &str) -> SocketAddr {
    h.egress
        .add_sandbox(id(name), policy(r#"{"allow":[{"domain":"a.test"}]}"#), LOOPBACK)
        .await
        .unwrap()
        .dns_addr
}

#[tokio::test]
async fn dns_over_tcp_is_bounded_in_connections_questions_and_size() {
    let limits = EgressLimits {
        dns_tcp_connections: 2,
        dns_tcp_questions: 3,
        ..EgressLimits::default()
    };
    let mut h = egress_with(operator(&[80], &[("a.test", "127.0.0.1")]), None, limits);
    let dns = dns_sandbox(&h, "sb-dnstcp").await;
    // Two held open; the third is reset at once.
    let mut first = TcpStream::connect(dns).await.unwrap();
    let mut second = TcpStream::connect(dns).await.unwrap();
    assert!(ask_tcp(&mut first, "a.test.").await.is_some());
    assert!(ask_tcp(&mut second, "a.test.").await.is_some());
    let mut third = TcpStream::connect(dns).await.unwrap();
    assert!(closed(&mut third).await);
    assert_eq!(h.next_refusal().await.limit, Limit::DnsTcpConnections);
    // UDP is still answered.
    assert_eq!(
        answers(&dns_query(dns, "a.test.", RecordType::A).await),
        vec![LOOPBACK]
    );
    // Three questions per connection, then it is closed.
    assert!(ask_tcp(&mut first, "a.test.").await.is_some());
    assert!(ask_tcp(&mut first, "a.test.").await.is_some());
    assert!(ask_tcp(&mut first, "a.test.").await.is_none());
    assert_eq!(h.next_refusal().await.limit, Limit::DnsTcpMessages);
    drop(first);
    // A message longer than any question closes the connection (once the first's place is free).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut big = loop {
        let mut s = TcpStream::connect(dns).await.unwrap();
        if ask_tcp(&mut s, "a.test.").await.is_some() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the freed place never came back"
        );
        tokio::task::yield_now().await;
    };
    big.write_all(&60_000u16.to_be_bytes()).await.unwrap();
    big.write_all(&[0u8; 1024]).await.unwrap();
    assert!(closed(&mut big).await);
}

/// A silent DNS/TCP connection is closed after the (short) idle time; the exact timing and the
/// lifetime are checked in paused time by the unit tests of `dns.rs`.
#[tokio::test]
async fn a_silent_dns_tcp_connection_is_closed() {
    let limits = EgressLimits {
        dns_tcp_idle: Duration::from_millis(200),
        ..EgressLimits::default()
    };
    let h = egress_with(operator(&[80], &[("a.test", "127.0.0.1")]), None, limits);
    let dns = dns_sandbox(&h, "sb-dnsidle").await;
    let mut silent = TcpStream::connect(dns).await.unwrap();
    assert!(closed(&mut silent).await);
    assert_eq!(h.egress.descriptors_in_use().0, 0);
}
