//! The sandbox's DNS server (UDP and TCP): A and AAAA questions for names the policy allows are
//! answered from the operator's host map or the system resolver, minus addresses the operator denies,
//! and each answer is pinned for the sandbox's later connections. Anything else is refused, so DNS is
//! neither a way to learn internal addresses nor a tunnel to outside resolvers. What a sandbox's DNS
//! may hold is bounded: questions in flight (UDP), connections, their idle time, lifetime, number of
//! questions and message size (TCP), and name resolutions (see `resolve.rs`).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use paddock_types::DomainName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};

use crate::audit::{AuditRecord, DnsRecord};
use crate::egress::{Sandbox, Shared};
use crate::limits::{Entry, Limit};
use crate::policy::{decide_name, Decision, Rule};
use crate::resolve::ANSWER_TTL;

const MAX_UDP: usize = 1232;
/// The longest DNS-over-TCP message read: a question is a few hundred bytes at most (one name, an
/// EDNS record), so anything longer is not one and closes the connection.
const MAX_TCP_MESSAGE: usize = 4096;

/// Serve DNS over UDP until the sandbox is removed. At most `dns_in_flight` questions of the sandbox
/// are answered at once; more are dropped (the client retries) and counted.
pub(crate) async fn serve_udp(shared: Arc<Shared>, sandbox: Arc<Sandbox>, socket: UdpSocket) {
    let socket = Arc::new(socket);
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
        let Ok(permit) = sandbox.limits.dns_in_flight.clone().try_acquire_owned() else {
            sandbox.refused(&shared, Limit::DnsInFlight);
            continue;
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

/// Serve DNS over TCP until the sandbox is removed. Connections over the sandbox's cap (or the
/// server's descriptor budget) are reset at once and counted.
pub(crate) async fn serve_tcp(shared: Arc<Shared>, sandbox: Arc<Sandbox>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            () = sandbox.token.cancelled() => return,
            r = listener.accept() => r,
        };
        match accepted {
            Ok((stream, _)) => {
                let Ok((stream, admission)) = sandbox.admit_or_reset(&shared, stream, Entry::DnsTcp) else {
                    continue;
                };
                let (shared, sandbox) = (shared.clone(), sandbox.clone());
                tokio::spawn(async move {
                    serve_tcp_stream(&shared, &sandbox, stream).await;
                    drop(admission);
                });
            }
            Err(e) => {
                tracing::warn!(sandbox_id = %sandbox.id, error = %e, "dns accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One DNS-over-TCP connection, until it ends, the sandbox goes, or its lifetime is over.
async fn serve_tcp_stream<S: AsyncRead + AsyncWrite + Unpin>(shared: &Shared, sandbox: &Sandbox, stream: S) {
    tokio::select! {
        () = sandbox.token.cancelled() => {}
        () = tokio::time::sleep(shared.limits.dns_tcp_lifetime) => {}
        r = serve_tcp_connection(shared, sandbox, stream) => match r {
            Ok(()) => {}
            Err(TcpEnd::OverLimit) => sandbox.refused(shared, Limit::DnsTcpMessages),
            Err(TcpEnd::Io(e)) => tracing::debug!(error = %e, "dns tcp connection ended"),
        },
    }
}

/// Why a DNS-over-TCP connection was closed early.
#[derive(Debug)]
enum TcpEnd {
    /// Too many questions, or a message too long to be one.
    OverLimit,
    Io(std::io::Error),
}

/// Questions and answers until the client closes, stays silent for `dns_tcp_idle` (or takes longer
/// than that to send one message), has asked `dns_tcp_questions`, or sends something too long.
async fn serve_tcp_connection<S: AsyncRead + AsyncWrite + Unpin>(
    shared: &Shared,
    sandbox: &Sandbox,
    mut stream: S,
) -> Result<(), TcpEnd> {
    let limits = &shared.limits;
    for _ in 0..limits.dns_tcp_questions {
        let read = async {
            let mut len = [0u8; 2];
            stream.read_exact(&mut len).await?;
            let len = usize::from(u16::from_be_bytes(len));
            if len > MAX_TCP_MESSAGE {
                return Ok(None);
            }
            let mut question = vec![0u8; len];
            stream.read_exact(&mut question).await?;
            Ok::<_, std::io::Error>(Some(question))
        };
        let question = match tokio::time::timeout(limits.dns_tcp_idle, read).await {
            Err(_) => return Ok(()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(TcpEnd::Io(e)),
            Ok(Ok(None)) => return Err(TcpEnd::OverLimit),
            Ok(Ok(Some(q))) => q,
        };
        let Some(reply) = answer(shared, sandbox, &question).await else {
            return Ok(());
        };
        let len =
            u16::try_from(reply.len()).map_err(|_| TcpEnd::Io(std::io::Error::other("reply too long")))?;
        let write = async {
            stream.write_all(&len.to_be_bytes()).await?;
            stream.write_all(&reply).await
        };
        match tokio::time::timeout(limits.dns_tcp_idle, write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(TcpEnd::Io(e)),
            Err(_) => return Ok(()),
        }
    }
    Err(TcpEnd::OverLimit)
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
    let Some(ips) = sandbox.resolve(shared, &name).await else {
        // Counted as a refusal at the cap, not recorded per question.
        return (ResponseCode::ServFail, None);
    };
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;
    use tokio::io::DuplexStream;
    use tokio::time::Instant;

    use super::*;
    use crate::audit::AuditSink;
    use crate::policy::OperatorPolicy;
    use crate::{Egress, EgressConfig, EgressLimits};

    #[derive(Debug, Default)]
    struct Sink(Mutex<Vec<AuditRecord>>);
    impl AuditSink for Sink {
        fn record(&self, r: AuditRecord) {
            self.0.lock().expect("sink").push(r);
        }
    }

    /// An egress with one sandbox allowed `a.test` (127.0.0.1 from the host map), and a DNS/TCP
    /// connection to it over an in-memory pipe (paused time needs no real socket in the way).
    async fn connection(limits: EgressLimits) -> (Egress, DuplexStream, tokio::task::JoinHandle<Instant>) {
        let mut operator = OperatorPolicy::default();
        operator.hosts.insert(
            "a.test".parse().expect("name"),
            vec![IpAddr::from([127, 0, 0, 1])],
        );
        let config = EgressConfig {
            operator,
            system_resolver: false,
            public_roots: false,
            limits,
            ..EgressConfig::default()
        };
        let egress = Egress::new(config, Arc::new(Sink::default())).expect("egress");
        let id: paddock_types::SandboxId = "sb-dns".parse().expect("id");
        let policy = serde_json::from_str(r#"{"allow":[{"domain":"a.test"}]}"#).expect("policy");
        egress
            .add_sandbox(id.clone(), policy, IpAddr::from([127, 0, 0, 1]))
            .await
            .expect("sandbox");
        let (shared, sandbox) = egress.parts_for_tests(&id);
        let (client, server) = tokio::io::duplex(8192);
        let task = tokio::spawn(async move {
            serve_tcp_stream(&shared, &sandbox, server).await;
            Instant::now()
        });
        (egress, client, task)
    }

    fn question() -> Vec<u8> {
        let mut q = Message::new();
        q.set_id(9)
            .set_message_type(MessageType::Query)
            .set_op_code(OpCode::Query)
            .add_query(Query::query(
                Name::from_ascii("a.test.").expect("name"),
                RecordType::A,
            ));
        let bytes = q.to_vec().expect("encode");
        let mut framed = u16::try_from(bytes.len()).expect("short").to_be_bytes().to_vec();
        framed.extend_from_slice(&bytes);
        framed
    }

    /// One question and its answer; `false` when the server closed instead.
    async fn ask(s: &mut DuplexStream) -> bool {
        if s.write_all(&question()).await.is_err() {
            return false;
        }
        let mut len = [0u8; 2];
        if s.read_exact(&mut len).await.is_err() {
            return false;
        }
        let mut reply = vec![0u8; usize::from(u16::from_be_bytes(len))];
        s.read_exact(&mut reply).await.is_ok()
    }

    fn limits() -> EgressLimits {
        EgressLimits {
            dns_tcp_idle: Duration::from_secs(5),
            dns_tcp_lifetime: Duration::from_secs(30),
            dns_tcp_questions: 100,
            ..EgressLimits::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_or_slow_client_is_closed_after_the_idle_time() {
        let (_egress, client, task) = connection(limits()).await;
        let t = Instant::now();
        let ended = task.await.expect("served");
        assert_eq!(ended - t, Duration::from_secs(5));
        drop(client);
        // Half a question then nothing: the whole message must come within the idle time.
        let (_egress, mut client, task) = connection(limits()).await;
        assert!(ask(&mut client).await);
        let t = Instant::now();
        client.write_all(&question()[..5]).await.expect("half");
        let ended = task.await.expect("served");
        assert_eq!(ended - t, Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_of_questions_is_closed_at_the_lifetime() {
        let (_egress, mut client, task) = connection(limits()).await;
        let t = Instant::now();
        let mut asked = 0;
        // A question every 4 s: never idle for 5 s.
        loop {
            tokio::time::sleep(Duration::from_secs(4)).await;
            if !ask(&mut client).await {
                break;
            }
            asked += 1;
        }
        let ended = task.await.expect("served");
        assert_eq!((asked, ended - t), (7, Duration::from_secs(30)));
    }

    #[tokio::test(start_paused = true)]
    async fn questions_per_connection_and_message_size_are_bounded() {
        let few = EgressLimits {
            dns_tcp_questions: 3,
            ..limits()
        };
        let (_egress, mut client, task) = connection(few).await;
        for _ in 0..3 {
            assert!(ask(&mut client).await);
        }
        assert!(!ask(&mut client).await);
        task.await.expect("served");
        let (_egress, mut client, task) = connection(limits()).await;
        client
            .write_all(&u16::try_from(MAX_TCP_MESSAGE + 1).expect("short").to_be_bytes())
            .await
            .expect("length");
        let t = Instant::now();
        assert_eq!(task.await.expect("served"), t, "closed at once");
    }
}
