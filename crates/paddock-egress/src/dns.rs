//! The sandbox's DNS server (UDP and TCP): A and AAAA questions for names the policy allows are
//! answered from the operator's host map or the system resolver, minus addresses the operator denies,
//! and each answer is pinned for the sandbox's later connections. Anything else is refused, so DNS is
//! neither a way to learn internal addresses nor a tunnel to outside resolvers.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use paddock_types::DomainName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use crate::audit::{AuditRecord, DnsRecord};
use crate::egress::{Sandbox, Shared};
use crate::policy::{decide_name, Decision, Rule};
use crate::resolve::ANSWER_TTL;

/// Questions answered at once per sandbox (a lookup through the system resolver may take a while).
const CONCURRENT_QUESTIONS: usize = 64;
const TCP_IDLE: Duration = Duration::from_secs(10);
const MAX_UDP: usize = 1232;

/// Serve DNS over UDP until the sandbox is removed.
pub(crate) async fn serve_udp(shared: Arc<Shared>, sandbox: Arc<Sandbox>, socket: UdpSocket) {
    let socket = Arc::new(socket);
    let permits = Arc::new(Semaphore::new(CONCURRENT_QUESTIONS));
    let mut buf = vec![0u8; 4096];
    loop {
        let received = tokio::select! {
            () = sandbox.token.cancelled() => return,
            r = socket.recv_from(&mut buf) => r,
        };
        let (n, peer) = match received {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(sandbox_id = %sandbox.id, error = %e, "dns receive failed");
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            continue; // overloaded: drop, the client retries
        };
        let question = buf[..n].to_vec();
        let (shared, sandbox, socket) = (shared.clone(), sandbox.clone(), socket.clone());
        tokio::spawn(async move {
            if let Some(mut reply) = answer(&shared, &sandbox, &question).await {
                if reply.len() > MAX_UDP {
                    reply = truncated(&question).unwrap_or_default();
                }
                if let Err(e) = socket.send_to(&reply, peer).await {
                    tracing::debug!(error = %e, "dns reply failed");
                }
            }
            drop(permit);
        });
    }
}

/// Serve DNS over TCP until the sandbox is removed.
pub(crate) async fn serve_tcp(shared: Arc<Shared>, sandbox: Arc<Sandbox>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            () = sandbox.token.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                let (shared, sandbox) = (shared.clone(), sandbox.clone());
                tokio::spawn(async move {
                    let token = sandbox.token.clone();
                    tokio::select! {
                        () = token.cancelled() => {}
                        r = serve_tcp_connection(&shared, &sandbox, stream) => {
                            if let Err(e) = r {
                                tracing::debug!(error = %e, "dns tcp connection ended");
                            }
                        }
                    }
                });
            }
            Err(e) => {
                tracing::warn!(sandbox_id = %sandbox.id, error = %e, "dns accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn serve_tcp_connection(
    shared: &Shared,
    sandbox: &Sandbox,
    mut stream: TcpStream,
) -> std::io::Result<()> {
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        }
        let mut question = vec![0u8; usize::from(u16::from_be_bytes(len))];
        tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut question))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let Some(reply) = answer(shared, sandbox, &question).await else {
            return Ok(());
        };
        let len = u16::try_from(reply.len()).map_err(|_| std::io::Error::other("reply too long"))?;
        stream.write_all(&len.to_be_bytes()).await?;
        stream.write_all(&reply).await?;
    }
}

/// The reply to one DNS message, or `None` for something that is not a question at all.
pub(crate) async fn answer(shared: &Shared, sandbox: &Sandbox, question: &[u8]) -> Option<Vec<u8>> {
    let req = Message::from_vec(question).ok()?;
    if req.message_type() != MessageType::Query {
        return None;
    }
    let mut reply = Message::new();
    reply
        .set_id(req.id())
        .set_message_type(MessageType::Response)
        .set_op_code(req.op_code())
        .set_recursion_desired(req.recursion_desired())
        .set_recursion_available(true)
        .add_queries(req.queries().to_vec());
    let (code, record) = respond(shared, sandbox, &req, &mut reply).await;
    reply.set_response_code(code);
    if let Some(record) = record {
        shared.audit.record(AuditRecord::Dns(record));
    }
    reply.to_vec().ok()
}

async fn respond(
    shared: &Shared,
    sandbox: &Sandbox,
    req: &Message,
    reply: &mut Message,
) -> (ResponseCode, Option<DnsRecord>) {
    let record = |name: String, qtype: String, decision: Decision, answers: Vec<IpAddr>| DnsRecord {
        sandbox: sandbox.id.clone(),
        name,
        query_type: qtype,
        allowed: decision.allowed,
        rule: decision.rule,
        answers,
        at: SystemTime::now(),
    };
    let [query] = req.queries() else {
        return (ResponseCode::FormErr, None);
    };
    let asked = query.name().to_ascii();
    let qtype = query.query_type();
    let refuse = |rule| {
        (
            ResponseCode::Refused,
            Some(record(
                asked.clone(),
                qtype.to_string(),
                Decision::deny(rule),
                vec![],
            )),
        )
    };
    if req.op_code() != OpCode::Query
        || query.query_class() != DNSClass::IN
        || !matches!(qtype, RecordType::A | RecordType::AAAA)
    {
        return refuse(Rule::UnsupportedQuery);
    }
    let Ok(name) = asked.parse::<DomainName>() else {
        return refuse(Rule::Unreadable {
            reason: "not a valid domain name".into(),
        });
    };
    let decision = decide_name(&sandbox.policy(), &name);
    if !decision.allowed {
        return (
            ResponseCode::Refused,
            Some(record(asked, qtype.to_string(), decision, vec![])),
        );
    }
    let ips = shared.resolver.resolve(&shared.operator, &name).await;
    if ips.is_empty() {
        let r = record(
            asked,
            qtype.to_string(),
            Decision::deny(Rule::Unresolvable),
            vec![],
        );
        return (ResponseCode::NXDomain, Some(r));
    }
    let answers: Vec<IpAddr> = ips
        .into_iter()
        .filter(|ip| {
            matches!(
                (qtype, ip),
                (RecordType::A, IpAddr::V4(_)) | (RecordType::AAAA, IpAddr::V6(_))
            )
        })
        .collect();
    sandbox.pin(&name, &answers, ANSWER_TTL);
    let ttl = u32::try_from(ANSWER_TTL.as_secs()).unwrap_or(u32::MAX);
    for ip in &answers {
        let rdata = match ip {
            IpAddr::V4(v4) => RData::A(A(*v4)),
            IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
        };
        reply.add_answer(Record::from_rdata(query.name().clone(), ttl, rdata));
    }
    (
        ResponseCode::NoError,
        Some(record(asked, qtype.to_string(), decision, answers)),
    )
}

/// An empty reply with the TC bit, asking the client to retry over TCP.
fn truncated(question: &[u8]) -> Option<Vec<u8>> {
    let req = Message::from_vec(question).ok()?;
    let mut reply = Message::new();
    reply
        .set_id(req.id())
        .set_message_type(MessageType::Response)
        .set_op_code(req.op_code())
        .set_truncated(true)
        .add_queries(req.queries().to_vec());
    reply.to_vec().ok()
}
