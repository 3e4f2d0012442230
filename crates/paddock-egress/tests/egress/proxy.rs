//! The explicit proxy: CONNECT and absolute-form HTTP.

use std::time::Duration;

use paddock_egress::policy::Rule;
use paddock_egress::Door;
use paddock_types::SandboxId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

fn id(s: &str) -> SandboxId {
    s.parse().unwrap()
}

#[tokio::test]
async fn connect_to_an_allowed_name_relays_and_is_audited() {
    let echo = echo_server().await;
    let mut h = egress(operator(&[echo.port()], &[("echo.test", "127.0.0.1")]), None);
    let sb = id("sb-proxy-1");
    let p = policy(&format!(
        r#"{{"allow":[{{"domain":"echo.test","ports":[{}]}}]}}"#,
        echo.port()
    ));
    let out = h.egress.add_sandbox(sb.clone(), p, LOOPBACK).await.unwrap();
    let (status, mut s) = connect_via(out.proxy_addr, &format!("echo.test:{}", echo.port())).await;
    assert_eq!(status, 200);
    s.write_all(b"ping through the proxy").await.unwrap();
    let mut back = [0u8; 22];
    s.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping through the proxy");
    drop(s);
    let r = h.next_connection().await;
    assert_eq!(r.sandbox, sb);
    assert_eq!(r.door, Door::Proxy);
    assert!(r.allowed);
    assert_eq!(r.rule, Rule::TenantAllow { index: 0 });
    assert_eq!(r.name.as_ref().map(|n| n.as_str()), Some("echo.test"));
    assert_eq!(r.ip, Some(LOOPBACK));
    assert_eq!(r.port, echo.port());
    let connect_len = format!(
        "CONNECT echo.test:{0} HTTP/1.1\r\nHost: echo.test:{0}\r\n\r\n",
        echo.port()
    )
    .len() as u64;
    assert_eq!(r.bytes_up, connect_len + 22);
    assert_eq!(
        r.bytes_down,
        "HTTP/1.1 200 Connection Established\r\n\r\n".len() as u64 + 22
    );
}

#[tokio::test]
async fn refusals_answer_403_and_are_audited() {
    let echo = echo_server().await;
    let hosts = [
        ("echo.test", "127.0.0.1"),
        ("meta.test", "169.254.169.254"),
        ("other.test", "127.0.0.1"),
    ];
    let mut h = egress(operator(&[echo.port()], &hosts), None);
    let p =
        policy(r#"{"allow":[{"domain":"*.test"},{"cidr":"0.0.0.0/0"}],"deny":[{"domain":"other.test"}]}"#);
    let out = h.egress.add_sandbox(id("sb-proxy-2"), p, LOOPBACK).await.unwrap();
    let cases = [
        // Denied by the tenant's deny rule.
        (
            format!("other.test:{}", echo.port()),
            Rule::TenantDeny { index: 0 },
        ),
        // A public-looking name resolving to the metadata address: dropped at resolution.
        ("meta.test:80".to_owned(), Rule::Unresolvable),
        // Loopback on a port the operator did not except: the operator's deny list wins.
        (
            "echo.test:1".to_owned(),
            Rule::OperatorDeny {
                cidr: "127.0.0.0/8".parse().unwrap(),
            },
        ),
        (
            "169.254.169.254:80".to_owned(),
            Rule::OperatorDeny {
                cidr: "169.254.0.0/16".parse().unwrap(),
            },
        ),
        (
            "[::ffff:169.254.169.254]:80".to_owned(),
            Rule::OperatorDeny {
                cidr: "169.254.0.0/16".parse().unwrap(),
            },
        ),
        // No allow rule for this name (and it is never resolved).
        ("example.com:443".to_owned(), Rule::NoAllowRule),
    ];
    for (authority, rule) in cases {
        let (status, _) = connect_via(out.proxy_addr, &authority).await;
        assert_eq!(status, 403, "{authority}");
        let r = h.next_connection().await;
        assert!(!r.allowed, "{authority}");
        assert_eq!(r.rule, rule, "{authority}");
    }
}

#[tokio::test]
async fn absolute_form_http_is_forwarded_in_origin_form_once() {
    let web = http_server().await;
    let mut h = egress(operator(&[web.port()], &[("web.test", "127.0.0.1")]), None);
    let out = h
        .egress
        .add_sandbox(
            id("sb-proxy-3"),
            policy(r#"{"allow":[{"domain":"web.test"}]}"#),
            LOOPBACK,
        )
        .await
        .unwrap();
    let mut s = TcpStream::connect(out.proxy_addr).await.unwrap();
    let head = format!(
        "GET http://web.test:{}/a/b?c=d HTTP/1.1\r\nHost: web.test\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: x\r\nX-Test: 1\r\n\r\n",
        web.port()
    );
    let (status, body) = request(&mut s, &head).await;
    assert_eq!(status, 200);
    let seen = String::from_utf8(body).unwrap();
    assert!(seen.starts_with("GET /a/b?c=d HTTP/1.1\r\n"), "{seen}");
    assert!(
        seen.contains("X-Test: 1\r\n") && seen.contains("Connection: close\r\n"),
        "{seen}"
    );
    assert!(!seen.to_ascii_lowercase().contains("proxy-"), "{seen}");
    drop(s);
    let r = h.next_connection().await;
    assert!(r.allowed);
    assert_eq!(r.port, web.port());

    let mut s = TcpStream::connect(out.proxy_addr).await.unwrap();
    let (status, _) = request(&mut s, "GET /relative HTTP/1.1\r\nHost: web.test\r\n\r\n").await;
    assert_eq!(status, 400);
    assert!(!h.next_connection().await.allowed);
}

#[tokio::test]
async fn policy_changes_apply_to_new_connections_and_removal_closes_everything() {
    let echo = echo_server().await;
    let mut h = egress(operator(&[echo.port()], &[]), None);
    let sb = id("sb-proxy-4");
    let out = h
        .egress
        .add_sandbox(
            sb.clone(),
            policy(r#"{"allow":[{"cidr":"127.0.0.1"}]}"#),
            LOOPBACK,
        )
        .await
        .unwrap();
    let target = format!("127.0.0.1:{}", echo.port());
    let (status, mut open) = connect_via(out.proxy_addr, &target).await;
    assert_eq!(status, 200);
    h.egress.set_policy(&sb, policy("{}")).unwrap();
    let (status, _) = connect_via(out.proxy_addr, &target).await;
    assert_eq!(status, 403);
    assert_eq!(h.next_connection().await.rule, Rule::NoAllowRule);
    // The tunnel opened before the change still works; removal cuts it and audits it.
    open.write_all(b"x").await.unwrap();
    let mut one = [0u8; 1];
    open.read_exact(&mut one).await.unwrap();
    h.egress.remove_sandbox(&sb).unwrap();
    let r = h.next_connection().await;
    assert!(r.allowed);
    assert_eq!((r.bytes_up > 0, r.bytes_down > 0), (true, true));
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(10), open.read_to_end(&mut rest))
        .await
        .unwrap();
    assert_eq!(n.unwrap_or(0), 0);
    // The listener is gone (retry until the accept loop has seen the cancellation).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(out.proxy_addr).await.is_ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "proxy listener still open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(h.egress.set_policy(&sb, policy("{}")).is_err());
}

#[tokio::test]
async fn api_errors_are_typed() {
    let h = egress(operator(&[], &[]), None);
    let sb = id("sb-proxy-5");
    h.egress
        .add_sandbox(sb.clone(), policy("{}"), LOOPBACK)
        .await
        .unwrap();
    assert!(matches!(
        h.egress.add_sandbox(sb.clone(), policy("{}"), LOOPBACK).await,
        Err(paddock_egress::EgressError::SandboxExists { .. })
    ));
    assert!(matches!(
        h.egress.remove_sandbox(&id("sb-nope")),
        Err(paddock_egress::EgressError::UnknownSandbox { .. })
    ));
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let config = paddock_egress::EgressConfig {
        upstream_ca_pems: vec!["not a certificate".into()],
        ..paddock_egress::EgressConfig::default()
    };
    assert!(matches!(
        paddock_egress::Egress::new(config, std::sync::Arc::new(tx)),
        Err(paddock_egress::EgressError::UpstreamCa { index: 0 })
    ));
}
