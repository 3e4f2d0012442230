//! Loopback fixtures for the egress tests: servers on 127.0.0.1 the tests start themselves, a test CA,
//! a DNS client and a raw HTTP/1.1 client. Nothing here reaches beyond loopback.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use paddock_egress::policy::{OperatorAllow, OperatorPolicy};
use paddock_egress::{
    AuditRecord, ConnectionRecord, DnsRecord, Egress, EgressConfig, EgressLimits, RefusalRecord,
};
use paddock_types::{NetworkPolicy, PortRange};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
const WAIT: Duration = Duration::from_secs(10);

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn policy(json: &str) -> NetworkPolicy {
    serde_json::from_str(json).unwrap()
}

/// An operator policy that exempts loopback on `ports` and maps `hosts` to their addresses.
pub fn operator(ports: &[u16], hosts: &[(&str, &str)]) -> OperatorPolicy {
    let mut op = OperatorPolicy::default();
    op.allow.push(OperatorAllow {
        cidr: "127.0.0.1".parse().unwrap(),
        ports: ports.iter().map(|p| PortRange::single(*p).unwrap()).collect(),
        reason: "test servers".into(),
    });
    for (name, ip) in hosts {
        op.hosts
            .entry(name.parse().unwrap())
            .or_default()
            .push(ip.parse().unwrap());
    }
    op
}

pub struct Harness {
    pub egress: Arc<Egress>,
    pub audit: UnboundedReceiver<AuditRecord>,
}

pub fn egress(operator: OperatorPolicy, upstream_ca: Option<String>) -> Harness {
    egress_with(operator, upstream_ca, EgressLimits::default())
}

/// [`egress`] with other limits.
pub fn egress_with(operator: OperatorPolicy, upstream_ca: Option<String>, limits: EgressLimits) -> Harness {
    let (tx, rx) = unbounded_channel();
    let config = EgressConfig {
        operator,
        system_resolver: false,
        public_roots: false,
        upstream_ca_pems: upstream_ca.into_iter().collect(),
        limits,
        ..EgressConfig::default()
    };
    Harness {
        egress: Arc::new(Egress::new(config, Arc::new(tx)).unwrap()),
        audit: rx,
    }
}

impl Harness {
    pub async fn next_connection(&mut self) -> ConnectionRecord {
        loop {
            match tokio::time::timeout(WAIT, self.audit.recv())
                .await
                .expect("an audit record in time")
            {
                Some(AuditRecord::Connection(c)) => return c,
                Some(_) => continue,
                None => panic!("audit channel closed"),
            }
        }
    }
    pub async fn next_refusal(&mut self) -> RefusalRecord {
        loop {
            match tokio::time::timeout(WAIT, self.audit.recv())
                .await
                .expect("an audit record in time")
            {
                Some(AuditRecord::Refused(r)) => return r,
                Some(_) => continue,
                None => panic!("audit channel closed"),
            }
        }
    }
    pub async fn next_dns(&mut self) -> DnsRecord {
        loop {
            match tokio::time::timeout(WAIT, self.audit.recv())
                .await
                .expect("an audit record in time")
            {
                Some(AuditRecord::Dns(d)) => return d,
                Some(_) => continue,
                None => panic!("audit channel closed"),
            }
        }
    }
}

/// A TCP echo server on loopback.
pub async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
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

/// Read one HTTP/1 head (through the blank line).
pub async fn read_head<S: AsyncRead + Unpin>(s: &mut S) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        buf.push(byte[0]);
    }
    Some(buf)
}

/// Everything an upstream server received (request heads and bodies), in order.
pub type Received = Arc<std::sync::Mutex<Vec<u8>>>;

/// Serve HTTP/1.1 on `s`: every response's body is the request it answers (head and body, the body
/// read by its `Content-Length`), which is also appended to `received`.
async fn serve_echo_heads<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, received: Received) {
    while let Some(mut request) = read_head(&mut s).await {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        let _ = req.parse(&request);
        let len = req
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if s.read_exact(&mut body).await.is_err() {
            return;
        }
        request.extend_from_slice(&body);
        received.lock().unwrap().extend_from_slice(&request);
        let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", request.len());
        if s.write_all(resp.as_bytes()).await.is_err() || s.write_all(&request).await.is_err() {
            return;
        }
    }
}

/// A plain HTTP server on loopback answering each request with its own head.
pub async fn http_server() -> SocketAddr {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(serve_echo_heads(s, Received::default()));
        }
    });
    addr
}

/// A CA of the tests' own, standing for a real host's public CA.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }
    /// An HTTPS server on loopback for `names`, answering each request with itself.
    pub async fn https_server(&self, names: &[&str]) -> SocketAddr {
        self.recording_https_server(names).await.0
    }

    /// [`TestCa::https_server`], with everything it received.
    pub async fn recording_https_server(&self, names: &[&str]) -> (SocketAddr, Received) {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Received::default();
        let sink = received.clone();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let (acceptor, sink) = (acceptor.clone(), sink.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(s).await {
                        serve_echo_heads(tls, sink).await;
                    }
                });
            }
        });
        (addr, received)
    }
}

/// A TLS client trusting `ca_pem` only.
pub async fn tls_connect<S: AsyncRead + AsyncWrite + Unpin>(
    s: S,
    ca_pem: &str,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<S>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(name.to_owned()).unwrap(), s)
        .await
}

/// Send `head` and read the response: (status, body).
pub async fn request<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, head: &str) -> (u16, Vec<u8>) {
    s.write_all(head.as_bytes()).await.unwrap();
    let resp_head = tokio::time::timeout(WAIT, read_head(s))
        .await
        .unwrap()
        .expect("a response head");
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    resp.parse(&resp_head).unwrap();
    let len = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .map(|h| std::str::from_utf8(h.value).unwrap().parse::<usize>().unwrap())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tokio::time::timeout(WAIT, s.read_exact(&mut body))
        .await
        .unwrap()
        .unwrap();
    (resp.code.unwrap(), body)
}

/// Open a CONNECT tunnel through the proxy; returns the status and the stream.
pub async fn connect_via(proxy: SocketAddr, authority: &str) -> (u16, TcpStream) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = tokio::time::timeout(WAIT, read_head(&mut s))
        .await
        .unwrap()
        .expect("a proxy response");
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut resp = httparse::Response::new(&mut headers);
    resp.parse(&head).unwrap();
    (resp.code.unwrap(), s)
}

/// Ask the sandbox's DNS over UDP: (response code, answered addresses).
pub async fn dns_query(dns: SocketAddr, name: &str, qtype: RecordType) -> Message {
    let sock = UdpSocket::bind((LOOPBACK, 0)).await.unwrap();
    let mut msg = Message::new();
    msg.set_id(4242)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    sock.send_to(&msg.to_vec().unwrap(), dns).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(WAIT, sock.recv(&mut buf))
        .await
        .expect("a DNS reply")
        .unwrap();
    let reply = Message::from_vec(&buf[..n]).unwrap();
    assert_eq!(reply.id(), 4242);
    reply
}

pub fn answers(m: &Message) -> Vec<IpAddr> {
    m.answers()
        .iter()
        .filter_map(|r| match r.data() {
            hickory_proto::rr::RData::A(a) => Some(IpAddr::V4(a.0)),
            hickory_proto::rr::RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

/// A loopback connection pair standing for a redirected sandbox connection: (sandbox end, proxy end).
pub async fn intercepted_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    (client, server)
}

/// A real TLS ClientHello for `name` (bytes only).
pub fn client_hello(name: &str) -> Vec<u8> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from(name.to_owned()).unwrap())
            .unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}
