//! The sandbox's DNS: allowed names only, operator-denied addresses dropped, A/AAAA only.

use std::net::SocketAddr;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use paddock_egress::policy::Rule;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use crate::common::*;

async fn setup(h: &Harness) -> SocketAddr {
    let p = policy(
        r#"{"allow":[{"domain":"*.svc.test"},{"domain":"meta.test"}],"deny":[{"domain":"no.svc.test"}]}"#,
    );
    h.egress
        .add_sandbox("sb-dns".parse().unwrap(), p, LOOPBACK)
        .await
        .unwrap()
        .dns_addr
}

fn harness() -> Harness {
    egress(
        operator(
            &[80],
            &[
                ("a.svc.test", "127.0.0.1"),
                ("a.svc.test", "::1"),
                ("meta.test", "169.254.169.254"),
                ("no.svc.test", "127.0.0.1"),
            ],
        ),
        None,
    )
}

#[tokio::test]
async fn allowed_names_are_answered_and_everything_else_refused() {
    let mut h = harness();
    let dns = setup(&h).await;
    let a = dns_query(dns, "A.svc.test.", RecordType::A).await;
    assert_eq!(a.response_code(), ResponseCode::NoError);
    assert_eq!(answers(&a), vec![LOOPBACK]);
    assert!(a.answers().iter().all(|r| r.ttl() > 0));
    let d = h.next_dns().await;
    assert!(d.allowed);
    assert_eq!((d.query_type.as_str(), d.answers.clone()), ("A", vec![LOOPBACK]));
    // ::1 is loopback: denied on every port by the operator (the exception covers 127.0.0.1 only).
    let aaaa = dns_query(dns, "a.svc.test.", RecordType::AAAA).await;
    assert_eq!(
        (aaaa.response_code(), answers(&aaaa)),
        (ResponseCode::NoError, vec![])
    );
    h.next_dns().await;

    let cases = [
        (
            "no.svc.test.",
            RecordType::A,
            ResponseCode::Refused,
            Rule::TenantDeny { index: 0 },
        ),
        (
            "svc.test.",
            RecordType::A,
            ResponseCode::Refused,
            Rule::NoAllowRule,
        ),
        (
            "evil.example.",
            RecordType::A,
            ResponseCode::Refused,
            Rule::NoAllowRule,
        ),
        (
            "a.svc.test.",
            RecordType::TXT,
            ResponseCode::Refused,
            Rule::UnsupportedQuery,
        ),
        (
            "meta.test.",
            RecordType::A,
            ResponseCode::NXDomain,
            Rule::Unresolvable,
        ),
        (
            "b.svc.test.",
            RecordType::A,
            ResponseCode::NXDomain,
            Rule::Unresolvable,
        ),
    ];
    for (name, qtype, code, rule) in cases {
        let m = dns_query(dns, name, qtype).await;
        assert_eq!(m.response_code(), code, "{name} {qtype}");
        assert!(m.answers().is_empty());
        let d = h.next_dns().await;
        assert_eq!((d.allowed, d.rule), (false, rule), "{name} {qtype}");
    }
}

#[tokio::test]
async fn dns_over_tcp_and_garbage() {
    let h = harness();
    let dns = setup(&h).await;
    let garbage = UdpSocket::bind((LOOPBACK, 0)).await.unwrap();
    garbage.send_to(b"\x00\x01not dns", dns).await.unwrap();
    // Still serving after garbage.
    assert_eq!(
        answers(&dns_query(dns, "a.svc.test.", RecordType::A).await),
        vec![LOOPBACK]
    );

    let mut s = TcpStream::connect(dns).await.unwrap();
    for _ in 0..2 {
        let mut q = Message::new();
        q.set_id(7)
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Query)
            .add_query(Query::query(
                Name::from_ascii("a.svc.test.").unwrap(),
                RecordType::A,
            ));
        let bytes = q.to_vec().unwrap();
        s.write_all(&(bytes.len() as u16).to_be_bytes()).await.unwrap();
        s.write_all(&bytes).await.unwrap();
        let mut len = [0u8; 2];
        s.read_exact(&mut len).await.unwrap();
        let mut reply = vec![0u8; u16::from_be_bytes(len) as usize];
        s.read_exact(&mut reply).await.unwrap();
        let reply = Message::from_vec(&reply).unwrap();
        assert_eq!((reply.id(), answers(&reply)), (7, vec![LOOPBACK]));
    }
}
